"""Your own fleet: a data set described by its columns (`data:`), on the real FD001 files
re-expressed as a user would have them: NASA's own sensor names (T24, T30, P30, ...), the unit
and time columns renamed, the columns reordered, an extra column, Parquet for training and a
CSV test table with a true-RUL column; one table with no test set; engines that have not
failed yet. With the same units and split as the preset FD001 it trains the same model; the
served model answers under the new names and refuses C-MAPSS's; bad descriptions are one
line each, exit 2, nothing started.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from click.testing import CliRunner
from conftest import _free_port, wait_until_answering

from rul import config as cfg
from rul.cli import main
from rul.data import load_dataset
from rul.data.censoring import MostlyCensoredWarning
from rul.data.schema import INFORMATIVE_SENSORS, SENSOR_COLUMNS, SETTING_COLUMNS
from rul.plan import plan_run, prepared
from rul.tracking.run_params import config_from_params
from rul.training.run import train
from rul.training.seeding import derive_seeds

ROOT = Path(__file__).resolve().parents[1]
NASA = ["T2", "T24", "T30", "T50", "P2", "P15", "P30", "Nf", "Nc", "epr", "Ps30", "phi", "NRf",
        "NRc", "BPR", "farB", "htBleed", "Nf_dmd", "PCNfR_dmd", "W31", "W32"]
RENAMED = {**dict(zip(SENSOR_COLUMNS, NASA, strict=True)), "unit": "engine_id",
           "cycle": "flight_cycle", "setting_1": "altitude", "setting_2": "mach",
           "setting_3": "tra"}
INFORMATIVE = [RENAMED[s] for s in INFORMATIVE_SENSORS]
SETTINGS = [RENAMED[s] for s in SETTING_COLUMNS]
TINY = ["epochs=1", "filters=4", "num_layers=2", "hidden_size=8", "precision=fp32",
        "register=false"]


@pytest.fixture(scope="module")
def fleet(real_data_dir, tmp_path_factory):
    """FD001 as a fleet's files: fleet.parquet (training, columns shuffled, an extra one),
    fleet_test.csv (the test histories and each row's true RUL at its unit's end), and
    fleet_all.parquet (one table, no test set, three engines still in service);
    fleet_failed.parquet (one table, `failed` true on the engines that failed, engines
    91-100 in service); fleet_semicolon.csv (fleet.parquet as a semicolon CSV)."""
    from rul.data import load_subset

    folder = tmp_path_factory.mktemp("fleet")
    fd001 = load_subset("FD001", real_data_dir)
    trained = fd001.train.rename(columns=RENAMED).assign(site="north")
    order = list(np.random.default_rng(0).permutation(trained.columns))
    trained[order].to_parquet(folder / "fleet.parquet", index=False)
    test = fd001.test.rename(columns=RENAMED)
    lengths = test.groupby("engine_id").size().to_numpy()
    test.assign(rul_at_end=np.repeat(fd001.test_rul, lengths)).to_csv(
        folder / "fleet_test.csv", index=False)
    in_service = trained["engine_id"].isin([3, 7, 11])  # cut 40 cycles before their end
    last = trained.groupby("engine_id")["flight_cycle"].transform("max")
    alive = trained[~in_service | (trained["flight_cycle"] <= last - 40)]
    alive.assign(in_service=alive["engine_id"].isin([3, 7, 11])).to_parquet(
        folder / "fleet_all.parquet", index=False)
    serving = trained["engine_id"] > 90
    alive = trained[~serving | (trained["flight_cycle"] <= last - 40)]
    alive.assign(failed=alive["engine_id"] <= 90).to_parquet(folder / "fleet_failed.parquet",
                                                               index=False)
    trained[order].to_csv(folder / "fleet_semicolon.csv", sep=";", index=False)
    return folder


def section(**changes) -> dict:
    return {"name": "fleet", "train": "fleet.parquet", "test": "fleet_test.csv",
            "test_rul_column": "rul_at_end", "unit": "engine_id", "time": "flight_cycle",
            "settings": SETTINGS, "sensors": INFORMATIVE, "informative": INFORMATIVE,
            "conditions": 1, **changes}


def fleet_config(folder: Path, *more, **data):
    return cfg.load(None, [*TINY, f"data_dir={folder}", *more,
                           f"data={json.dumps(section(**data))}"])


def test_the_fleets_table_is_read_as_the_preset_reads_fd001(fleet, fd001):
    dataset = load_dataset(fleet_config(fleet).dataset, fleet)
    assert dataset.layout.unit == "engine_id" and list(dataset.layout.sensors) == INFORMATIVE
    renamed = fd001.train.rename(columns=RENAMED)
    assert np.array_equal(dataset.train[["unit", "cycle", *SETTINGS, *INFORMATIVE]].to_numpy(),
                          renamed[["engine_id", "flight_cycle", *SETTINGS, *INFORMATIVE]]
                          .to_numpy())
    assert np.array_equal(dataset.test_rul, fd001.test_rul)


def test_with_the_same_units_and_split_it_trains_the_presets_model(fleet, real_data_dir):
    """The same rows, split, seeds and columns (renamed): the same weights and test metrics,
    bit for bit."""
    preset = cfg.load(None, [*TINY, f"data_dir={real_data_dir}"])
    outcomes = [train(plan_run(config), progress=False)
                for config in (preset, fleet_config(fleet))]
    assert outcomes[0].metrics == outcomes[1].metrics
    weights = [outcome.model.state_dict() for outcome in outcomes]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_the_rules_choose_fd001s_fourteen_sensors_and_its_one_condition(fleet, capsys):
    config = fleet_config(fleet, informative="auto", conditions="auto",
                          sensors=["T*", "P*", "N*", "phi", "BPR", "htBleed",
                                   "W*"])
    with pytest.warns(UserWarning, match="not read: site"):
        data = prepared(config, derive_seeds(config.seed).split)
    assert sorted(data.preprocessor.feature_columns_) == sorted(INFORMATIVE)  # table's order
    assert data.choices.n_conditions == 1
    assert "the settings hardly vary" in data.choices.conditions_reason
    said = capsys.readouterr().err.splitlines()[-1]
    assert said.startswith("fleet: 1 operating condition (the settings hardly vary")
    # the patterns' matches in the natural order of their names, not the shuffled table's
    assert said.endswith("the model reads T24, T30, T50, P30, Ps30, NRc, NRf, Nc, Nf, phi, "
                            "BPR, htBleed, W31, W32")


def test_a_pattern_leaves_out_the_sensors_that_hold_one_value_and_says_which(fleet):
    config = fleet_config(fleet, sensors=["T*", "P*", "N*"], informative="auto")
    with pytest.warns(UserWarning) as said:
        dataset = load_dataset(config.dataset, fleet)
    lines = [str(w.message) for w in said if "leave out" in str(w.message)]
    assert lines == ["fleet.parquet: data.sensors: the patterns leave out T2, P2, PCNfR_dmd, "
                     "Nf_dmd: one value in every row"]
    assert dataset.layout.sensors == ("T24", "T30", "T50", "P15", "P30", "Ps30", "NRc", "NRf",
                                      "Nc", "Nf")
    assert "T2" not in dataset.train and "T2" not in dataset.test


def test_a_failed_column_marks_the_engines_in_service(fleet):
    """`failed` true on the engines that failed: 91-100, with no true row, are in service,
    and most engines failed: no warning."""
    config = fleet_config(fleet, train="fleet_failed.parquet", test=None, test_rul_column=None,
                          failed_column="failed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MostlyCensoredWarning)
        dataset = load_dataset(config.dataset, fleet)
    assert dataset.censored == tuple(range(91, 101))
    assert not set(range(91, 101)) & set(dataset.held_out)


def test_training_says_its_engines_and_their_split_in_one_line(fleet, capsys):
    """Before the choices: the engines that failed (training, validating), those held out
    for test and those in service."""
    config = fleet_config(fleet, train="fleet_failed.parquet", test=None, test_rul_column=None,
                          failed_column="failed")
    data = prepared(config, derive_seeds(config.seed).split)
    said = capsys.readouterr().err.splitlines()
    assert said[0] == ("fleet: 100 engines: 72 failed (train 58, validate 14), 18 held out "
                       "for test, 10 in service")
    assert said[1].startswith("fleet: 1 operating condition")
    assert len(data.val_units) == 14 and len(data.test_units) == 18
    assert len(set(data.train_units) - set(data.subset.censored)) == 58
    data = prepared(fleet_config(fleet), derive_seeds(config.seed).split)  # with a test table
    assert capsys.readouterr().err.splitlines()[0] == (
        "fleet: 100 engines: 100 failed (train 80, validate 20), 0 in service; 100 test engines "
        "in fleet_test.csv")


def test_a_marker_read_the_wrong_way_round_is_named_in_one_warning(fleet):
    """censored_column: failed takes the 90 engines that failed as in service: one warning
    names the key, the column and what it was taken to mean."""
    config = fleet_config(fleet, train="fleet_failed.parquet", test=None, test_rul_column=None,
                          censored_column="failed")
    with pytest.warns(MostlyCensoredWarning) as said:
        dataset = load_dataset(config.dataset, fleet)
    assert dataset.censored == tuple(range(1, 91))
    assert [str(w.message) for w in said if w.category is MostlyCensoredWarning] == [
        "fleet_failed.parquet: 90 of 100 engines in service, data.censored_column: 'failed' "
        "taken as true on the engines in service; if it is true on those that failed, give "
        "data.failed_column: failed"]


def test_a_semicolon_csv_is_read_as_its_parquet_twin(fleet):
    """The delimiter is found from the file's first lines (data.delimiter: auto)."""
    parquet = load_dataset(fleet_config(fleet).dataset, fleet)
    csv = load_dataset(fleet_config(fleet, train="fleet_semicolon.csv").dataset, fleet)
    assert csv.train.equals(parquet.train) and csv.layout == parquet.layout
    alone = {"test": None, "test_rul_column": None}  # data.delimiter is every file's
    given = load_dataset(fleet_config(fleet, train="fleet_semicolon.csv", delimiter=";",
                                      **alone).dataset, fleet)
    assert given.train.equals(load_dataset(fleet_config(fleet, **alone).dataset, fleet).train)


def test_one_table_without_a_test_set_holds_engines_out_as_nasa_cut_its_own(fleet):
    """20 % of the engines (a seeded draw, the same whatever the run's seed), each history
    cut at a life fraction in 0.2..0.97, its true RUL what was left; the three engines still
    in service are never held out."""
    config = fleet_config(fleet, train="fleet_all.parquet", test=None, test_rul_column=None,
                          censored_column="in_service")
    dataset = load_dataset(config.dataset, fleet)
    full = pd.read_parquet(fleet / "fleet_all.parquet")
    held = list(dataset.held_out)
    assert len(held) == 19 and not {3, 7, 11} & set(held)  # 20 % of the 97 that failed
    assert not set(held) & set(dataset.train["unit"])
    lives = full.groupby("engine_id")["flight_cycle"].max()
    seen = dataset.test.groupby("unit")["cycle"].max()
    assert np.array_equal(dataset.test_rul, (lives[held] - seen[held]).to_numpy())
    fraction = seen[held].to_numpy() / lives[held].to_numpy()
    assert (fraction > 0.15).all() and (fraction < 0.98).all()
    again = load_dataset(fleet_config(fleet, "seed=7", train="fleet_all.parquet", test=None,
                                      test_rul_column=None, censored_column="in_service")
                         .dataset, fleet)
    assert again.held_out == dataset.held_out  # the run's seed does not move the test set


def test_engines_still_in_service_train_where_their_target_is_known(fleet):
    """An engine seen up to cycle T has a RUL over T - t at cycle t: its windows with T - t >=
    the cap have the target cap, known; the later ones are left out; it never validates."""
    config = fleet_config(fleet, train="fleet_all.parquet", test=None, test_rul_column=None,
                          censored_column="in_service")
    data = prepared(config, derive_seeds(config.seed).split)
    assert data.subset.censored == (3, 7, 11)
    assert not {3, 7, 11} & set(data.val_units) and {3, 7, 11} <= set(data.train_units)
    mine = np.isin(data.train.units, [3, 7, 11])
    assert mine.any() and (data.train.targets[mine] == config.rul_cap).all()
    others = ~mine
    assert (data.train.targets[others] < config.rul_cap).any()  # theirs run to 0


def test_engines_in_service_teach_their_lower_bound_at_every_window(fleet):
    """censored_training: lower_bound keeps every window of an engine in service, its target
    the range [min(T - t, cap), cap]; the engines that failed keep their one known target."""
    known = prepared(fleet_config(fleet, train="fleet_all.parquet", test=None,
                                  test_rul_column=None, censored_column="in_service"), 42)
    config = fleet_config(fleet, "censored_training=lower_bound", train="fleet_all.parquet",
                          test=None, test_rul_column=None, censored_column="in_service")
    data = prepared(config, 42)
    mine = np.isin(data.train.units, [3, 7, 11])
    assert np.array_equal(data.val_units, known.val_units)
    assert mine.sum() > np.isin(known.train.units, [3, 7, 11]).sum()
    assert (data.train.upper[mine] == config.rul_cap).all()
    lower = data.train.targets[mine]  # min(T - t, cap): down to 0 at the last row seen
    assert lower.min() == 0 and lower.max() == config.rul_cap
    assert np.array_equal(data.train.upper[~mine], data.train.targets[~mine])
    failed = ~np.isin(known.train.units, [3, 7, 11])
    assert np.array_equal(data.train.targets[~mine], known.train.targets[failed])
    assert known.train.upper is None and data.val.upper is None


def test_engines_in_service_can_be_left_out_of_training(fleet, capsys):
    """censored_training: dropped: they neither train nor validate, and the engines line says
    so; the split of the engines that failed is the same."""
    config = fleet_config(fleet, "censored_training=dropped", train="fleet_failed.parquet",
                          test=None, test_rul_column=None, failed_column="failed")
    data = prepared(config, derive_seeds(config.seed).split)
    assert capsys.readouterr().err.splitlines()[0] == (
        "fleet: 100 engines: 72 failed (train 58, validate 14), 18 held out for test, 10 in "
        "service (not trained)")
    assert not set(range(91, 101)) & set(data.train_units) and len(data.train_units) == 58
    assert not np.isin(data.train.units, list(range(91, 101))).any()


def test_a_lower_bound_training_runs_and_records_its_rule(fleet, tmp_path):
    """One epoch end to end through `rul train`: the run's params name the rule."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    described = section(train="fleet_failed.parquet", test=None, test_rul_column=None,
                        failed_column="failed")
    result = CliRunner().invoke(main, ["train", *TINY, f"data_dir={fleet}", "--no-progress",
                                       f"tracking_uri={uri}", "censored_training=lower_bound",
                                       f"data={json.dumps(described)}"])
    assert result.exit_code == 0, result.output
    run = mlflow.MlflowClient(uri).search_runs(
        [mlflow.MlflowClient(uri).get_experiment_by_name("rul-fleet").experiment_id])[0]
    assert run.data.params["censored_training"] == "lower_bound"
    assert np.isfinite(run.data.metrics["train/loss_epoch"])


def test_a_table_with_its_columns_reordered_trains_the_same_model(fleet, tmp_path):
    """Sensors given by patterns, the informative ones chosen by the rule: the table's column
    order does not move the model (the canonical order: rul.data.tables), so the validation
    curve of 2 epochs in fp32 is the same bit for bit (on 40 engines, to be quick)."""
    frame = pd.read_parquet(fleet / "fleet.parquet")
    frame = frame[frame["engine_id"] <= 40]
    frame.to_parquet(tmp_path / "forty.parquet", index=False)
    frame[frame.columns[::-1]].to_parquet(tmp_path / "reversed.parquet", index=False)
    patterns = ["T*", "P*", "N*", "phi", "BPR", "htBleed", "W*"]
    curves = []
    for table in (tmp_path / "forty.parquet", tmp_path / "reversed.parquet"):
        config = fleet_config(fleet, "epochs=2", train=str(table), sensors=patterns,
                              informative="auto")
        outcome = train(plan_run(config), progress=False)
        curves.append([epoch["val_rmse"] for epoch in outcome.state.history])
    assert len(curves[0]) == 2 and curves[0] == curves[1]


def _train_eight_engines(fleet, tmp_path, monkeypatch, *more):
    """`rul train` on the fleet's first eight engines (one table: 2 held out for test)."""
    frame = pd.read_parquet(fleet / "fleet.parquet")
    frame[frame["engine_id"] <= 8].to_parquet(tmp_path / "small.parquet", index=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    small = section(train=str(tmp_path / "small.parquet"), test=None, test_rul_column=None)
    result = CliRunner().invoke(main, ["train", *TINY, f"data_dir={fleet}", "--no-progress",
                                       *more, f"data={json.dumps(small)}"])
    assert result.exit_code == 0, result.output
    return result


def test_a_split_too_small_to_say_much_is_said_and_its_figures_counted(fleet, tmp_path,
                                                                        monkeypatch):
    """Eight engines: 2 held out for test, 1 validates. Training warns once per split, and
    each figure from it comes with its count of engines."""
    result = _train_eight_engines(fleet, tmp_path, monkeypatch)
    warned = [line for line in result.stderr.splitlines() if "say little" in line]
    assert warned == [
        "warning: 2 test engines: the test figures say little (fewer than 10)",
        "warning: 1 validation engine: the validation figures and the interval say little "
        "(fewer than 5)"]
    assert ("fleet: 8 engines: 6 failed (train 5, validate 1), 2 held out for test, 0 in "
            "service") in result.stderr
    out = result.stdout
    assert " from 2 engines (uncapped " in out and " from 1 engine)" in out
    assert "test interval: the true RUL inside it for " in out
    assert "% of 2 engines (target 90%), mean width" in out


def test_out_of_fold_figures_count_every_engine_that_validated(fleet, tmp_path, monkeypatch):
    """Folds: the validation RMSE is out-of-fold over every failed engine (6 of the 8), not
    fold 0's 2, so it is printed without a count; the test figures keep theirs."""
    result = _train_eight_engines(fleet, tmp_path, monkeypatch, "ensemble=3",
                                  "ensemble_split=folds")
    summary = next(line for line in result.stdout.splitlines()
                   if line.startswith("ensemble of 3: "))
    assert " test RMSE " in summary and " from 2 engines (members " in summary
    assert summary.split("out-of-fold val RMSE ")[1].replace(".", "").isdigit(), summary


@pytest.mark.parametrize("case, change, said", [
    ("a column not there", {"sensors": ["T24", "P3O"]},
     "data.sensors: no column 'P3O' (columns: "),
    ("a pattern matching nothing", {"sensors": ["X*"]},
     "data.sensors: the pattern 'X*' matches no column"),
    ("a unit column with text", {"unit": "site"},
     "row 1, column site: is not a number"),
    ("a time that repeats", {"train": "repeats.parquet"},
     "engine_id 1: duplicate flight_cycle 1 (row 2)"),
    ("a constant sensor", {"sensors": ["T24", "T2"]},
     "data.sensors: T2 (518.67) holds one value in every row: it tells nothing of wear; leave "
     "it out"),
    ("every sensor named", {"sensors": NASA},  # each constant one at once, not one a run
     "data.sensors: T2 (518.67), P2 (14.62), epr (1.3), farB (0.03), Nf_dmd (2388), PCNfR_dmd "
     "(100) hold one value in every row: they tell nothing of wear; leave them out"),
    ("a censored column not there", {"censored_column": "in_service"},
     "fleet.parquet: data.censored_column: no column 'in_service' (columns: "),
    ("a failed column not there", {"failed_column": "Failed", "train": "fleet_failed.parquet",
                                   "test": None, "test_rul_column": None},
     "data.failed_column: no column 'Failed' (did you mean 'failed'?)"),
    ("both markers", {"failed_column": "failed", "censored_column": "failed"},
     "data.censored_column: the engines in service are given once: data.censored_column or "
     "data.failed_column, not both"),
    ("a pattern catching true/false", {"sensors": ["T24", "f*"], "train": "fleet_failed.parquet",
                                       "test": None, "test_rul_column": None},
     "data.sensors: the pattern 'f*' matches the column 'failed', which holds true/false "
     "values, not numbers: narrow the pattern or name the columns"),
    ("a pattern catching text", {"sensors": ["T24", "s*"]},
     "data.sensors: the pattern 's*' matches the column 'site', which holds text, not numbers"),
    ("a semicolon CSV read with commas", {"train": "fleet_semicolon.csv", "delimiter": ","},
     "fleet_semicolon.csv: read with the delimiter ',', its header is one column "),
    ("a semicolon CSV lacking a column", {"train": "fleet_semicolon.csv",
                                          "sensors": ["T24", "P3O"]},
     "data.sensors: no column 'P3O' (columns: "),
    ("no sensor left", {"sensors": ["P15", "epr"], "informative": "auto"},
     "features=informative: no sensor of fleet trends with the engines' age"),
    ("test columns unlike training's", {"test": "fleet_short.csv"},
     "lacks the columns T24"),
])
def test_a_bad_description_is_one_line_and_starts_nothing(fleet, tmp_path, monkeypatch, case,
                                                          change, said):
    pd.read_csv(fleet / "fleet_test.csv").drop(columns="T24").to_csv(
        fleet / "fleet_short.csv", index=False)
    repeats = pd.read_parquet(fleet / "fleet.parquet")
    repeats.loc[1, "flight_cycle"] = 1  # engine 1's second row again at cycle 1
    repeats.to_parquet(fleet / "repeats.parquet", index=False)
    if case == "no sensor left":  # two sensors that only jitter: no trend with the age
        rng = np.random.default_rng(0)
        frame = pd.read_parquet(fleet / "fleet.parquet")
        frame = frame.assign(P15=rng.normal(size=len(frame)), epr=rng.normal(size=len(frame)))
        frame.to_parquet(tmp_path / "jitter.parquet", index=False)
        change = {**change, "train": str(tmp_path / "jitter.parquet")}
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["train", *TINY, f"data_dir={fleet}",
                                       f"data={json.dumps(section(**change))}"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len([line for line in lines if not line.startswith("warning:")]) == 1, lines
    assert said in lines[-1], lines[-1]
    assert [p.name for p in tmp_path.iterdir() if p.name != "jitter.parquet"] == []


def test_a_fleet_is_tracked_registered_and_served_under_its_own_names(fleet, tmp_path,
                                                                       monkeypatch):
    """rul train on the fleet's config: the experiment and the registered model are
    rul-fleet; model.predict and rul predict answer with engine_id and agree; C-MAPSS's
    column names are refused in one line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump({"data": section()}))
    result = CliRunner().invoke(main, ["train", str(config), *TINY[:-1], f"data_dir={fleet}",
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "registered rul-fleet version 1" in result.stdout
    assert "in experiment 'rul-fleet'" in result.stdout
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        model = mlflow.pyfunc.load_model("models:/rul-fleet@champion")
        rows = pd.read_csv(fleet / "fleet_test.csv")
        answer = model.predict(rows)
        run = mlflow.get_run(model.metadata.run_id)
        inputs = mlflow.models.get_model_info("models:/rul-fleet@champion").signature.inputs
        version = mlflow.MlflowClient().get_model_version_by_alias("rul-fleet", "champion")
    finally:
        mlflow.set_tracking_uri(None)
    # the version says what it is: the columns it reads in order, its engines, its recipe
    assert inputs.input_names() == ["engine_id", "flight_cycle", *SETTINGS, *INFORMATIVE]
    said = version.description
    assert ("Columns read, in order (19): engine_id, flight_cycle, altitude, mach, tra, T24, "
            "T30, T50, P30") in said and "Operating conditions: 1." in said
    assert "held out for test 100 (1-100); in service 0 (none)." in said
    assert "Data: fleet (sensors track), SHA-256 test " in said
    assert "Interval: target 90%, test coverage 0." in said
    command = said.split("Reproduce: `")[1].split("`")[0]
    args = shlex.split(command)
    assert args[:3] == ["rul", "train", "experiments/fleet.yaml"]
    again = cfg.load(ROOT / args[2], [*args[3:], f"data_dir={fleet}"])
    assert again.model_dump() == config_from_params(run.data.params).model_dump()
    assert version.tags["data.columns"] == run.data.tags["data.columns"]
    assert version.tags["subset"] == "fleet" and version.tags["data.sha256.train"]
    assert answer.columns[0] == "engine_id" and len(answer) == 100
    assert run.data.params["data.unit"] == "engine_id"
    assert run.data.tags["data.columns"].startswith("engine_id,flight_cycle,altitude")
    predicted = CliRunner().invoke(main, ["predict", "--model", "models:/rul-fleet@champion",
                                          "--input", str(fleet / "fleet_test.csv")])
    assert predicted.exit_code == 0, predicted.output
    from_cli = pd.read_csv(__import__("io").StringIO(predicted.stdout))
    assert list(from_cli.columns) == list(answer.columns)
    assert np.allclose(from_cli["rul"], answer["rul"], rtol=0, atol=1e-9)
    cmapss = rows.rename(columns={v: k for k, v in RENAMED.items()})
    cmapss.to_csv(tmp_path / "cmapss.csv", index=False)
    refused = CliRunner().invoke(main, ["predict", "--model", "models:/rul-fleet@champion",
                                        "--input", str(tmp_path / "cmapss.csv")])
    assert refused.exit_code == 2
    assert refused.stderr.strip().endswith("expected engine_id, flight_cycle, altitude, mach, "
                                           "tra, T24, T30, T50, P30, Nf and 9 more")


@pytest.mark.slow
def test_http_answers_the_fleet_under_its_own_names(fleet, tmp_path):
    """The fleet's model served over HTTP (make serve's server) answers as model.predict."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump({"data": section()}))
    subprocess.run([sys.executable, "-m", "rul", "train", str(config), *TINY[:-1],
                    f"data_dir={fleet}", "--no-progress"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=600)
    port = _free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen([sys.executable, "-m", "rul.serving.server",
                                "models:/rul-fleet@champion", "--port", str(port)],
                               cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        wait_until_answering(process, f"http://127.0.0.1:{port}/ping", tmp_path / "serve.log",
                             120)
        body = (fleet / "fleet_test.csv").read_bytes()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "text/csv"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())["predictions"]
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        log.close()
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    try:
        local = mlflow.pyfunc.load_model("models:/rul-fleet@champion").predict(
            pd.read_csv(fleet / "fleet_test.csv"))
    finally:
        mlflow.set_tracking_uri(None)
    assert [row["engine_id"] for row in answer] == local["engine_id"].tolist()
    assert np.allclose([row["rul"] for row in answer], local["rul"], rtol=0, atol=1e-9)
