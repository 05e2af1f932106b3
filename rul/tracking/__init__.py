"""MLflow and nothing else: tracked runs around plans, parent runs, the registry, the store.

Models logged by early versions of rul pickled their pyfunc class as
rul.tracking.pyfunc_model.RULModel: that name still resolves, to rul.serving.pyfunc_model.
"""

import sys

from rul.serving import pyfunc_model as _pyfunc_model

sys.modules.setdefault("rul.tracking.pyfunc_model", _pyfunc_model)
