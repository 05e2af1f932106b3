"""How many operating conditions a data set's settings hold (`data.conditions: auto`), decided
on the training rows by one stated rule.

Settings that barely move (each one's spread under STEADY of its magnitude, as FD001's and
FD003's) are one condition. Otherwise KMeans is fitted for 2..MOST clusters on the settings
(each scaled by its spread) and the count is the smallest that leaves under WITHIN of the
settings' variance inside the clusters: discrete operating points (FD002's and FD004's six)
are found exactly. Settings that vary continuously reach no such count: one condition, scaled
globally (the reason says so).
"""

import numpy as np
from sklearn.cluster import KMeans

STEADY = 0.01  # a setting's standard deviation, relative to its magnitude (at least 1)
WITHIN = 0.001  # the share of the settings' variance left inside the clusters
MOST = 10  # the most conditions looked for


def count_conditions(settings: np.ndarray, seed: int = 0) -> tuple[int, str]:
    """(the number of operating conditions of the rows' `settings`, why)."""
    settings = np.asarray(settings, dtype=np.float64)
    if settings.shape[1] == 0:
        return 1, "no setting columns: one condition"
    spread = settings.std(axis=0)
    relative = spread / np.maximum(1.0, np.abs(settings.mean(axis=0)))
    if (relative < STEADY).all():
        return 1, f"the settings hardly vary (under {STEADY:g} of their magnitude): one condition"
    scaled = (settings - settings.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    total = float((scaled**2).sum())
    distinct = len(np.unique(np.round(scaled, 6), axis=0))
    for k in range(2, min(MOST, distinct) + 1):
        kmeans = KMeans(n_clusters=k, n_init=10, random_state=seed).fit(scaled)
        if kmeans.inertia_ < WITHIN * total:
            return k, (f"{k} clusters of the settings leave {kmeans.inertia_ / total:.2g} of "
                       f"their variance within (under {WITHIN:g})")
    return 1, (f"the settings vary continuously (no {MOST} or fewer clusters leave under "
               f"{WITHIN:g} of their variance within): one condition, scaled globally")
