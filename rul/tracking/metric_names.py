"""The MLflow names of rul's metrics, in one place; readers find old names too.

Training computes its metrics under plain names (TrainState.history, outcome.metrics:
`train_loss`, `val_rmse`, ...) and logs each in its group, a section of the MLflow UI:
the curves under `train/` and `val/`, a finished run's single values under `verdict/test/`
and `verdict/interval/` (sorted after the curves), and `system/` (a tab of its own). Only the
per-step diagnostics (clipped, amp_scale, skipped_steps, epoch), micro_batch_size and
accumulation_steps after an out-of-memory back-off, and an ensemble's member_* keep plain
names. Aggregates over seeds (`rul evaluate`) add `_mean` and `_std` (`val/rmse_mean`). Runs
logged before the groups used plain names throughout, and later ones `test/` and `interval/`
for what is now under `verdict/`: `read` accepts any of them (docs: What a run records, Metric
names).
"""

GROUPED = {
    "train_loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/lr",
    "train_loss_epoch": "train/loss_epoch",
    "val_rmse": "val/rmse", "best_val_rmse": "val/best_rmse", "best_epoch": "val/best_epoch",
    "samples_per_s": "system/samples_per_s", "peak_memory_mb": "system/peak_memory_mb",
    "wall_time_s": "system/wall_time_s",
}
PLAIN = {grouped: plain for plain, grouped in GROUPED.items()}
# A finished run's single values (the test figures, the interval's) under one parent whose
# name sorts after train/ and val/: the UI orders its sections alphabetically, so the curves
# come first.
RESULTS = "verdict"
# The rest by prefix, the longest first: (plain name's prefix, its group's)
PREFIXES = (("test_interval_", f"{RESULTS}/interval/test_"),
            ("interval_", f"{RESULTS}/interval/"), ("test_", f"{RESULTS}/test/"))
# ... and the groups runs logged before RESULTS gave them (read, never written)
FORMER = (("test_interval_", "interval/test_"), ("interval_", "interval/"), ("test_", "test/"))
SUFFIXES = ("_mean", "_std")


def _split(name: str) -> tuple[str, str]:
    """(base, aggregate suffix): 'val_rmse_mean' -> ('val_rmse', '_mean'), for the names
    grouped one by one (GROUPED); prefixed names keep their suffix in the name."""
    for suffix in SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and (base in GROUPED or base in PLAIN):
            return base, suffix
    return name, ""


def _renamed(name: str, one_by_one: dict, by_prefix: tuple) -> str:
    base, suffix = _split(name)
    if base in one_by_one:
        return one_by_one[base] + suffix
    for old, new in by_prefix:
        if name.startswith(old):
            return new + name.removeprefix(old)
    return name


def logged(name: str) -> str:
    """The name a metric is logged under (`val_rmse` -> `val/rmse`, `test_interval_width` ->
    `interval/test_width`, `test_rmse_mean` -> `test/rmse_mean`); a name of no group stays."""
    return _renamed(name, GROUPED, PREFIXES)


def plain(name: str) -> str:
    """The name runs logged before the groups used: `val/rmse` -> `val_rmse` (a former group's
    name too: `test/rmse` -> `test_rmse`)."""
    return _renamed(name, PLAIN, tuple((group, prefix) for prefix, group in PREFIXES + FORMER))


def former(name: str) -> str:
    """The name runs logged before RESULTS used: `test_rmse` -> `test/rmse`."""
    return _renamed(plain(name), {}, FORMER)


def logged_metrics(metrics: dict) -> dict[str, float]:
    return {logged(k): float(v) for k, v in metrics.items()}


def read(metrics: dict, name: str, default=None):
    """A run's metric under any of its names, today's, its plain or its former group's (any
    may be asked for)."""
    for key in (logged(name), plain(name), former(name)):
        if key in metrics:
            return metrics[key]
    return default
