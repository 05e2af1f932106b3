"""The champion moves on comparable evidence only: versions scored on the same engines, by the
same score, on the same data compare by their selection RMSE; a version on other evidence
moves the alias only when the champion, scored on its engines (which the champion must never
have trained on), does worse; otherwise it is registered beside it and the run says why."""

import shutil

import pytest
from mlflow.tracking import MlflowClient

from rul.tracking.registry import CHAMPION, NOT_OFFERED, register_and_promote
from rul.workflows.train import train_tracked

MODEL = "rul-fd001"


def champion(client) -> str:
    return str(client.get_registered_model(MODEL).aliases[CHAMPION])


def train(store, **changes):
    outcome, run_id = train_tracked(store.config(**changes), progress=False)
    return outcome, MlflowClient().get_run(run_id).data.tags


@pytest.fixture(scope="module")
def first(fd001_store):
    """A 3-epoch training of seed 42: the first version, the champion."""
    return train(fd001_store, epochs=3)


@pytest.mark.slow
def test_two_seeds_of_a_config_compare_on_the_same_engines_by_their_score(fd001_store, first):
    client = MlflowClient()
    _, one = first
    _, two = train(fd001_store, epochs=3, seed=43)
    assert one["selection.engines"] == two["selection.engines"]
    assert one["selection.score"] == two["selection.score"] == "validation RMSE, every window"
    assert one["selection.data"] == two["selection.data"]
    scores = {t["registered_version"]: float(t["selection.rmse"]) for t in (one, two)}
    assert champion(client) == min(scores, key=scores.get)
    version = client.get_model_version(MODEL, two["registered_version"])
    assert version.tags["selection.engines"] == two["selection.engines"]
    assert two["champion_reason"] in ("the best of the versions scored on the same engines, "
                                      "score and data",
                                      f"version {champion(client)} scores better on the same "
                                      "engines")


@pytest.mark.slow
def test_a_worse_model_on_an_easier_split_does_not_take_the_alias(fd001_store, first):
    """2 epochs instead of 3, scored on 10 other engines that are easier: a lower validation
    RMSE, which moved the alias by the rule before; now the champion trained on most of those
    engines, so the two cannot be compared honestly and the alias stays."""
    client = MlflowClient()
    before = champion(client)
    _, easy = train(fd001_store, epochs=2, split_seed=3, val_fraction=0.1)
    champion_score = float(client.get_model_version(MODEL, before).tags["selection.rmse"])
    assert float(easy["selection.rmse"]) < champion_score  # what the old rule followed
    assert champion(client) == before
    assert easy["champion_promoted"] == "false"
    assert easy["champion_reason"].startswith(f"not comparable with champion version {before}: "
                                              "the champion trained on ")


@pytest.mark.slow
def test_a_changed_table_moves_the_alias_only_on_a_comparable_score(fd001_store, first,
                                                                   tmp_path):
    """A table a row shorter splits the same engines: the champion never trained on them and
    is scored on their new rows. A table without its first engine splits others, most of which
    the champion trained on: no comparable score, so the alias stays, and the run says why."""
    client = MlflowClient()
    for name, keep in (("a-row-less", lambda rows: rows[:-1]),
                       ("engine-1-gone", lambda rows: [r for r in rows if r.split()[0] != "1"])):
        changed = tmp_path / name
        shutil.copytree(fd001_store.data_dir, changed)
        rows = (changed / "train_FD001.txt").read_text().splitlines()
        (changed / "train_FD001.txt").write_text("\n".join(keep(rows)) + "\n")
        before = champion(client)
        _, other = train(fd001_store, epochs=3, data_dir=str(changed))
        assert other["selection.data"] != first[1]["selection.data"]
        reason = other["champion_reason"]
        if name == "a-row-less":
            assert other["selection.engines"] == first[1]["selection.engines"]
            assert f"champion version {before}, scored on the challenger's engines" in reason
        else:
            assert reason.startswith(f"not comparable with champion version {before}: the "
                                     "champion trained on ")
            assert champion(client) == before


@pytest.mark.slow
def test_another_score_is_compared_by_scoring_the_champion_on_it(fd001_store, first):
    """Test-like validation (val_weights: truncation) on the same engines: the champion never
    trained on them, so it is scored there by that score, and the two compare."""
    client = MlflowClient()
    before = champion(client)
    _, other = train(fd001_store, epochs=3, val_weights="truncation")
    assert other["selection.score"].endswith("at test-like truncation points")
    reason = other["champion_reason"]
    assert f"champion version {before}, scored on the challenger's engines, scored " in reason
    assert (champion(client) == other["registered_version"]) == (
        other["champion_promoted"] == "true")


def test_without_evidence_or_offer_a_version_does_not_move_the_alias(fd001_store, first):
    """A version whose run has no selection evidence (an earlier rul's), and one registered
    without being offered the alias (rul tune without promote), leave it where it is, though
    their figures are better."""
    client = MlflowClient()
    before = champion(client)
    experiment = client.get_experiment_by_name(MODEL).experiment_id
    evidence = {k: v for k, v in first[1].items() if k.startswith("selection.")}
    for tags, offered, said in (
            ({}, True, "this version has no selection evidence (rul promote moves it)"),
            ({**evidence, "selection.rmse": "0.001"}, False,
             NOT_OFFERED)):
        run = client.create_run(experiment, tags=tags)
        client.set_terminated(run.info.run_id)
        record = register_and_promote(first[0].model_uri, MODEL, run.info.run_id, 1e-3,
                                      promote=offered)
        assert record["champion_reason"].startswith(said)
        assert champion(client) == before


@pytest.mark.slow
def test_rul_promote_shows_both_on_the_same_engines_and_moves_the_alias_by_hand(fd001_store,
                                                                                first):
    from click.testing import CliRunner

    from rul.cli import main

    client = MlflowClient()
    before = champion(client)
    _, other = train(fd001_store, epochs=2, seed=44, split_seed=5)  # other engines
    version = other["registered_version"]
    shown = CliRunner().invoke(main, ["promote", MODEL, version, "--tracking-uri",
                                      fd001_store.uri])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[1].split()[:2] == ["challenger", version]
    assert lines[2].split()[:2] == ["champion", before]
    assert lines[-1].startswith("no comparable score for the champion: the champion trained on")
    assert champion(client) == before  # only compared

    moved = CliRunner().invoke(main, ["promote", MODEL, version, "--why", "checked by hand",
                                      "--tracking-uri", fd001_store.uri])
    assert moved.exit_code == 0, moved.output
    assert moved.output.splitlines()[-1] == f"{MODEL}@champion is version {version} (was " \
                                            f"{before})"
    tags = client.get_model_version(MODEL, version).tags
    assert (tags["promoted.why"], tags["promoted.from"]) == ("checked by hand", before)
    assert tags["promoted.by"] and tags["champion_reason"] == "promoted by hand: checked by hand"
    assert champion(client) == version
    refused = CliRunner().invoke(main, ["promote", MODEL, "999", "--tracking-uri",
                                        fd001_store.uri])
    assert refused.exit_code == 2 and f"{MODEL} has no version 999" in refused.output
