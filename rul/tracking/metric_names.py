"""The MLflow names of rul's metrics, in one place; readers find old names too.

Training computes its metrics under plain names (TrainState.history, outcome.metrics:
`train_loss`, `val_rmse`, `test_rmse`, ...). The MLflow UI charts a run's metrics in sections,
one per group (the part of the name before `/`), sections and charts in alphabetical order,
ungrouped metrics last under "Model metrics", and `system/` metrics in a tab of their own. So
that a run opens on its training curves, the curves are logged by group and the rest keeps its
plain name:

    train/   grad_norm, loss, lr (every optimizer step), loss_epoch (every epoch)
    val/     rmse (every epoch; an ensemble's or an evaluation's single value)
    system/  samples_per_s, peak_memory_mb (every epoch), wall_time_s (the System tab)
    (plain)  test_rmse, test_mae, test_score, test_rmse_uncapped, test_interval_*,
             best_val_rmse, best_epoch, interval_*, member_*, and the per-step diagnostics
             clipped, amp_scale, skipped_steps, epoch; micro_batch_size and
             accumulation_steps only after an out-of-memory back-off changed them

(A `test/` group would sort before `train/` and open the tab on single numbers.) Aggregates
over seeds (`rul evaluate`) add `_mean` and `_std` to the logged name (`val/rmse_mean`,
`test_rmse_mean`). Runs logged before the groups used plain names throughout: `read` accepts
either name and finds whichever the run has.
"""

GROUPED = {
    "train_loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/lr",
    "train_loss_epoch": "train/loss_epoch",
    "val_rmse": "val/rmse",
    "samples_per_s": "system/samples_per_s", "peak_memory_mb": "system/peak_memory_mb",
    "wall_time_s": "system/wall_time_s",
}
PLAIN = {grouped: plain for plain, grouped in GROUPED.items()}
SUFFIXES = ("_mean", "_std")


def _split(name: str) -> tuple[str, str]:
    """(base, aggregate suffix): 'test_rmse_mean' -> ('test_rmse', '_mean')."""
    for suffix in SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and (base in GROUPED or base in PLAIN):
            return base, suffix
    return name, ""


def logged(name: str) -> str:
    """The name a metric is logged under: `val_rmse` -> `val/rmse`, `test_rmse_mean` ->
    `test/rmse_mean`; a name without a group stays as it is."""
    base, suffix = _split(name)
    return GROUPED.get(base, base) + suffix


def plain(name: str) -> str:
    """The name runs logged before the groups used: `val/rmse` -> `val_rmse`."""
    base, suffix = _split(name)
    return PLAIN.get(base, base) + suffix


def logged_metrics(metrics: dict) -> dict[str, float]:
    return {logged(k): float(v) for k, v in metrics.items()}


def read(metrics: dict, name: str, default=None):
    """A run's metric under its grouped or its plain name (either may be asked for)."""
    for key in (logged(name), plain(name)):
        if key in metrics:
            return metrics[key]
    return default
