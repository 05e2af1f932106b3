"""Which sensors carry the engine's wear: `features: informative` on a data set that does not
list them (`data.informative: auto`), chosen on the training units by one stated rule.

A sensor is informative when, within each training engine's life, its value trends with the
engine's age: the mean over the training engines of |Spearman's rho| between the sensor and
the cycle is at least TREND (computed on the values scaled per operating condition, so that a
change of condition is no trend). A sensor constant in an engine has no rho there; one
constant in every engine is never chosen. On FD001 the rule chooses the 14 sensors the
literature reads since Li et al. (2018): their mean |rho| is 0.63 to 0.81, s_6's 0.14, the
other six are constant.
"""

import numpy as np
import pandas as pd

TREND = 0.5  # mean |Spearman's rho| of a sensor with the cycle over the training engines


def trend_strength(rows: pd.DataFrame, sensors: list[str], labels: np.ndarray) -> pd.Series:
    """Each sensor's mean over engines of |Spearman's rho| with the cycle (NaN: constant in
    every engine); `labels`: each row's operating condition."""
    values = rows[sensors].astype(np.float64)
    labels = np.asarray(labels)
    for condition in np.unique(labels):  # per condition: a change of condition is no trend
        mine = labels == condition
        part = values.loc[mine]
        values.loc[mine] = (part - part.mean()) / part.std(ddof=0).replace(0.0, 1.0)
    units = rows["unit"].to_numpy()
    ranks = values.groupby(units, sort=False).rank()
    cycles = rows["cycle"].groupby(units, sort=False).rank().to_numpy()
    centred = ranks - ranks.groupby(units, sort=False).transform("mean")
    age = cycles - pd.Series(cycles).groupby(units, sort=False).transform("mean").to_numpy()
    covariance = centred.mul(age, axis=0).groupby(units, sort=False).sum()
    spread = np.sqrt((centred**2).groupby(units, sort=False).sum())
    age_spread = np.sqrt(pd.Series(age**2).groupby(units, sort=False).sum()).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = covariance / spread.mul(age_spread, axis=0)
    return rho.abs().replace([np.inf], np.nan).mean()


def informative_sensors(rows: pd.DataFrame, sensors: list[str], labels: np.ndarray
                        ) -> tuple[list[str], pd.Series]:
    """(the sensors the rule chooses, in the data set's order; every sensor's strength)."""
    strength = trend_strength(rows, sensors, labels)
    return [s for s in sensors if strength[s] >= TREND], strength
