"""An ensemble's prediction: its members' mean and their spread (numpy only: the lean served
model reads it too)."""

import numpy as np


def average_members(predictions) -> tuple[np.ndarray, np.ndarray]:
    """An ensemble's prediction per window, the mean over members (axis 0), and the members'
    spread, their population standard deviation (0 for a single network)."""
    predictions = np.asarray(predictions, dtype=np.float64)
    return predictions.mean(axis=0), predictions.std(axis=0)
