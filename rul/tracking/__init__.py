"""MLflow and nothing else: what a run logs (run_logging, model_logging, mlflow_listener,
run_notes, parent_run), how a run ends (lifecycle), the store (store), the registry
(registry), run checkpoints (run_checkpoints), names (run_names, metric_names), logged models
read back (logged_models), the UI (ui). The workflows that train plans inside runs are
rul.workflows.

Models logged by early versions of rul pickled their pyfunc class as
rul.tracking.pyfunc_model.RULModel: that name still resolves, to rul.serving.pyfunc_model.
"""

import sys

from rul.serving import pyfunc_model as _pyfunc_model

sys.modules.setdefault("rul.tracking.pyfunc_model", _pyfunc_model)
