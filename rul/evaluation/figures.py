"""Figures logged with every run, drawn from values in memory (matplotlib's Figure API: no
pyplot, no global backend)."""

import numpy as np
from matplotlib.figure import Figure


def learning_curves(history: list[dict]) -> Figure:
    fig = Figure(figsize=(10, 3.5), layout="tight")
    ax = fig.subplots(1, 2)
    epochs = np.arange(1, len(history) + 1)
    ax[0].plot(epochs, [h["train_loss_epoch"] for h in history])
    ax[0].set(xlabel="epoch", ylabel="train loss (MSE of RUL/cap)", yscale="log")
    ax[1].plot(epochs, [h["val_rmse"] for h in history])
    ax[1].set(xlabel="epoch", ylabel="validation RMSE (cycles)")
    return fig


def predicted_vs_true(predictions) -> Figure:
    """Test units' predictions against the capped truth; with an interval (columns
    predicted_rul_lower/upper), each prediction's bounds as an error bar, red when they miss."""
    fig = Figure(figsize=(5, 5), layout="tight")
    ax = fig.subplots()
    true, predicted = predictions["true_rul_capped"], predictions["predicted_rul"]
    top = max(true.max(), predicted.max())
    title = "test units"
    if "predicted_rul_lower" in predictions:
        lower, upper = predictions["predicted_rul_lower"], predictions["predicted_rul_upper"]
        inside = ((lower <= true) & (true <= upper)).to_numpy()
        for mask, color, label in ((inside, "C0", "interval covers"),
                                   (~inside, "C3", "interval misses")):
            if mask.any():
                ax.errorbar(true[mask], predicted[mask], fmt="o", ms=3, color=color, lw=0.8,
                            yerr=[(predicted - lower)[mask], (upper - predicted)[mask]],
                            alpha=0.6, label=label)
        ax.legend(loc="upper left")
        top = max(top, upper.max())
        title = f"test units: {inside.mean():.0%} inside the interval"
    else:
        ax.scatter(true, predicted, s=12)
    ax.plot([0, top], [0, top], "k--", lw=1)
    ax.set(xlabel="true RUL (capped)", ylabel="predicted RUL", title=title)
    return fig


def error_histogram(predictions) -> Figure:
    fig = Figure(figsize=(5, 3.5), layout="tight")
    ax = fig.subplots()
    error = predictions["predicted_rul"] - predictions["true_rul_capped"]
    ax.hist(error, bins=30)
    ax.set(xlabel="predicted - true RUL (cycles)", ylabel="test units")
    return fig


def grad_norm_trace(grad_norms: list[float], max_grad_norm) -> Figure:
    fig = Figure(figsize=(7, 3), layout="tight")
    ax = fig.subplots()
    ax.plot(np.arange(1, len(grad_norms) + 1), grad_norms, lw=0.6)
    if max_grad_norm:
        ax.axhline(max_grad_norm, color="r", ls="--", lw=1, label="clip")
        ax.legend()
    ax.set(xlabel="optimizer step", ylabel="grad norm (unscaled)", yscale="log")
    return fig


def member_val_curves(members: list, split: str = "shared") -> Figure:
    """Each ensemble member's validation RMSE per epoch (on the shared validation units, or
    each on its own fold)."""
    fig = Figure(figsize=(6, 3.5), layout="tight")
    ax = fig.subplots()
    for m in members:
        values = [h["val_rmse"] for h in m.state.history]
        ax.plot(np.arange(1, len(values) + 1), values, label=f"seed {m.plan.seeds.seed}")
    title = "ensemble members" + (", each on its own fold" if split == "folds" else "")
    ax.set(xlabel="epoch", ylabel="validation RMSE (cycles)", title=title)
    ax.legend(fontsize="small")
    return fig
