"""Pictures of a logged model on the test engines: predicted against true RUL, and the RUL
trajectory of a few engines (the prediction at every cycle of their record, from the rows up
to it) with the interval band. Drawn through the served model (mlflow.pyfunc), as users get it.
"""

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from rul.evaluation.figures import predicted_vs_true

TRAJECTORY_ENGINES = 3  # the test engines with the longest records


def _spec(model):
    """The loaded pyfunc's inference spec: the lean model's (rul.serving.runtime) or, for a
    model logged before it, the torch pyfunc's own."""
    inner = model.unwrap_python_model()
    return getattr(getattr(inner, "model", None), "spec", None) or inner.spec


def truncations(rows: pd.DataFrame, start: int) -> pd.DataFrame:
    """One pseudo-unit per cycle t >= start of one engine's rows: its rows up to t, unit = t."""
    parts = [rows.iloc[:t].assign(unit=t) for t in range(start, len(rows) + 1)]
    return pd.concat(parts, ignore_index=True)


def trajectories(model, test: pd.DataFrame, test_rul: np.ndarray, window: int, cap: float,
                 engines: int = TRAJECTORY_ENGINES) -> Figure:
    units = test.groupby("unit", sort=False).size().sort_values(ascending=False).index[:engines]
    order = list(test["unit"].drop_duplicates())
    fig = Figure(figsize=(4 * len(units), 3.4), layout="tight")
    axes = np.atleast_1d(fig.subplots(1, len(units), sharey=True))
    for ax, unit in zip(axes, units):
        rows = test[test["unit"] == unit].reset_index(drop=True)
        predicted = model.predict(truncations(rows, window)).set_index("unit")
        cycles = rows["cycle"].to_numpy()[window - 1:]
        final_rul = float(test_rul[order.index(unit)])
        true = np.minimum(cap, final_rul + cycles[-1] - cycles)
        if "rul_lower" in predicted:
            ax.fill_between(cycles, predicted["rul_lower"], predicted["rul_upper"], alpha=0.25,
                            color="C0", lw=0, label="interval")
        ax.plot(cycles, predicted["rul"], color="C0", lw=1.2, label="predicted")
        ax.plot(cycles, true, "k--", lw=1, label=f"true (capped at {cap:.0f})")
        ax.set(title=f"test engine {unit}", xlabel="cycle")
    axes[0].set_ylabel("RUL (cycles)")
    axes[0].legend(loc="lower left", fontsize=8)
    return fig


def draw(model, test: pd.DataFrame, test_rul: np.ndarray, folder: Path) -> list[Path]:
    """predicted_vs_true.png and rul_trajectories.png of `model` (a loaded pyfunc) in folder."""
    spec = _spec(model)
    cap, window = float(spec.rul_cap), int(spec.window)
    last = model.predict(test)
    predictions = pd.DataFrame({"true_rul_capped": np.minimum(cap, test_rul),
                                "predicted_rul": last["rul"].to_numpy()})
    if "rul_lower" in last:
        predictions["predicted_rul_lower"] = last["rul_lower"].to_numpy()
        predictions["predicted_rul_upper"] = last["rul_upper"].to_numpy()
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "predicted_vs_true.png", folder / "rul_trajectories.png"]
    for fig, path in zip((predicted_vs_true(predictions),
                          trajectories(model, test, test_rul, window, cap)), paths):
        fig.savefig(path, dpi=90)
    return paths
