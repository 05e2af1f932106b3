"""Which validation windows calibrate the interval, and how much each weighs: truncation
points drawn as NASA's test units end.

A served prediction reads a record cut off before failure. NASA's FD001 test units end at a
life fraction t / (t + RUL) (t the cycles recorded) spread about evenly between 0.2 and 0.97
(the 100 units: 0.21 to 0.97, mean 0.63, a tenth of them in each tenth from 0.3 on), so their
true RUL runs from 7 to 145 cycles. The validation engines run to failure, and each of their
full windows is one truncation point: cycle t, with the RUL L - t of an engine that fails
after cycle L. Calibrating on every window weighs each engine by its length and most of the
windows sit at the RUL cap; the test weighs every unit once, anywhere in its life.

So each validation engine gets DRAWS truncation points drawn from that law (life fraction
uniform in LIFE_FRACTION, t = round(fraction x L), at least the window: the first cycle a full
window ends), from a generator seeded by the run's split seed, and each draw weighs
1 / (DRAWS x engines): every engine counts once, as a test unit does. A window drawn k times
weighs k draws; one never drawn weighs nothing. Training may draw its windows by the same law
(train_sampling: truncation), from many more draws per engine.
"""

import numpy as np

LIFE_FRACTION = (0.2, 0.97)  # where NASA's FD001 test records end, as a share of the life
DRAWS = 200  # truncation points per validation engine
# per training engine (train_sampling: truncation): enough that each window's weight is its
# probability under the law to about 1 %, drawn once per run (about 0.02 s for FD001)
TRAINING_DRAWS = 10_000


def truncation_points(window_units, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(t, life) of each window: the cycle its last row records and its engine's life (the
    last cycle before failure). `window_units` are the units of every full window of
    run-to-failure engines, each engine's windows in order (a WindowSet's `units`)."""
    units = np.asarray(window_units)
    boundaries = np.flatnonzero(np.r_[True, units[1:] != units[:-1]])
    counts = np.diff(np.r_[boundaries, len(units)])
    position = np.arange(len(units)) - np.repeat(boundaries, counts)
    return window + position, np.repeat(window + counts - 1, counts)


def window_weights(how: str, window_units, window: int, seed: int,
                   draws: int = DRAWS) -> np.ndarray | None:
    """Each window's weight as the config asks (val_weights: in the validation RMSE;
    train_sampling: its probability in an epoch's draw, with TRAINING_DRAWS): None for
    "windows" (each window once), for "truncation" the weights below, `draws` per engine
    drawn with `seed` (the run's split seed), so that each engine counts once, as a test unit
    does."""
    if how == "windows":
        return None
    if how == "truncation":
        return truncation_weights(window_units, window, seed, draws=draws)
    raise ValueError(f"must be windows or truncation, got {how!r}")


def truncation_weights(window_units, window: int, seed: int,
                      fraction: tuple[float, float] = LIFE_FRACTION,
                      draws: int = DRAWS) -> np.ndarray:
    """Each window's weight in the calibration (summing to 1, each engine's to 1 / engines):
    the share of `draws` test-like truncation points per engine that fell on it."""
    units = np.asarray(window_units)
    t, life = truncation_points(units, window)
    starts = np.flatnonzero(np.r_[True, units[1:] != units[:-1]])
    weights = np.zeros(len(units))
    rng = np.random.default_rng(seed)
    for start, length in zip(starts, np.diff(np.r_[starts, len(units)])):
        drawn = np.rint(rng.uniform(*fraction, size=draws) * life[start]).astype(np.int64)
        index = np.clip(drawn, window, life[start]) - window  # position among its windows
        weights[start:start + length] = np.bincount(index, minlength=length)[:length]
    return weights / weights.sum()

