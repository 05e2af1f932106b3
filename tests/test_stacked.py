"""Members trained at once (rul.training.stacked): each the member trained alone, within float
rounding, when dropout draws nothing; reproducible; and refused, with the reason, where a
member could not keep its own training."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import unwarned
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.cli import main
from rul.plan import plan_ensemble
from rul.tracking.metric_names import logged
from rul.training.run import train
from rul.training.seeding import seed_everything
from rul.training.stacked import (
    MemberTraining,
    build_members,
    member_training,
    stacking_problem,
    train_members,
)
from rul.workflows.ensemble import MEMBER_TAG, TRAINING_REASON_TAG, TRAINING_TAG, train_ensemble

TINY = {"epochs": 2, "patience": 5, "filters": 4, "num_layers": 2, "hidden_size": 16,
        "window": 20, "micro_batch_size": 8, "accumulation_steps": 2, "dropout": 0.0,
        "precision": "fp32", "ensemble": 3, "interval_coverage": None, "register": False,
        "optimizer": "adamw", "lr": 0.002, "kernel_size": 10,  # AdamW (elementwise) stacks
        "train_sampling": "windows", "warmup_epochs": 0, "ema_decay": 0.99}


@pytest.fixture
def members(write_cmapss):
    def plans(**changes):
        config = cfg.load(None, {**TINY, "data_dir": str(write_cmapss()), **changes})
        return plan_ensemble(config).members
    return plans


def _flat(model) -> torch.Tensor:
    return torch.cat([t.flatten() for t in model.state_dict().values()])


def test_each_member_starts_from_the_weights_it_starts_from_alone(members):
    plans = members()
    stacked = build_members(plans)
    for plan, model in zip(plans, stacked, strict=True):
        seed_everything(plan.seeds)
        alone = plan.network.build()
        assert torch.equal(_flat(alone), _flat(model))
    assert not torch.equal(_flat(stacked[0]), _flat(stacked[1]))


@pytest.mark.parametrize("val_weights, train_sampling", [
    ("windows", "windows"), ("truncation", "windows"), ("windows", "truncation")])
def test_without_dropout_each_member_trains_as_it_trains_alone(members, val_weights,
                                                               train_sampling):
    """Validation weighed per window or as the test units are cut, training windows drawn
    once each or as the test units are cut (each member's weights and law drawn with its own
    split seed): the same validation RMSE as alone."""
    plans = members(val_weights=val_weights, train_sampling=train_sampling)
    alone = [train(plan, progress=False) for plan in plans]
    stacked = train_members(plans)
    assert len(alone[0].state.grad_norms) >= 8  # steps enough for the rounding to show
    for a, s in zip(alone, stacked, strict=True):
        assert len(s.state.grad_norms) == len(a.state.grad_norms)
        # a norm near 0 (late in the decay) keeps the absolute rounding of the reductions,
        # which differ between a stack and one network (AVX2-only CPUs: 3e-7 at a norm of 0.03)
        np.testing.assert_allclose(s.state.grad_norms, a.state.grad_norms, rtol=1e-5, atol=1e-6)
        for key in ("train_loss_epoch", "val_rmse"):
            np.testing.assert_allclose([h[key] for h in s.state.history],
                                       [h[key] for h in a.state.history], rtol=1e-5)
        assert s.state.best_epoch == a.state.best_epoch
        weights = _flat(a.model)
        assert (_flat(s.model) - weights).abs().max() <= 1e-5 * weights.abs().max()
        np.testing.assert_allclose(s.predictions["predicted_rul"],
                                   a.predictions["predicted_rul"], rtol=1e-5, atol=1e-4)
    # the members are still three networks, not one
    assert len({round(s.metrics["test_rmse"], 6) for s in stacked}) == 3


def test_the_loss_written_once_trains_a_run_and_stacked_members(members, monkeypatch):
    """The training loss has one home (rul.training.step.rul_loss): changed there, a run and
    stacked members both train on the new loss, and still agree."""
    plans = members(epochs=1, ensemble=2)
    before = [train(plans[0], progress=False).state, *[s.state for s in train_members(plans)]]
    import rul.training.step

    plain = rul.training.step.rul_loss
    monkeypatch.setattr(rul.training.step, "rul_loss", lambda *args: 4 * plain(*args))
    after = [train(plans[0], progress=False).state, *[s.state for s in train_members(plans)]]
    for old, new in zip(before, after, strict=True):  # the first step: the same weights
        assert new.history[0]["train_loss_epoch"] != old.history[0]["train_loss_epoch"]
        np.testing.assert_allclose(new.grad_norms[0], 4 * old.grad_norms[0], rtol=1e-5)
    np.testing.assert_allclose(after[1].grad_norms, after[0].grad_norms, rtol=1e-5)


def test_stacked_members_with_dropout_are_reproducible(members):
    plans = members(dropout=0.5, epochs=2)
    first = [s.state for s in train_members(plans)]
    again = [s.state for s in train_members(plans)]
    without = [s.state for s in train_members(members(epochs=2))]  # the same seeds, dropout 0
    for a, b, c in zip(first, again, without, strict=True):
        assert a.grad_norms == b.grad_norms and a.history[-1]["val_rmse"] == \
            b.history[-1]["val_rmse"]
        assert np.isfinite(a.best_val_rmse)
        assert a.grad_norms[0] != c.grad_norms[0]  # the masks drop something from step one
    assert first[0].grad_norms != first[1].grad_norms  # each member its own masks


def test_a_member_stops_early_on_its_own_best_weights(members):
    plans = members(epochs=4, patience=1, lr=0.5)  # a rate that overshoots: bad epochs come
    stacked = train_members(plans)
    alone = [train(plan, progress=False) for plan in plans]
    stopped = [len(s.state.history) for s in stacked]
    assert stopped == [len(a.state.history) for a in alone]
    assert min(stopped) < 4  # at least one member stopped before the last epoch
    for s in stacked:
        assert s.state.best_val_rmse == min(h["val_rmse"] for h in s.state.history)


@pytest.mark.parametrize("changes, reason", [
    ({"model": "lstm"}, "model=lstm: vmap does not batch its layers"),
    ({"precision": "fp16"}, "precision=fp16: autocast does not reach inside vmap (the "
                            "members would train in fp32; precision=fp32 stacks)"),
    ({"precision": "bf16"}, "precision=bf16: autocast does not reach inside vmap (the "
                            "members would train in fp32; precision=fp32 stacks)"),
    ({"precision": "bf16", "ensemble_split": "folds"}, "the members train on different data"),
    ({"ensemble_split": "folds"}, "the members train on different data"),
    ({"optimizer": "muon"}, "optimizer=muon: its step is not elementwise (each member's "
                            "update would depend on the others' weights)"),
])
def test_what_cannot_stack_is_said_and_refused(members, changes, reason):
    plans = members(**changes)
    assert stacking_problem(plans) == reason
    with pytest.raises(ValueError, match=f"members cannot train stacked: {reason[:20]}"):
        train_members(plans)


def test_what_precision_auto_picked_is_named_when_it_cannot_stack(members, monkeypatch):
    import rul.training.precision

    monkeypatch.setattr(rul.training.precision, "auto_precision",
                        lambda device, model, probe: ("bf16", "a CPU with native bf16"))
    assert stacking_problem(members(precision="auto")) == (
        "precision=auto picks bf16 here: autocast does not reach inside vmap (the members "
        "would train in fp32; precision=fp32 stacks)")


def test_members_of_other_configs_or_data_or_alone_do_not_stack(members):
    plans = members()
    assert stacking_problem(plans) is None
    assert stacking_problem(plans[:1]) == "one member"
    other_rate = replace(plans[1], optimization=replace(plans[1].optimization, lr=1e-3))
    assert stacking_problem([plans[0], other_rate]) == \
        "the members' configs differ in more than their seed"
    other_data = members()[1]  # the same config, data prepared again
    assert stacking_problem([plans[0], other_data]) == "the members train on different data"


def test_the_members_bench_stacks_the_default_recipe(write_cmapss):
    """`python -m bench members` and `make gpu-check`'s members rows time the default
    recipe's network stacked: their keys take out of it what cannot stack (its Muon)."""
    from bench.__main__ import DEFAULT
    from bench.members import STACKABLE

    recipe = cfg.load(DEFAULT, {"ensemble": 5, "data_dir": str(write_cmapss())})
    assert stacking_problem(plan_ensemble(recipe).members) is not None
    benched = recipe.replace(epochs=3, **STACKABLE)
    assert stacking_problem(plan_ensemble(benched).members) is None


def test_autocast_does_not_reach_inside_vmap():
    """Why stacking refuses bf16 and fp16: under torch.func.vmap autocast changes nothing, and
    the members would train in fp32. When a torch makes this fail, stacking_problem can let
    autocast's precisions stack."""
    from torch.func import functional_call, stack_module_state, vmap

    from rul.models import build_network

    models = [build_network("cnn", 14, 30, 125.0).eval() for _ in range(2)]
    params, _ = stack_module_state(models)
    buffers = dict(models[0].named_buffers())
    x = torch.randn(2, 8, 30, 14)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        alone = models[0](x[0])
        stacked = vmap(lambda p, x: functional_call(models[0], (p, buffers), (x,)))(params, x)
    assert alone.dtype == torch.bfloat16
    assert stacked.dtype == torch.float32


# ---------------------------------------------------------------- an ensemble trained stacked


def _tracked(client, run_id: str) -> SimpleNamespace:
    """The parent run `run_id` and its members' runs, in member order."""
    parent = client.get_run(run_id)
    members = client.search_runs([parent.info.experiment_id],
                                 f"tags.`mlflow.parentRunId` = '{run_id}'")
    return SimpleNamespace(parent=parent, members=sorted(
        members, key=lambda r: int(r.data.tags[MEMBER_TAG])))


def _history(client, run, name: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, logged(name)),
                                    key=lambda m: m.step)]


def _interrupted(config) -> dict[str, str]:
    """Train the ensemble of `config`, which must end interrupted; each run's status, by
    member (or "parent")."""
    with pytest.raises(KeyboardInterrupt):
        train_ensemble(config, progress=False)
    runs = MlflowClient().search_runs([MlflowClient().get_experiment_by_name(
        config.experiment_name).experiment_id])
    return {r.data.tags.get(MEMBER_TAG, "parent"): r.info.status for r in runs}


def test_a_stacked_ensemble_is_tracked_as_the_one_trained_member_by_member(write_cmapss,
                                                                           mlflow_store,
                                                                           capsys):
    """The same runs, params, curves and averaged model as `auto` (on a CPU: one member after
    another), equal within float rounding when dropout draws nothing; and no lock left."""
    data_dir = str(write_cmapss())
    trained = {}
    for training in ("auto", "stacked"):
        config = cfg.load(None, {**TINY, "ensemble": 2, "data_dir": data_dir,
                                 "experiment": training, "ensemble_training": training})
        outcome, run_id = train_ensemble(config, progress=False)
        trained[training] = (outcome, _tracked(MlflowClient(), run_id))
        said = capsys.readouterr().err
        assert ("ensemble_training=stacked on a CPU: slower" in said) == (training == "stacked")
    (one_by_one, sequential), (outcome, stacked) = trained["auto"], trained["stacked"]
    client = MlflowClient()

    assert sequential.parent.data.tags[TRAINING_TAG] == "sequential"
    assert sequential.parent.data.tags[TRAINING_REASON_TAG].startswith(
        "auto: on a CPU stacked members are slower")
    assert stacked.parent.data.tags[TRAINING_TAG] == "stacked"
    assert stacked.parent.data.tags[TRAINING_REASON_TAG] == "asked for"
    assert stacked.parent.info.status == "FINISHED"
    assert outcome.member_run_ids == [r.info.run_id for r in stacked.members]
    # trained at once: every member's run is open until the last one's starts (one after
    # another, a member starts when the one before it has ended)
    assert max(r.info.start_time for r in stacked.members) < \
        min(r.info.end_time for r in stacked.members)
    assert sequential.members[1].info.start_time >= sequential.members[0].info.end_time
    for key in ("val_rmse", "test_rmse"):
        assert outcome.metrics[key] == pytest.approx(one_by_one.metrics[key], rel=1e-5)
    for s, q in zip(stacked.members, sequential.members, strict=True):
        assert s.info.status == "FINISHED" and s.data.tags[TRAINING_TAG] == "stacked"
        assert {**s.data.params, "experiment": "auto"} == q.data.params  # the same plan
        assert set(s.data.metrics) == set(q.data.metrics)
        for name in ("grad_norm", "train_loss", "val_rmse"):
            here, there = _history(client, s, name), _history(client, q, name)
            assert len(here) == len(there) >= 2
            np.testing.assert_allclose(here, there, rtol=1e-5)
        assert s.data.metrics[logged("test_rmse")] == pytest.approx(
            q.data.metrics[logged("test_rmse")], rel=1e-5)
        assert "model" in {m.name for m in client.search_logged_models(
            [s.info.experiment_id], filter_string=f"source_run_id = '{s.info.run_id}'")}
    assert list((mlflow_store.root / "mlruns" / "checkpoints").glob("*")) == []


@pytest.mark.parametrize("args, said", [
    (["model=lstm"], "ensemble_training=stacked: the members cannot train stacked: model=lstm: "
                     "vmap does not batch its layers"),
    (["precision=bf16"], "ensemble_training=stacked: the members cannot train stacked: "
                         "precision=bf16: autocast does not reach inside vmap"),
    (["--jobs", "2"], "ensemble_training=stacked: the members cannot train stacked: --jobs 2 "
                      "trains them in separate processes"),
    (["ensemble=1"], "ensemble_training='stacked': needs ensemble >= 2, got ensemble=1"),
])
def test_stacked_members_that_cannot_stack_are_one_line_and_no_run(write_cmapss, mlflow_store,
                                                                   args, said):
    overrides = [f"{k}={v}" for k, v in {**TINY, "ensemble": 2}.items() if v is not None]
    result = CliRunner().invoke(main, ["train", *overrides, "interval_coverage=null",
                                       f"data_dir={write_cmapss()}", "ensemble_training=stacked",
                                       *args, "--no-progress"])
    assert result.exit_code == 2, result.output
    assert said in result.stderr and len(unwarned(result.stderr)) == 1
    assert not (mlflow_store.root / "mlflow.db").exists()


def test_an_interrupted_stacked_ensemble_ends_every_run_killed(write_cmapss, mlflow_store,
                                                               monkeypatch):
    seen = []

    def interrupted(model, val, batch_size=4096, weights=None):  # after the first epoch's steps
        seen.extend(r.info.status for r in MlflowClient().search_runs(
            [MlflowClient().get_experiment_by_name(config.experiment_name).experiment_id]))
        raise KeyboardInterrupt

    import rul.training.engine

    monkeypatch.setattr(rul.training.engine, "validation_rmse", interrupted)
    config = cfg.load(None, {**TINY, "ensemble": 2, "data_dir": str(write_cmapss()),
                             "ensemble_training": "stacked", "register": True})
    assert _interrupted(config) == {"parent": "KILLED", "0": "KILLED", "1": "KILLED"}
    assert seen == ["RUNNING"] * 3  # while they trained: a SIGKILL leaves them for closing
    assert MlflowClient().search_registered_models() == []
    assert list((mlflow_store.root / "mlruns" / "checkpoints").glob("*")) == []


@pytest.mark.parametrize("training, module", [("sequential", "rul.workflows.tracked"),
                                              ("stacked", "rul.workflows.stacked")])
def test_an_interruption_while_members_are_logged_keeps_a_logged_member_finished(
        write_cmapss, mlflow_store, monkeypatch, training, module):
    """Ctrl-C while the second member's results are logged: the first member, whose results
    and model are logged whole, stays FINISHED, stacked as one after another."""
    import importlib

    target, calls = importlib.import_module(module), []
    real = target.log_outcome

    def log_outcome(outcome):
        calls.append(outcome)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(outcome)

    monkeypatch.setattr(target, "log_outcome", log_outcome)
    config = cfg.load(None, {**TINY, "ensemble": 2, "data_dir": str(write_cmapss()),
                             "ensemble_training": training})
    assert _interrupted(config) == {"parent": "KILLED", "0": "FINISHED", "1": "KILLED"}
    assert len(calls) == 2
    assert list((mlflow_store.root / "mlruns" / "checkpoints").glob("*")) == []


def test_auto_trains_members_one_after_another_and_says_why(members):
    """On a CPU and on a GPU, by measurement; elsewhere until measured (a meta device), or
    because they cannot stack."""
    plans = members()
    assert member_training("auto", plans).reason.startswith(
        "auto: on a CPU stacked members are slower than one after another (docs: Performance")
    elsewhere = [replace(p, precision=replace(p.precision, device=torch.device("meta")))
                 for p in plans]
    assert member_training("auto", elsewhere) == MemberTraining(
        False, "auto: stacking is not measured on meta (ensemble_training=stacked opts in)")
    on_gpu = [replace(p, precision=replace(p.precision, device=torch.device("cuda")))
              for p in plans]
    assert member_training("auto", on_gpu).reason.startswith(
        "auto: on a GPU stacked members are slower than one after another (docs: Performance")
    assert member_training("auto", elsewhere, jobs=2) == MemberTraining(
        False, "auto: cannot stack (--jobs 2 trains them in separate processes)")
    assert member_training("stacked", elsewhere) == MemberTraining(True, "asked for")
    assert member_training("stacked", plans).note.startswith(
        "ensemble_training=stacked on a CPU: slower than one member after another (docs: "
        "Performance")
    assert member_training("sequential", plans) == MemberTraining(False, "asked for")


@pytest.mark.parametrize("training, created, ended", [
    ("sequential", 1, {"parent": "KILLED"}),
    ("sequential", 3, {"parent": "KILLED", "0": "FINISHED", "1": "KILLED"}),
    ("stacked", 1, {"parent": "KILLED"}),
    ("stacked", 3, {"parent": "KILLED", "0": "KILLED", "1": "KILLED"}),
])
def test_an_interruption_while_a_run_is_created_ends_it_killed(write_cmapss, mlflow_store,
                                                                monkeypatch, training, created,
                                                                ended):
    """Ctrl-C while MLflow creates the parent (1st run) or the second member (3rd): held until
    the run's ending is in place, so no run is left RUNNING, which no later command closes
    (no process ever held its lock)."""
    from rul import interrupts

    real, calls = MlflowClient.create_run, []

    def create_run(self, *args, **kwargs):
        run = real(self, *args, **kwargs)
        calls.append(run)
        if len(calls) == created:  # a signal arrives while the run is written (deferred)
            interrupts._pending.append(KeyboardInterrupt())
        return run

    monkeypatch.setattr(MlflowClient, "create_run", create_run)
    config = cfg.load(None, {**TINY, "ensemble": 2, "data_dir": str(write_cmapss()),
                             "ensemble_training": training})
    assert _interrupted(config) == ended
    assert list((mlflow_store.root / "mlruns" / "checkpoints").glob("*")) == []
