"""What a parent MLflow run records: its kind and seeds tags, its children's index tag, and
its params and data tags (the run machinery itself: rul.workflows.parent)."""

import mlflow

from rul.tracking.run_logging import data_tags
from rul.tracking.run_notes import log_run_notes
from rul.tracking.run_params import config_params

KIND_TAG = "rul.kind"  # evaluate | ensemble (single runs have none)
INDEX_TAG = "rul.seed_index"  # a child's place among the parent's children
SEEDS_TAG = "rul.seeds"  # the parent's: its children's seeds, comma-separated


def log_parent_config(config, data, **params) -> None:
    """The parent's params (the config, less unused architecture keys; `params` added) and
    data tags, on the active run, so it compares with single runs in the UI and the registry
    can describe it."""
    mlflow.log_params(config_params(config, effective_batch_size=config.effective_batch_size,
                                    **params))
    mlflow.set_tags(data_tags(data))
    log_run_notes(config, data.test)  # padded test units, a short last micro-batch
