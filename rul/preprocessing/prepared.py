"""The data one training reads: the subset's files, split by unit, the preprocessing fitted on
the training units only, and the windows of each split.

A window longer than every unit of a split is a ConfigError here, so that it is known before
any run exists.
"""

import warnings
from dataclasses import dataclass, field

import numpy as np

from rul.data import CMAPSSSubset, load_subset
from rul.data.errors import DataError
from rul.data.records import late_starts, start_late
from rul.data.schema import SETTING_COLUMNS
from rul.data.split import fold_units, rows_of, split_units
from rul.errors import ConfigError
from rul.preprocessing.odd_inputs import describe, find_odd, varying_in_test
from rul.preprocessing.pipeline import Preprocessor
from rul.preprocessing.target import cap_rul
from rul.preprocessing.windows import WindowSet, short_units, warn_padded


@dataclass
class PreparedData:
    subset: CMAPSSSubset
    preprocessor: Preprocessor
    train_units: np.ndarray
    val_units: np.ndarray
    train: WindowSet
    val: WindowSet
    test: WindowSet  # last window of each test unit, target = capped true RUL
    test_units: np.ndarray
    odd: dict = field(default_factory=dict)  # odd inputs of the training file, by kind


class OddInputWarning(UserWarning):
    """The training file holds odd inputs (rul.preprocessing.odd_inputs): named, trained on."""


def check_odd_inputs(config, subset: CMAPSSSubset, preprocessor: Preprocessor) -> dict:
    """The odd inputs of the training file's engines, judged against each other (they are the
    fleet): one warning per kind, naming the units, or with `strict_data` one DataError naming
    the file (sensors the model does not read only warn)."""
    rows, test = subset.train, subset.test
    labels = preprocessor.conditions(rows[SETTING_COLUMNS].to_numpy())
    read = list(preprocessor.feature_columns_)
    found = find_odd(rows, labels, read)
    in_test = varying_in_test(rows, labels, test,
                              preprocessor.conditions(test[SETTING_COLUMNS].to_numpy()), read)
    if in_test:
        found["varying_in_test"] = in_test
    refused = [key for key in found if key not in ("varying_unread", "varying_in_test")]
    if config.strict_data and refused:
        said = "; ".join(describe(key, found[key]).removeprefix("training data: ")
                         for key in refused)
        raise DataError(subset.files.get("train", subset.name),
                        f"{said} (strict_data=true refuses them; without it they are named "
                        "and trained on)")
    for key, items in found.items():
        warnings.warn(OddInputWarning(describe(key, items)), stacklevel=3)
    return found


def preprocessor_for(config) -> Preprocessor:
    return Preprocessor(
        features=config.features, include_settings=config.include_settings,
        include_cycle=config.include_cycle,
        drop_constant=config.drop_constant, normalization=config.normalization,
        n_conditions=config.n_conditions, smoothing_alpha=config.smoothing_alpha,
        window=config.window, rul_cap=config.rul_cap,
    )


def prepare_data(config, split_seed: int, subset: CMAPSSSubset | None = None
                 ) -> PreparedData:
    """Load, split by unit (`split_seed`'s permutation: the run's Seeds.split), fit
    the preprocessing on training units only, cut windows. ConfigError when the window leaves
    a split without a single window."""
    subset = subset or load_subset(config.subset, config.data_dir, limit=config.data_limit)
    train_units, val_units = split_units(subset.train["unit"], config.val_fraction, split_seed)
    train_rows = training_rows(config, subset, train_units, split_seed)
    preprocessor = preprocessor_for(config).fit(train_rows)
    odd = check_odd_inputs(config, subset, preprocessor)
    return _windows(config, subset, preprocessor, train_rows, val_units, odd=odd)


def training_rows(config, subset: CMAPSSSubset, units: np.ndarray, split_seed: int):
    """The training engines' rows: as recorded, or with `config.late_start_max` each engine's
    record starting a random 0..late_start_max cycles late, renumbered from 1 (the draws
    seeded by `split_seed`, one per engine; never so late that no full window is left)."""
    rows = rows_of(subset.train, units)
    if config.late_start_max == 0:
        return rows
    drawn = late_starts(units, config.late_start_max, split_seed)
    lengths = rows.groupby("unit").size()
    return start_late(rows, {u: max(0, min(k, int(lengths[u]) - config.window))
                             for u, k in drawn.items()})[0]


def prepare_folds(config, split_seed: int, subset: CMAPSSSubset | None = None
                  ) -> list[PreparedData]:
    """The data of each member of a cross-fitted ensemble (ensemble_split: folds): the
    training units in config.ensemble folds (`split_seed`'s permutation); member i validates
    on fold i and trains on the others. The preprocessing is fitted once on every training unit
    (the ensemble's training data; the test units never) and shared, so the members read the
    same scaled rows and the same test windows, and the model stores one preprocessor.
    Raises ConfigError like prepare_data."""
    subset = subset or load_subset(config.subset, config.data_dir, limit=config.data_limit)
    units = np.unique(subset.train["unit"])
    try:
        folds = fold_units(units, config.ensemble, split_seed)
    except ValueError as error:
        raise ConfigError(f"ensemble={config.ensemble}: {error} (the training units of "
                          f"{subset.name})") from None
    preprocessor = preprocessor_for(config).fit(rows_of(subset.train, units))
    odd = check_odd_inputs(config, subset, preprocessor)
    test = _test_windows(config, subset, preprocessor)
    return [_windows(config, subset, preprocessor,
                     training_rows(config, subset, np.setdiff1d(units, fold), split_seed), fold,
                     test, odd)
            for fold in folds]


def prepare_members(config, split_seed: int, subset: CMAPSSSubset | None = None
                    ) -> list[PreparedData]:
    """Each ensemble member's data: one shared object (ensemble_split: shared) or its fold."""
    if config.ensemble_split == "folds":
        return prepare_folds(config, split_seed, subset)
    return [prepare_data(config, split_seed, subset)] * config.ensemble


def _windows(config, subset: CMAPSSSubset, preprocessor: Preprocessor, train_rows,
             val_units: np.ndarray, test: tuple[np.ndarray, WindowSet] | None = None,
             odd: dict | None = None) -> PreparedData:
    train_units = np.unique(train_rows["unit"])
    val_rows = rows_of(subset.train, val_units)
    train, val = preprocessor.window_set(train_rows), preprocessor.window_set(val_rows)
    for split, windows, rows in (("training", train, train_rows), ("validation", val, val_rows)):
        if len(windows) == 0:
            longest = int(rows.groupby("unit").size().max())
            raise ConfigError(
                f"window={config.window}: longer than every {split} unit of {subset.name} "
                f"(the longest has {longest} cycles), so there is nothing to train on"
            )
    test_units, test_windows = test or _test_windows(config, subset, preprocessor)
    return PreparedData(subset, preprocessor, train_units, val_units, train, val, test_windows,
                        test_units, odd or {})


def _test_windows(config, subset: CMAPSSSubset, preprocessor: Preprocessor
                  ) -> tuple[np.ndarray, WindowSet]:
    """The last window of each test unit, its target the capped true RUL; a unit shorter
    than the window is edge-padded, named in a PaddedUnitWarning and in `padded_units`."""
    test_units, windows = preprocessor.last_windows(subset.test)
    padded = short_units(subset.test["unit"].to_numpy(), config.window)
    warn_padded(padded, config.window)
    n, w, f = windows.shape
    return test_units, WindowSet(windows.reshape(n * w, f), np.arange(n) * w,
                                 cap_rul(subset.test_rul.astype(np.float32), config.rul_cap),
                                 test_units, w, padded_units=padded)

