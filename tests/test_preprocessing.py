"""Preprocessing: RUL targets, features, scaling fitted on training units only, windows."""

import pickle

import numpy as np
import pandas as pd
import pytest

from rul.data.schema import COLUMNS, INFORMATIVE_SENSORS, SETTING_COLUMNS
from rul.data.split import rows_of, split_units
from rul.preprocessing import Preprocessor, WindowSet, piecewise_rul
from rul.preprocessing.smoothing import smooth_per_unit
from rul.preprocessing.windows import ShortUnitWarning

WINDOW = 30


def frame_of(rows) -> pd.DataFrame:
    """A frame with only unit and cycle given; other columns zero."""
    frame = pd.DataFrame(0.0, index=range(len(rows)), columns=COLUMNS)
    frame[["unit", "cycle"]] = np.asarray(rows, dtype=np.int64)
    return frame.astype({"unit": np.int64, "cycle": np.int64})


@pytest.fixture(scope="module")
def fd001_split(fd001):
    train_units, val_units = split_units(fd001.train["unit"], 0.2, seed=0)
    return train_units, val_units


# --- piecewise-linear RUL ----------------------------------------------------------------------


def test_piecewise_rul_by_hand():
    # unit 7: cycles 1..8 (last 8); unit 2: cycles 5..7 (last 7), units not sorted
    rows = [(7, c) for c in range(1, 9)] + [(2, c) for c in (5, 6, 7)]
    frame = frame_of(rows)

    raw = piecewise_rul(frame, cap=None)
    capped = piecewise_rul(frame, cap=4)

    assert raw.dtype == np.float32 and capped.dtype == np.float32
    assert raw.tolist() == [7, 6, 5, 4, 3, 2, 1, 0, 2, 1, 0]
    assert capped.tolist() == [4, 4, 4, 4, 3, 2, 1, 0, 2, 1, 0]
    assert piecewise_rul(frame).tolist() == raw.tolist()  # default cap 125 is not reached


def test_piecewise_rul_on_real_fd001(fd001):
    rul = piecewise_rul(fd001.train, cap=125)
    unit_1 = fd001.train["unit"].to_numpy() == 1  # 192 cycles
    expected = np.minimum(125, 192 - np.arange(1, 193))
    np.testing.assert_array_equal(rul[unit_1], expected)
    ends = fd001.train.groupby("unit").tail(1).index
    assert (rul[ends] == 0).all()
    assert rul.max() == 125 and rul.min() == 0


# --- windows on the real FD001 -------------------------------------------------------------------


@pytest.fixture(scope="module")
def fd001_windows(fd001):
    prep = Preprocessor(window=WINDOW).fit(fd001.train)
    return prep, prep.window_set(fd001.train)


def test_window_count_on_fd001(fd001, fd001_windows):
    _, ws = fd001_windows
    assert isinstance(ws, WindowSet)
    assert len(ws) == 17731  # 20631 rows - 100 units * 29
    assert ws.values.shape == (20631, 14)
    assert ws.values.dtype == np.float32
    assert ws.targets.dtype == np.float32
    per_unit = pd.Series(ws.units).value_counts().sort_index()
    lengths = fd001.train.groupby("unit").size()
    np.testing.assert_array_equal(per_unit.to_numpy(), (lengths - (WINDOW - 1)).to_numpy())


def test_windows_are_views_of_the_rows(fd001_windows):
    _, ws = fd001_windows
    windows = ws.windows
    assert np.shares_memory(windows, ws.values)
    assert windows.shape == (20631 - WINDOW + 1, WINDOW, 14)
    for i in (0, 1, 162, 5000, len(ws) - 1):
        start = ws.starts[i]
        np.testing.assert_array_equal(windows[start], ws.values[start:start + WINDOW])


def test_every_window_lies_within_one_unit(fd001, fd001_windows):
    _, ws = fd001_windows
    units = fd001.train["unit"].to_numpy()
    cycles = fd001.train["cycle"].to_numpy()
    rows = ws.starts[:, None] + np.arange(WINDOW)[None, :]
    assert (units[rows] == ws.units[:, None]).all()
    assert (np.diff(cycles[rows], axis=1) == 1).all()
    # the first window of each unit starts at its first row
    first_rows = np.flatnonzero(np.r_[True, units[1:] != units[:-1]])
    assert set(first_rows) <= set(ws.starts)


def test_window_targets_are_capped_rul_of_the_last_row(fd001, fd001_windows):
    _, ws = fd001_windows
    frame = fd001.train
    last_cycle = frame.groupby("unit")["cycle"].max()
    end = ws.starts + WINDOW - 1
    cycle_at_end = frame["cycle"].to_numpy()[end]
    expected = np.minimum(125, last_cycle.loc[ws.units].to_numpy() - cycle_at_end)
    np.testing.assert_array_equal(ws.targets, expected.astype(np.float32))
    # unit 1 (192 cycles): windows end at cycles 30..192 -> targets 125 (capped) ... 0
    unit_1 = ws.targets[ws.units == 1]
    assert len(unit_1) == 163
    assert unit_1[0] == 125 and unit_1[-1] == 0 and unit_1[-2] == 1


def test_last_windows_of_the_fd001_test_set(fd001, fd001_windows):
    prep, _ = fd001_windows
    units, windows = prep.last_windows(fd001.test)
    assert windows.shape == (100, 30, 14)
    assert windows.dtype == np.float32
    assert units.tolist() == list(range(1, 101))
    values = prep.transform(fd001.test)
    test_units = fd001.test["unit"].to_numpy()
    for k, unit in enumerate((1, 37, 100)):
        rows = np.flatnonzero(test_units == unit)[-WINDOW:]
        np.testing.assert_array_equal(windows[unit - 1], values[rows], err_msg=str(k))


# --- split by unit -------------------------------------------------------------------------------


def test_split_units_is_a_seeded_partition(fd001):
    units = fd001.train["unit"]
    train, val = split_units(units, 0.2, seed=0)
    assert len(train) == 80 and len(val) == 20
    assert set(train).isdisjoint(val)
    assert sorted(set(train) | set(val)) == list(range(1, 101))
    assert list(train) == sorted(train) and list(val) == sorted(val)

    again_train, again_val = split_units(units, 0.2, seed=0)
    np.testing.assert_array_equal(train, again_train)
    np.testing.assert_array_equal(val, again_val)

    _, other_val = split_units(units, 0.2, seed=1)
    assert set(other_val) != set(val)


def test_split_units_edge_cases():
    train, val = split_units([3, 1, 2, 3, 1], 0.0, seed=0)
    assert train.tolist() == [1, 2, 3] and val.tolist() == []
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="val_fraction"):
            split_units([1, 2, 3], bad, seed=0)
    with pytest.raises(ValueError, match="cannot split 3 units"):
        split_units([1, 2, 3], 0.1, seed=0)  # rounds to 0 validation units


def test_train_and_val_windows_share_no_unit(fd001, fd001_split):
    train_units, val_units = fd001_split
    prep = Preprocessor(window=WINDOW).fit(rows_of(fd001.train, train_units))
    train_ws = prep.window_set(rows_of(fd001.train, train_units))
    val_ws = prep.window_set(rows_of(fd001.train, val_units))
    assert set(train_ws.units) == set(train_units)
    assert set(val_ws.units) == set(val_units)
    assert set(train_ws.units).isdisjoint(val_ws.units)
    assert len(train_ws) + len(val_ws) == 17731


# --- scaling: fitted on training units only ----------------------------------------------------


def test_minmax_statistics_come_from_training_units_only(fd001, fd001_split):
    train_units, val_units = fd001_split
    train_rows = rows_of(fd001.train, train_units)
    val_rows = rows_of(fd001.train, val_units)
    prep = Preprocessor(normalization="minmax").fit(train_rows)

    raw = train_rows[INFORMATIVE_SENSORS].to_numpy()
    low, high = raw.min(axis=0), raw.max(axis=0)
    np.testing.assert_allclose(prep.scaler_.scale_[0], 2.0 / (high - low))
    np.testing.assert_allclose(prep.scaler_.offset_[0], -1.0 - 2.0 * low / (high - low))

    scaled = prep.transform(train_rows)
    np.testing.assert_allclose(scaled.min(axis=0), -1.0, atol=1e-5)
    np.testing.assert_allclose(scaled.max(axis=0), 1.0, atol=1e-5)

    val_scaled = prep.transform(val_rows)
    assert (val_scaled < -1.0 - 1e-4).any() or (val_scaled > 1.0 + 1e-4).any()

    # fitting on all rows would give other statistics: the test above can tell them apart
    leaky = Preprocessor(normalization="minmax").fit(fd001.train)
    assert not np.allclose(leaky.scaler_.scale_, prep.scaler_.scale_)


def test_zscore_statistics_come_from_training_units_only(fd001, fd001_split):
    train_units, val_units = fd001_split
    train_rows = rows_of(fd001.train, train_units)
    prep = Preprocessor(normalization="zscore").fit(train_rows)

    scaled = prep.transform(train_rows).astype(np.float64)
    np.testing.assert_allclose(scaled.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(scaled.std(axis=0), 1.0, atol=1e-4)
    raw = train_rows[INFORMATIVE_SENSORS].to_numpy()
    np.testing.assert_allclose(prep.scaler_.scale_[0], 1.0 / raw.std(axis=0))

    val_scaled = prep.transform(rows_of(fd001.train, val_units)).astype(np.float64)
    assert np.abs(val_scaled.mean(axis=0)).max() > 1e-2


def test_transform_is_an_affine_map_of_the_raw_values(make_frame):
    frame = make_frame((40, 50), seed=3)
    prep = Preprocessor(normalization="minmax").fit(frame)
    shifted = frame.copy()
    raw = frame[INFORMATIVE_SENSORS].to_numpy()
    shifted[INFORMATIVE_SENSORS] = raw + (raw.max(axis=0) - raw.min(axis=0))  # one range up
    np.testing.assert_allclose(prep.transform(shifted), prep.transform(frame) + 2.0, atol=1e-4)


# --- per operating condition -------------------------------------------------------------------


@pytest.fixture(scope="module")
def six_conditions(make_frame):
    """920 rows, each in one of six conditions (FD002 setting triplets, drawn at random)."""
    frame = make_frame((150, 180, 120, 160, 140, 170), seed=11, conditions=6)
    # setting_1 alone tells the six FD002 conditions apart (0, 10, 20, 25, 35, 42)
    _, condition = np.unique(frame["setting_1"].round().to_numpy(), return_inverse=True)
    assert np.bincount(condition).size == 6 and np.bincount(condition).min() > 100
    return frame, condition


def test_per_condition_zscore_normalizes_each_condition(six_conditions):
    frame, condition = six_conditions
    prep = Preprocessor(n_conditions=6, normalization="zscore").fit(frame)
    scaled = prep.transform(frame).astype(np.float64)
    # KMeans recovers the six conditions (up to label order)
    labels = prep.scaler_.conditions(frame[SETTING_COLUMNS].to_numpy())
    assert len(np.unique(labels)) == 6
    assert pd.crosstab(labels, condition).gt(0).sum(axis=1).eq(1).all()
    for k in range(6):
        part = scaled[condition == k]
        np.testing.assert_allclose(part.mean(axis=0), 0.0, atol=1e-4)
        np.testing.assert_allclose(part.std(axis=0), 1.0, atol=1e-4)


def test_the_age_is_scaled_alike_in_every_condition(six_conditions):
    """Sensors are scaled per condition, the age is not: it does not depend on the condition,
    so one cycle number maps to one value whatever condition the row ran in."""
    frame, condition = six_conditions
    prep = Preprocessor(n_conditions=6, normalization="zscore", include_cycle=True).fit(frame)
    scaled = prep.transform(frame).astype(np.float64)
    sensors = Preprocessor(n_conditions=6, normalization="zscore").fit(frame).transform(frame)
    np.testing.assert_array_equal(scaled[:, :-1], sensors)
    cycles = frame["cycle"].to_numpy(np.float64)
    expected = (cycles - cycles.mean()) / cycles.std()
    np.testing.assert_allclose(scaled[:, -1], expected, atol=1e-5)
    # judging constancy within each condition, the age is kept, last, after the live sensors
    dropped = Preprocessor(features="all", drop_constant=True, n_conditions=6,
                           include_cycle=True).fit(frame)
    assert dropped.feature_columns_ == INFORMATIVE_SENSORS + ["cycle"]


def test_global_scaling_leaves_conditions_apart(six_conditions):
    frame, condition = six_conditions
    prep = Preprocessor(n_conditions=1, normalization="zscore").fit(frame)
    scaled = prep.transform(frame).astype(np.float64)
    means = np.array([scaled[condition == k].mean(axis=0) for k in range(6)])
    spreads = np.array([scaled[condition == k].std(axis=0) for k in range(6)])
    # between conditions the means differ by far more than the spread within one
    assert (means.max(axis=0) - means.min(axis=0) > 2.0).all()
    assert (spreads < 0.05).all()


def test_per_condition_minmax_maps_each_condition_to_the_full_range(six_conditions):
    frame, condition = six_conditions
    prep = Preprocessor(n_conditions=6, normalization="minmax").fit(frame)
    scaled = prep.transform(frame)
    for k in range(6):
        part = scaled[condition == k]
        np.testing.assert_allclose(part.min(axis=0), -1.0, atol=1e-5)
        np.testing.assert_allclose(part.max(axis=0), 1.0, atol=1e-5)


# --- causal smoothing per unit -----------------------------------------------------------------


def test_smoothing_by_hand_restarts_at_each_unit():
    values = np.array([[0.0], [2.0], [4.0], [10.0], [20.0]], dtype=np.float32)
    units = np.array([7, 7, 7, 3, 3])

    smoothed = smooth_per_unit(values, units, alpha=0.5)

    # row t: sum_k 0.5^k x[t-k] / sum_k 0.5^k over the unit's rows so far
    expected = [0.0, (2 + 0.5 * 0) / 1.5, (4 + 0.5 * 2 + 0.25 * 0) / 1.75,
                10.0, (20 + 0.5 * 10) / 1.5]
    assert smoothed.dtype == np.float32 and smoothed.flags.writeable  # torch needs writable
    np.testing.assert_allclose(smoothed[:, 0], expected, rtol=1e-6)
    assert smooth_per_unit(values, units, alpha=1.0) is values
    with pytest.raises(ValueError, match="alpha must be in"):
        smooth_per_unit(values, units, alpha=0.0)


def test_smoothed_last_window_of_a_cut_unit_equals_its_training_window(fd001):
    """Causal: the window a model sees in service (history cut at cycle t) is the window it
    was trained on for cycle t, bit for bit; later cycles never leak backwards."""
    prep = Preprocessor(window=WINDOW, smoothing_alpha=0.1).fit(fd001.train)
    train = fd001.train
    ws = prep.window_set(train)
    for unit, cut in [(1, 100), (2, 30), (3, 179)]:
        history = train[(train["unit"] == unit) & (train["cycle"] <= cut)]
        _, served = prep.last_windows(history)
        start = ws.starts[(ws.units == unit)][cut - WINDOW]  # window ending at cycle `cut`
        np.testing.assert_array_equal(served[0], ws.values[start:start + WINDOW])


def test_smoothing_cuts_sensor_noise_on_fd001(fd001):
    plain = Preprocessor(smoothing_alpha=1.0).fit(fd001.train)
    smooth = Preprocessor(smoothing_alpha=0.1).fit(fd001.train)
    units = fd001.train["unit"].to_numpy()
    scaled = plain.transform(fd001.train)

    smoothed = smooth.transform(fd001.train)

    same_unit = units[1:] == units[:-1]
    jitter_before = np.abs(np.diff(scaled, axis=0))[same_unit].mean()
    jitter_after = np.abs(np.diff(smoothed, axis=0))[same_unit].mean()
    assert jitter_after < jitter_before / 5  # cycle-to-cycle noise is mostly gone
    # ...and what is left tracks wear better: |corr(sensor, capped RUL)| rises on average
    target = piecewise_rul(fd001.train, cap=125)
    corr_before = np.array([abs(np.corrcoef(col, target)[0, 1]) for col in scaled.T])
    corr_after = np.array([abs(np.corrcoef(col, target)[0, 1]) for col in smoothed.T])
    assert corr_after.mean() > corr_before.mean() + 0.03  # measured 0.66 -> 0.71
    assert (corr_after > corr_before - 0.02).all()


def test_smoothing_runs_on_condition_scaled_values(make_frame):
    """Per-condition scaling is not one affine map over rows, so smoothing must come after it:
    raw sensors jump by thousands between conditions."""
    frame = make_frame((40, 50), seed=0, conditions=6)
    plain = Preprocessor(n_conditions=6, smoothing_alpha=1.0).fit(frame)
    smooth = Preprocessor(n_conditions=6, smoothing_alpha=0.2).fit(frame)

    smoothed = smooth.transform(frame)

    expected = smooth_per_unit(plain.transform(frame), frame["unit"].to_numpy(), 0.2)
    np.testing.assert_allclose(smoothed, expected, atol=1e-6)
    assert np.abs(smoothed).max() <= 1 + 1e-6  # averages of values in [-1, 1]


# --- short units: padding ------------------------------------------------------------------------


def test_short_test_unit_is_front_padded_with_its_first_row(make_frame):
    train = make_frame((60, 50), seed=0)
    test = make_frame((10, 40, 30), seed=1)
    prep = Preprocessor(window=WINDOW).fit(train)
    values = prep.transform(test)

    units, windows = prep.last_windows(test)

    assert units.tolist() == [1, 2, 3]
    assert windows.shape == (3, WINDOW, 14)
    short = windows[0]
    np.testing.assert_array_equal(short[:20], np.repeat(values[:1], 20, axis=0))
    np.testing.assert_array_equal(short[20:], values[:10])
    np.testing.assert_array_equal(windows[1], values[10 + 40 - WINDOW:50])
    np.testing.assert_array_equal(windows[2], values[50:80])  # exactly one window long
    # no full window exists for the short unit
    with pytest.warns(ShortUnitWarning):
        ws = prep.window_set(test)
    assert set(ws.units) == {2, 3}
    assert len(ws) == (40 - 29) + (30 - 29)


def test_short_training_units_are_dropped_recorded_and_named_in_a_warning(make_frame):
    train = make_frame((60, 12, 50, 29, 30), seed=0)
    prep = Preprocessor(window=WINDOW).fit(train)

    with pytest.warns(ShortUnitWarning) as caught:
        ws = prep.window_set(train)

    assert ws.dropped_units == {2: 12, 4: 29}
    assert ws.windows_lost == 41
    assert len(ws) == (60 - 29) + (50 - 29) + (30 - 29)
    assert set(ws.units) == {1, 3, 5}
    (warning,) = caught
    message = str(warning.message)
    assert "unit 2 (12 rows)" in message and "unit 4 (29 rows)" in message
    assert "41 windows lost" in message and "30 cycles" in message
    assert warning.filename == __file__  # points at the caller of windows()


def test_no_short_unit_no_warning(fd001_windows):
    _, ws = fd001_windows
    assert ws.dropped_units == {} and ws.windows_lost == 0


def test_unit_of_one_cycle_is_all_padding(make_frame):
    train = make_frame((60,), seed=0)
    test = make_frame((1, 35), seed=1)
    prep = Preprocessor(window=WINDOW).fit(train)
    _, windows = prep.last_windows(test)
    np.testing.assert_array_equal(windows[0], np.repeat(prep.transform(test)[:1], WINDOW, 0))


# --- feature selection -----------------------------------------------------------------------


def test_drop_constant_keeps_the_14_informative_sensors_of_fd001(fd001):
    prep = Preprocessor(features="all", drop_constant=True).fit(fd001.train)
    assert prep.feature_columns_ == INFORMATIVE_SENSORS
    assert prep.n_features == 14
    kept_all = Preprocessor(features="all").fit(fd001.train)
    assert kept_all.n_features == 21


def test_drop_constant_on_synthetic_data(make_frame):
    # the synthetic non-informative sensors are exactly constant
    prep = Preprocessor(features="all", drop_constant=True).fit(make_frame((50, 40)))
    assert prep.feature_columns_ == INFORMATIVE_SENSORS


def test_include_settings_adds_the_three_settings(fd001):
    prep = Preprocessor(include_settings=True).fit(fd001.train)
    assert prep.feature_columns_ == SETTING_COLUMNS + INFORMATIVE_SENSORS
    assert prep.n_features == 17
    scaled = prep.transform(fd001.train)
    assert scaled.shape == (20631, 17)
    # settings are scaled like the sensors; FD001's setting_3 is constant (100)
    np.testing.assert_allclose(scaled[:, :2].min(axis=0), -1.0, atol=1e-5)
    np.testing.assert_allclose(scaled[:, :2].max(axis=0), 1.0, atol=1e-5)
    assert np.unique(scaled[:, 2]).size == 1
    without = Preprocessor().fit(fd001.train).transform(fd001.train)
    np.testing.assert_array_equal(scaled[:, 3:], without)


def test_include_cycle_adds_the_engines_age_last(fd001):
    prep = Preprocessor(include_cycle=True).fit(fd001.train)
    assert prep.feature_columns_ == INFORMATIVE_SENSORS + ["cycle"]
    scaled = prep.transform(fd001.train)  # smoothing off: the age scaled like a sensor
    cycles = fd001.train["cycle"].to_numpy()
    # min-max to [-1, 1] over the training rows: cycle 1 -> -1, the longest life (362) -> 1
    np.testing.assert_allclose(scaled[:, -1], 2 * (cycles - 1) / (362 - 1) - 1, atol=1e-5)
    without = Preprocessor().fit(fd001.train).transform(fd001.train)
    np.testing.assert_array_equal(scaled[:, :-1], without)
    # smoothed, it still grows with age within every unit (a lagged age, the same information)
    smoothed = Preprocessor(include_cycle=True, smoothing_alpha=0.1).fit(fd001.train)
    age = smoothed.transform(fd001.test)[:, -1]
    same_unit = fd001.test["unit"].to_numpy()[1:] == fd001.test["unit"].to_numpy()[:-1]
    assert (np.diff(age)[same_unit] > 0).all()
    units, windows = smoothed.last_windows(fd001.test)
    assert windows.shape == (100, 30, 15)


def test_feature_list_and_bad_options(make_frame):
    frame = make_frame((40,))
    prep = Preprocessor(features=["s_4", "s_11"]).fit(frame)
    assert prep.feature_columns_ == ["s_4", "s_11"]
    assert prep.transform(frame).shape == (40, 2)
    with pytest.raises(ValueError, match="s_99"):
        Preprocessor(features=["s_99"]).fit(frame)
    with pytest.raises(ValueError, match="features must be one of"):
        Preprocessor(features="some").fit(frame)
    with pytest.raises(ValueError, match="normalization"):
        Preprocessor(normalization="robust").fit(frame)
    with pytest.raises(ValueError, match="near-constant"):
        Preprocessor(features=["s_1", "s_5"], drop_constant=True).fit(frame)
    with pytest.raises(ValueError, match="near-constant"):  # the age alone is no model input
        Preprocessor(features=["s_1", "s_5"], drop_constant=True, include_cycle=True).fit(frame)


# --- persistence -------------------------------------------------------------------------------


def test_pickle_round_trip_reproduces_transform(fd001):
    prep = Preprocessor(features="all", drop_constant=True, include_settings=True,
                        normalization="zscore").fit(fd001.train)
    clone = pickle.loads(pickle.dumps(prep))
    assert clone.feature_columns_ == prep.feature_columns_
    assert np.array_equal(clone.transform(fd001.test), prep.transform(fd001.test))
    units, windows = clone.last_windows(fd001.test)
    assert np.array_equal(windows, prep.last_windows(fd001.test)[1])
    assert clone.get_params() == prep.get_params()


def test_a_preprocessor_pickled_before_include_cycle_still_works(fd001):
    prep = Preprocessor(smoothing_alpha=0.1).fit(fd001.train)
    del prep.include_cycle  # what an object pickled before the parameter existed lacks
    old = pickle.loads(pickle.dumps(prep))
    assert "include_cycle" not in vars(old)
    assert old.get_params()["include_cycle"] is False
    np.testing.assert_array_equal(old.transform(fd001.test),
                                  Preprocessor(smoothing_alpha=0.1).fit(fd001.train)
                                  .transform(fd001.test))


def test_pickle_round_trip_with_conditions(six_conditions):
    frame, _ = six_conditions
    prep = Preprocessor(n_conditions=6, normalization="minmax").fit(frame)
    clone = pickle.loads(pickle.dumps(prep))
    assert np.array_equal(clone.transform(frame), prep.transform(frame))
