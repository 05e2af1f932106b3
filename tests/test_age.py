"""The engine's age: records that bend its assumption (a counter offset, a late start), the
age-only baseline, errors by age, training with late starts (late_start_max), and the offset
table of logged models (tools/age_offsets.py)."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import load_tool

from rul import config as cfg
from rul.data.records import late_starts, offset_counter, start_late
from rul.data.split import rows_of
from rul.evaluation.age import SCENARIOS, AgeOnly, errors_by_age, last_ages, perturbed
from rul.plan import prepared
from rul.preprocessing.features import track


def test_a_counter_offset_moves_every_cycle_and_nothing_else(make_frame):
    rows = make_frame((5, 3))
    shifted = offset_counter(rows, 25)
    assert shifted["cycle"].tolist() == [26, 27, 28, 29, 30, 26, 27, 28]
    pd.testing.assert_frame_equal(shifted.drop(columns="cycle"), rows.drop(columns="cycle"))
    assert rows["cycle"].tolist() == [1, 2, 3, 4, 5, 1, 2, 3]  # the input is left alone


def test_a_late_start_drops_the_first_rows_and_renumbers_from_one(make_frame):
    rows = make_frame((5, 3, 8), first_unit=4)
    late, dropped = start_late(rows, 3)
    assert dropped == [5]  # 3 rows: nothing left
    assert late["unit"].tolist() == [4, 4, 6, 6, 6, 6, 6]
    assert late["cycle"].tolist() == [1, 2, 1, 2, 3, 4, 5]
    # the last rows, hence the RUL at the last row, are the recorded ones
    for unit in (4, 6):
        recorded = rows[rows.unit == unit].drop(columns="cycle").tail(late.unit.eq(unit).sum())
        pd.testing.assert_frame_equal(late[late.unit == unit].drop(columns="cycle"), recorded)
    per_unit, _ = start_late(rows, {4: 1, 6: 0})
    assert per_unit["cycle"].tolist() == [1, 2, 3, 4, 1, 2, 3, *range(1, 9)]
    with pytest.raises(ValueError, match="late < 0"):
        start_late(rows, -1)


def test_late_starts_are_seeded_draws_in_range():
    drawn = late_starts(np.arange(1, 101), 50, seed=3)
    assert sorted(drawn) == list(range(1, 101))
    values = np.array(list(drawn.values()))
    assert values.min() >= 0 and values.max() <= 50 and len(set(values)) > 20
    assert drawn == late_starts(np.arange(1, 101), 50, seed=3)
    assert drawn != late_starts(np.arange(1, 101), 50, seed=4)


@pytest.mark.parametrize(("scenario", "cycles", "dropped"), [
    ("as recorded", [1, 2, 3, 4, 5, 1, 2, 3], []),
    ("counter +25", [26, 27, 28, 29, 30, 26, 27, 28], []),
    ("counter +50", [51, 52, 53, 54, 55, 51, 52, 53], []),
])
def test_scenarios_of_the_offset_table(make_frame, scenario, cycles, dropped):
    rows, gone = perturbed(make_frame((5, 3)), scenario)
    assert rows["cycle"].tolist() == cycles and gone == dropped


def test_late_start_scenarios(make_frame):
    rows, gone = perturbed(make_frame((30, 60)), "starts 25 late")
    assert rows.groupby("unit").size().tolist() == [5, 35] and gone == []
    rows, gone = perturbed(make_frame((30, 60)), "starts 50 late")
    assert rows.groupby("unit").size().tolist() == [10] and gone == [1]
    assert tuple(SCENARIOS) == ("as recorded", "counter +25", "counter +50", "starts 25 late",
                         "starts 50 late")
    with pytest.raises(ValueError, match="unknown scenario"):
        perturbed(make_frame((5,)), "counter sideways")


def test_age_only_baseline_is_the_mean_capped_rul_of_the_engines_still_running():
    train = pd.DataFrame({"unit": [1] * 100 + [2] * 200 + [3] * 300,
                          "cycle": [*range(1, 101), *range(1, 201), *range(1, 301)]})
    model = AgeOnly.fit(train, cap=125)
    np.testing.assert_allclose(model.lives, [100, 200, 300])
    predicted = model.predict([1, 100, 150, 250, 300, 301])
    np.testing.assert_allclose(predicted, [(99 + 125 + 125) / 3, (0 + 100 + 125) / 3,
                                           (50 + 125) / 2, 50.0, 0.0, 0.0])


def test_errors_by_age_bucket():
    rows = errors_by_age([10, 20, 30, 40], [12, 20, 20, 40], [30, 60, 70, 260])
    assert rows == [
        {"ages": "0-49", "units": 1, "rmse": 2.0, "bias": -2.0},
        {"ages": "50-99", "units": 2, "rmse": pytest.approx(np.sqrt(50)), "bias": 5.0},
        {"ages": ">= 200", "units": 1, "rmse": 0.0, "bias": 0.0},
    ]
    ages = last_ages(pd.DataFrame({"unit": [7, 7, 3], "cycle": [1, 2, 9]}))
    assert ages.to_dict() == {7: 2, 3: 9}


# ------------------------------------------------------------------ late_start_max


def test_late_start_max_is_a_training_key_off_by_default():
    assert cfg.load().late_start_max == 0
    assert "late_start_max" not in cfg.load().to_dict()  # configs and digests of before
    from rul.tracking.run_names import config_digest

    assert config_digest(cfg.load()) != config_digest(cfg.load(None, ["late_start_max=50"]))
    with pytest.raises(cfg.ConfigError, match="late_start_max=-1"):
        cfg.load(None, ["late_start_max=-1"])


def test_training_with_late_starts_shortens_and_renumbers_training_records_only(write_cmapss):
    directory = write_cmapss(train_lengths=(60,) * 10, test_lengths=(40,) * 3)
    base = cfg.load(None, {"data_dir": str(directory), "window": 10, "include_cycle": True})
    recorded = prepared(base, split_seed=5)
    late = prepared(base.replace(late_start_max=20), split_seed=5)
    np.testing.assert_array_equal(late.train_units, recorded.train_units)
    # the validation records as recorded (scaled by the preprocessing fitted on the rows
    # the model trains on)
    val_rows = rows_of(late.subset.train, late.val_units)
    np.testing.assert_array_equal(late.val.values, late.preprocessor.transform(val_rows))
    np.testing.assert_array_equal(late.val.targets, recorded.val.targets)
    drawn = late_starts(recorded.train_units, 20, 5)
    expected = sum(60 - k - 10 + 1 for k in drawn.values())
    assert len(late.train) == expected < len(recorded.train)
    # each engine still ends at RUL 0 and its targets count down to it
    last = np.flatnonzero(np.r_[late.train.units[1:] != late.train.units[:-1], True])
    assert (late.train.targets[last] == 0).all()
    # every training record starts again from cycle 1: the age column's first row of each
    # engine is the lowest scaled age, as in the records as recorded
    firsts = np.r_[0, last[:-1] + 1]
    np.testing.assert_array_equal(late.train.values[late.train.starts[firsts], -1], -1.0)
    # late_start_max=0 is the data of before, bit for bit
    again = prepared(base.replace(late_start_max=0), split_seed=5)
    np.testing.assert_array_equal(again.train.values, recorded.train.values)


def test_track_names():
    assert track(False) == "sensors" and track(True) == "sensors+age"


# ------------------------------------------------------------------ the offset table


@pytest.fixture(scope="module")
def tool():
    return load_tool("age_offsets")


class AgeReader:
    """A stand-in logged model that predicts 200 minus the last row's cycle, capped: what a
    model leaning on the age alone does."""

    track, params, networks = "sensors+age", {}, [None]
    preprocessor = SimpleNamespace(rul_cap=125)

    def last_cycle(self, rows):
        ages = last_ages(rows)
        return ages.index.to_numpy(), np.clip(200.0 - ages.to_numpy(), 0, 125)[None, :]


def test_offset_table_scores_each_scenario_on_the_units_it_keeps(tool, make_frame):
    test = make_frame((40, 60, 100))
    subset = SimpleNamespace(test=test, test_rul=np.array([160, 140, 100]),
                             train=make_frame((200, 200)))
    scores = tool.scenario_scores(AgeReader(), subset)
    # as recorded: ages 40, 60, 100 -> 125, 125, 100 against capped 125, 125, 100
    assert scores["as recorded"] == {"rmse": 0.0, "same_units": 0.0, "units": 3}
    # +50: ages 90, 110, 150 -> 110, 90, 50: errors -15, -35, -50
    assert scores["counter +50"]["rmse"] == pytest.approx(np.sqrt((15**2 + 35**2 + 50**2) / 3))
    # 50 late: unit 1 (40 rows) is gone; ages 10, 50 -> 125, 125 against 125, 100
    assert scores["starts 50 late"] == {"rmse": pytest.approx(np.sqrt(25**2 / 2)),
                                        "same_units": 0.0, "units": 2}
    baseline = tool.baseline_scores(subset, 125)
    assert set(baseline) == set(SCENARIOS)
    table = tool.offset_table({"sensors+age": [scores, scores]}, baseline)
    assert table.splitlines()[0] == "| test records | units | sensors+age (2) | age only |"
    assert "| starts 50 late | 2 | 17.68 ± 0.00 (as recorded 0.00 ± 0.00) |" in table
