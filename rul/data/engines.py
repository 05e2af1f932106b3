"""What a training says of its engines: how many failed and how they split (train, validate,
held out for test), how many are in service; and where a split is too small to say much.

Below MIN_TEST engines the test figures (RMSE, the interval's coverage), below MIN_VALIDATION
the validation figures, rest on a handful of engines: the training warns in one line, and
every figure from such a split is printed with its count of engines (`counted`).
"""

import warnings

import numpy as np

MIN_TEST = 10  # test engines: fewer, and one engine moves the test RMSE and coverage a lot
MIN_VALIDATION = 5  # validation engines: fewer, and the best epoch and interval rest on few


class SmallSplitWarning(UserWarning):
    """A split has fewer engines than its documented minimum: its figures say little."""


def summary(dataset, train_units, val_units, folds: int = 0) -> str:
    """One line: `fleet: 100 engines: 72 failed (train 57, validate 15), 18 held out for test,
    10 in service` (with a test table: its engines instead of those held out; `(not
    trained)` after the engines in service when none is among `train_units`); `folds`: the
    failed engines take turns to validate, in that many folds."""
    censored = np.asarray(dataset.censored, dtype=np.int64)
    trained = np.setdiff1d(np.asarray(train_units), censored)
    n_val = len(np.setdiff1d(np.asarray(val_units), censored))
    n_failed = len(np.union1d(trained, np.asarray(val_units)))
    split = (f"in {folds} folds, each validating once" if folds else
             f"train {len(trained)}, validate {n_val}")
    failed = f"{n_failed} failed ({split})"
    n_test, n_censored = len(np.unique(dataset.test["unit"])), len(censored)
    untrained = " (not trained)" if n_censored and not np.isin(censored, train_units).any() \
        else ""
    if dataset.held_out:
        return (f"{dataset.name}: {n_failed + n_test + n_censored} engines: {failed}, "
                f"{n_test} held out for test, {n_censored} in service{untrained}")
    return (f"{dataset.name}: {n_failed + n_censored} engines: {failed}, {n_censored} in "
            f"service{untrained}; {n_test} test engines in {dataset.files['test'].name}")


def check_sizes(n_validation: int, n_test: int) -> None:
    """One SmallSplitWarning per split below its minimum."""
    for n, minimum, split, figures in ((n_test, MIN_TEST, "test", "test figures"),
                                       (n_validation, MIN_VALIDATION, "validation",
                                        "validation figures and the interval")):
        if n < minimum:
            warnings.warn(SmallSplitWarning(
                f"{n} {split} engine{'s' if n != 1 else ''}: the {figures} say little "
                f"(fewer than {minimum})"), stacklevel=3)


def counted(n: int, minimum: int) -> str:
    """` from 3 engines` after a figure of a split below its minimum, else nothing."""
    return f" from {n} engine{'s' if n != 1 else ''}" if n < minimum else ""
