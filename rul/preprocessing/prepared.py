"""The data one training reads: the subset's files, split by unit, the preprocessing fitted on
the training units only, and the windows of each split.

A window longer than every unit of a split is a ConfigError here, before any run exists.
"""

import sys
import warnings
from dataclasses import dataclass, field

import numpy as np

from rul.data import Dataset, load_dataset
from rul.data.engines import check_sizes, summary
from rul.data.errors import DataError
from rul.data.records import late_starts, start_late
from rul.data.split import fold_units, rows_of, split_units
from rul.errors import ConfigError
from rul.preprocessing.censored import trained_units, training_windows
from rul.preprocessing.choices import DataChoices, choose
from rul.preprocessing.odd_inputs import describe, find_odd, varying_in_test
from rul.preprocessing.pipeline import Preprocessor
from rul.preprocessing.settings import DataSettings
from rul.preprocessing.target import cap_rul
from rul.preprocessing.windows import WindowSet, short_units, warn_padded


@dataclass
class PreparedData:
    subset: Dataset  # the data set (a C-MAPSS subset or one's own)
    preprocessor: Preprocessor
    train_units: np.ndarray
    val_units: np.ndarray
    train: WindowSet
    val: WindowSet
    test: WindowSet  # last window of each test unit, target = capped true RUL
    test_units: np.ndarray
    odd: dict = field(default_factory=dict)  # odd inputs of the training file, by kind
    choices: DataChoices | None = None  # conditions and informative sensors, with reasons


class OddInputWarning(UserWarning):
    """The training file holds odd inputs (rul.preprocessing.odd_inputs): named, trained on."""


def check_odd_inputs(asked: DataSettings, subset: Dataset, preprocessor: Preprocessor
                     ) -> dict:
    """The odd inputs of the training file's engines, judged against each other (they are the
    fleet): one warning per kind, naming the units, or with `strict_data` one DataError naming
    the file (sensors the model does not read only warn)."""
    rows, test, layout = subset.train, subset.test, subset.layout
    settings, sensors = list(layout.settings), list(layout.sensors)
    labels = preprocessor.conditions(rows[settings].to_numpy())
    read = list(preprocessor.feature_columns_)
    found = find_odd(rows, labels, read, sensors)
    in_test = varying_in_test(rows, labels, test, preprocessor.conditions(
        test[settings].to_numpy()), read, sensors)
    if in_test:
        found["varying_in_test"] = in_test
    refused = [key for key in found if key not in ("varying_unread", "varying_in_test")]
    if asked.strict_data and refused:
        said = "; ".join(describe(key, found[key]).removeprefix("training data: ")
                         for key in refused)
        raise DataError(subset.files.get("train", subset.name),
                        f"{said} (strict_data=true refuses them; without it they are named "
                        "and trained on)")
    for key, items in found.items():
        warnings.warn(OddInputWarning(describe(key, items)), stacklevel=3)
    return found


def preprocessor_for(settings: DataSettings, subset: Dataset, choices: DataChoices
                     ) -> Preprocessor:
    """The preprocessing `settings` ask for on `subset`'s columns, with `choices` made."""
    features = (choices.informative if settings.features == "informative"
                else settings.features)
    return Preprocessor(
        features=features, include_settings=settings.include_settings,
        include_cycle=settings.include_cycle,
        drop_constant=settings.drop_constant, normalization=settings.normalization,
        n_conditions=choices.n_conditions, smoothing_alpha=settings.smoothing_alpha,
        window=settings.window, rul_cap=settings.rul_cap,
        settings=list(subset.layout.settings), sensors=list(subset.layout.sensors),
    )


def fitted_preprocessor(settings: DataSettings, subset: Dataset, rows, engines: str = ""
                        ) -> tuple[Preprocessor, DataChoices]:
    """The preprocessing fitted on training `rows`, and the choices it was made with;
    ConfigError for features the data set does not have. A data set of one's own: its
    `engines` line (rul.data.engines) and the choices are printed, once they are made."""
    choices = choose(settings, subset, rows)
    try:
        preprocessor = preprocessor_for(settings, subset, choices).fit(rows)
    except ValueError as error:
        raise ConfigError(f"features={settings.features!r}: {error}") from None
    if settings.own:  # a preset's choices are the preset's: nothing to say
        reads = ", ".join(preprocessor.feature_columns_)
        if engines:
            print(engines, file=sys.stderr)
        print(f"{subset.name}: {choices.n_conditions} operating condition"
              f"{'s' if choices.n_conditions > 1 else ''} ({choices.conditions_reason}); the "
              f"model reads {reads}", file=sys.stderr)
    return preprocessor, choices


def prepare_data(settings: DataSettings, split_seed: int, subset: Dataset | None = None
                 ) -> PreparedData:
    """Load, split by unit (`split_seed`: the run's Seeds.split), fit the preprocessing on
    training units only, cut windows; ConfigError when a split is left without a window."""
    subset = subset or load(settings)
    train_units, val_units = split(settings, subset, split_seed)
    check_sizes(len(val_units), n_test(subset))
    train_rows = training_rows(settings, subset, train_units, split_seed)
    preprocessor, choices = fitted_preprocessor(settings, subset, train_rows,
                                                summary(subset, train_units, val_units))
    odd = check_odd_inputs(settings, subset, preprocessor)
    return _windows(settings, Fitted(subset, preprocessor, odd, choices), train_rows,
                    val_units)


def n_test(subset: Dataset) -> int:
    """How many engines the test set has."""
    return len(np.unique(subset.test["unit"]))


def load(settings: DataSettings) -> Dataset:
    """The data set `settings` train on (rul.data.load_dataset)."""
    return load_dataset(settings.dataset, settings.data_dir, limit=settings.limit)


def split(settings: DataSettings, subset: Dataset, split_seed: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(training units, validation units): the engines that failed split by `split_seed`;
    the engines that have not (censored) all train, never validate."""
    units = subset.train["unit"]
    if subset.censored:
        units = units[~units.isin(subset.censored)]
    train_units, val_units = split_units(units, settings.val_fraction, split_seed)
    return trained_units(train_units, subset.censored, settings.censored_training), val_units


def training_rows(settings: DataSettings, subset: Dataset, units: np.ndarray, split_seed: int):
    """The training engines' rows, each starting a random 0..`late_start_max` cycles late (seeded
    by `split_seed`; a full window always left), renumbered from 1."""
    rows = rows_of(subset.train, units)
    if settings.late_start_max == 0:
        return rows
    drawn = late_starts(units, settings.late_start_max, split_seed)
    lengths = rows.groupby("unit").size()
    return start_late(rows, {u: max(0, min(k, int(lengths[u]) - settings.window))
                             for u, k in drawn.items()})[0]


def prepare_folds(settings: DataSettings, n: int, split_seed: int,
                  subset: Dataset | None = None) -> list[PreparedData]:
    """The data of each member of a cross-fitted ensemble (ensemble_split: folds): the training
    units in `n` folds (`split_seed`'s permutation), member i validating on fold i, with one
    preprocessing fitted on every training unit and shared. ConfigError like prepare_data."""
    subset = subset or load(settings)
    failed = np.setdiff1d(np.unique(subset.train["unit"]), np.asarray(subset.censored, int))
    units = trained_units(failed, subset.censored, settings.censored_training)
    try:
        folds = fold_units(failed, n, split_seed)
    except ValueError as error:
        raise ConfigError(f"ensemble={n}: {error} (the training units of "
                          f"{subset.name})") from None
    check_sizes(min(len(fold) for fold in folds), n_test(subset))
    preprocessor, choices = fitted_preprocessor(settings, subset, rows_of(subset.train, units),
                                                summary(subset, units, folds[0], folds=n))
    odd = check_odd_inputs(settings, subset, preprocessor)
    test = _test_windows(settings, subset, preprocessor)
    fitted = Fitted(subset, preprocessor, odd, choices)
    return [_windows(settings, fitted, training_rows(settings, subset,
                                                     np.setdiff1d(units, fold), split_seed),
                     fold, test)
            for fold in folds]


@dataclass(frozen=True)
class Fitted:
    """A data set and what was fitted and found on its training engines."""

    subset: Dataset
    preprocessor: Preprocessor
    odd: dict
    choices: DataChoices


def _windows(settings: DataSettings, fitted: Fitted, train_rows, val_units: np.ndarray,
             test: tuple[np.ndarray, WindowSet] | None = None) -> PreparedData:
    subset, preprocessor = fitted.subset, fitted.preprocessor
    train_units = np.unique(train_rows["unit"])
    val_rows = rows_of(subset.train, val_units)
    train, val = preprocessor.window_set(train_rows), preprocessor.window_set(val_rows)
    train = training_windows(train, subset.censored, settings.rul_cap,
                             settings.censored_training)
    for split, windows, rows in (("training", train, train_rows), ("validation", val, val_rows)):
        if len(windows) == 0:
            longest = int(rows.groupby("unit").size().max())
            raise ConfigError(
                f"window={settings.window}: longer than every {split} unit of {subset.name} "
                f"(the longest has {longest} cycles), so there is nothing to train on"
            )
    test_units, test_windows = test or _test_windows(settings, subset, preprocessor)
    return PreparedData(subset, preprocessor, train_units, val_units, train, val, test_windows,
                        test_units, fitted.odd or {}, fitted.choices)


def _test_windows(settings: DataSettings, subset: Dataset, preprocessor: Preprocessor
                  ) -> tuple[np.ndarray, WindowSet]:
    """The last window of each test unit, its target the capped true RUL; a unit shorter
    than the window is edge-padded, named in a PaddedUnitWarning and in `padded_units`."""
    test_units, windows = preprocessor.last_windows(subset.test)
    padded = short_units(subset.test["unit"].to_numpy(), settings.window)
    warn_padded(padded, settings.window)
    n, w, f = windows.shape
    return test_units, WindowSet(windows.reshape(n * w, f), np.arange(n) * w,
                                 cap_rul(subset.test_rul.astype(np.float32), settings.rul_cap),
                                 test_units, w, padded_units=padded)

