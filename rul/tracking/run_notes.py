"""What shaped a run's numbers without changing its config, recorded on the active MLflow
run: test units padded to one window, and an effective batch whose last micro-batch is short."""

import mlflow

from rul.tracking.metric_names import logged
from rul.training.batching import micro_batch_split

PADDED_METRIC = "test_units_padded"
PADDED_TAG = "padded_test_units"  # "3 (1 rows), 17 (12 rows)"
SPLIT_TAG = "batch.micro_batches"  # "256 + 244"


def log_run_notes(config, test_windows) -> None:
    padded = test_windows.padded_units
    mlflow.log_metric(logged(PADDED_METRIC), len(padded))
    if padded:
        mlflow.set_tag(PADDED_TAG, ", ".join(f"{u} ({n} rows)" for u, n in padded.items()))
    if config.micro_batch_size == "auto":  # each member resolves (and records) its own
        return
    split = micro_batch_split(config.effective_batch_size, config.micro_batch_size)
    if split is not None:
        mlflow.set_tag(SPLIT_TAG, split)
