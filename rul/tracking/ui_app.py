"""The app `make ui` and `make server` serve: MLflow's own (mlflow.server.fastapi_app), its
page telling a browser where to start the first time it opens the UI.

MLflow 3's UI keeps a few choices per browser (localStorage), with defaults made for GenAI
work: the GenAI view rather than Model training (the sidebar's switch; an experiment's
`mlflow.experimentKind` tag does not decide it), the Assistant's panel opened on the first
visit, a "Detect Issues" popover over the traces, a notice that usage data is collected
(left out only where this server sends none). The page MLflow serves (index.html) gets one
script that sets rul's defaults for those keys (BROWSER_DEFAULTS), each only where the browser
holds no value of its own: a browser opens on the training runs, the Assistant closed and no
popover, each experiment's runs table with the validation and test RMSE among its columns
(RUNS_TABLE, set the first time the UI reads an experiment's state), and what its user
chooses afterwards (the switch, the Assistant's button, the columns) is kept.

Registered for MLflow as the app `rul` (pyproject.toml, entry point group `mlflow.app`):
`mlflow ui --app-name rul` serves it (rul.tracking.ui does).
"""

import json
import warnings

from flask import Response, request

with warnings.catch_warnings():  # MLflow's FastAPI app imports starlette's deprecated WSGI
    warnings.filterwarnings("ignore", message=r"starlette\.middleware\.wsgi is deprecated")
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app  # noqa: F401 (what uvicorn serves)
from mlflow.telemetry.utils import is_telemetry_disabled

from rul.tracking.metric_names import logged

# MLflow 3.17's keys (its useLocalStorage stores `<key>_v<version>`, the value as JSON).
BROWSER_DEFAULTS = {
    "mlflow.workflowType_v1": "machine_learning",  # the Model training view
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,  # no Assistant opened unasked
    "mlflow.assistant.panelOpen_v1": False,
    "mlflow.detectIssues.guidanceShown_v1": True,  # no "Detect Issues" popover
}
if is_telemetry_disabled():  # the server sends no usage data (rul.tracking.ui's default)
    BROWSER_DEFAULTS["mlflow.telemetry.info.alert.dismissed_v1"] = True  # no notice saying so
# An experiment's runs table keeps its state per experiment (MLflow's storage helper:
# `MLflowLocalStorage-1.1-ExperimentPage-["<id>", ...]-ReactComponentState`, plain JSON merged
# over its defaults): where a browser holds none, the table shows MLflow's default columns and
# the validation and test RMSE.
RUNS_TABLE_KEY = r"^MLflowLocalStorage-1\.1-ExperimentPage-\[.*\]-ReactComponentState$"
RUNS_TABLE = {"selectedColumns": [
    *(f"attributes.`{name}`" for name in ("Source", "Models", "Dataset")),  # MLflow's own
    *(f"metrics.`{logged(name)}`" for name in ("val_rmse", "test_rmse"))]}
SCRIPT = ("<script>(function(d,p,t){for(var k in d){try{if(localStorage.getItem(k)===null)"
          "localStorage.setItem(k,JSON.stringify(d[k]))}catch(e){}}"
          "try{var g=Storage.prototype.getItem;Storage.prototype.getItem=function(k){"
          "var v=g.call(this,k);if(v===null&&this===localStorage&&p.test(k)){"
          "v=JSON.stringify(t);try{this.setItem(k,v)}catch(e){}}return v}}catch(e){}})("
          + json.dumps(BROWSER_DEFAULTS) + ",new RegExp(" + json.dumps(RUNS_TABLE_KEY) + "),"
          + json.dumps(RUNS_TABLE) + ")</script>")


@flask_app.after_request
def with_browser_defaults(response: Response) -> Response:
    """The UI's page (index.html, served for `/`) with SCRIPT first in its head, before the
    UI's own scripts read the keys; every other response as it is."""
    if request.method != "GET" or response.mimetype != "text/html" or response.status_code != 200:
        return response
    response.direct_passthrough = False  # send_from_directory streams the file
    page = response.get_data(as_text=True)
    if "<head>" in page and SCRIPT not in page:
        response.set_data(page.replace("<head>", "<head>" + SCRIPT, 1))
    return response
