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
    fig = Figure(figsize=(5, 5), layout="tight")
    ax = fig.subplots()
    true = predictions["true_rul_capped"]
    ax.scatter(true, predictions["predicted_rul"], s=12)
    top = max(true.max(), predictions["predicted_rul"].max())
    ax.plot([0, top], [0, top], "k--", lw=1)
    ax.set(xlabel="true RUL (capped)", ylabel="predicted RUL", title="test units")
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
