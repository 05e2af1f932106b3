"""The MLflow UI, checked in a real browser: headless Debian Chromium driven by playwright.

One tiny tracked training makes a store; `make ui`'s command (python -m rul.tracking.ui, around
`mlflow ui`) serves it on a free 127.0.0.1 port and is stopped as Ctrl-C stops it, with every
process it started. The test reads what it expects (run name, metrics, registered version)
from MLflow itself, then checks that the browser shows it: the experiment's runs table, the
run page's metrics and registered model, the model metrics tab opening on the training curves,
the model page's `champion` alias and description. Nothing is downloaded: Chromium comes from
apt (.ci/run installs it), playwright only drives it.

The browser starts from a fresh profile, as a new user's does, and opens the address `make ui`
printed: MLflow 3.17's UI keeps its view (GenAI or Model training) per browser, default GenAI,
and opens its Assistant on a first visit; `make ui` serves it with the Model training view and
the Assistant closed as a new browser's defaults (rul.tracking.ui_app). The test asserts that
view from the page itself, also after clicking through to the run (whose address no longer
names the view), without touching the sidebar's switch.

With RUL_SCREENSHOTS=<folder> (`make screenshots`) the test also saves the pictures of the docs
there: the runs view (mlflow_runs.png) and a run's charts (mlflow_run_charts.png), of the
default recipe (`make train`'s run name, network and epochs), so that the pictures show what a
user's first run shows.
"""

import os
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.serving.predictor import REQUEST_PARAMS
from rul.tracking.registry import CHAMPION, registered_model_name
from rul.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from rul.workflows.train import train_tracked

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
CONFIG_PATH = Path(__file__).resolve().parents[1] / "experiments" / "fd001.yaml"
TINY = {"epochs": 2, "filters": 4, "num_layers": 2, "hidden_size": 16,
        "micro_batch_size": 1024, "accumulation_steps": 1, "patience": 5}
PAGE_S = 90  # a page's data arrives through several REST calls
SCREENSHOTS = os.environ.get("RUL_SCREENSHOTS")  # a folder: save the docs' pictures there
if SCREENSHOTS:  # the default recipe as `make train` trains it: the run a user's first shows
    TINY = {}
PRINTED_S = 120  # `make ui` prints the experiments' addresses once it answers
# What only the GenAI view shows (its sidebar and overview), and the Assistant's open panel.
GENAI_ONLY = ("Training runs", "Observability", "Evaluation runs", "Judges", "Token Usage")
ASSISTANT_PANEL = "Ask questions about your experiments, traces, evaluations, and more."
TRAIN_CHARTS = ["grad_norm", "loss", "loss_epoch", "lr"]  # the train/ section's, in order


def _missing(reason: str):
    """Skip when the browser is absent; on CI (CI=true) that is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.is_file():
        _missing(f"{CHROMIUM} not found: apt-get install chromium chromium-driver (.ci/run does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, real_data_dir, mlflow_store_at):
    """A store with one tiny tracked (and registered) training."""
    with mlflow_store_at(tmp_path_factory.mktemp("ui")) as store:
        config = cfg.load(CONFIG_PATH, {**TINY, "tracking_uri": store.uri,
                                        "checkpoint_dir": str(store.root / "ckpt"),
                                        "data_dir": str(real_data_dir)})
        _, run_id = train_tracked(config, progress=False)
        store.run = MlflowClient(tracking_uri=store.uri).get_run(run_id)
        store.model_name = registered_model_name(config.subset)
        store.run_experiment = config.experiment_name
        yield store


def _lines(page) -> list[str]:
    """The page's visible text, one entry per line (non-breaking spaces as spaces)."""
    text = page.inner_text("body").replace("\xa0", " ")
    return [line.strip() for line in text.splitlines() if line.strip()]


def _lines_when(page, ready) -> list[str]:
    """The page's lines once `ready(lines)` holds (a table's cells arrive by separate REST
    calls), or as they are after PAGE_S seconds: the caller's assertions say what is missing."""
    deadline = time.monotonic() + PAGE_S
    lines = _lines(page)
    while not ready(lines) and time.monotonic() < deadline:
        time.sleep(0.5)
        lines = _lines(page)
    return lines


def _value_after(lines: list[str], label: str) -> str:
    return lines[lines.index(label) + 1]


def _adjacent(lines: list[str], first: str, second: str) -> bool:
    return any(a == first and b == second for a, b in zip(lines, lines[1:]))


def _version_row(lines: list[str], version: str) -> list[str]:
    """The model page's lines from `Version <version>` to the next version's row."""
    start = lines.index(f"Version {version}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("Version ")),
               len(lines))
    return lines[start:end]


def _printed_page(log: Path, experiment: str) -> str:
    """The address `make ui` printed for `experiment` once it answered."""
    deadline = time.monotonic() + PRINTED_S
    prefix = f"experiment {experiment}: "
    while time.monotonic() < deadline:
        found = [line.removeprefix(prefix) for line in log.read_text().splitlines()
                 if line.startswith(prefix)]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"make ui printed no address for {experiment}: "
                         f"{log.read_text()[-1500:]}")


def _in_model_training_view(lines: list[str]) -> None:
    """The page shows the Model training view (its sidebar: Runs, Models), nothing of the
    GenAI view, and the Assistant's panel closed."""
    assert "Model training" in lines and "Runs" in lines and "Models" in lines, lines[:20]
    shown = [line for line in GENAI_ONLY if line in lines]
    assert shown == [], shown
    assert not any("Detect Issues" in line for line in lines)  # GenAI's popover
    assert ASSISTANT_PANEL not in lines


def _save_screenshot(page, name: str) -> None:
    """The page as the docs show it, into RUL_SCREENSHOTS (as a new browser sees it)."""
    page.set_viewport_size({"width": 1400, "height": 700})
    page.wait_for_timeout(1000)
    page.screenshot(path=str(Path(SCREENSHOTS) / name))
    page.set_viewport_size({"width": 1600, "height": 1000})


def _save_run_charts(page, run_url: str) -> None:
    """The run's model-metrics tab with the charts of the training step and validation."""
    page.goto(f"{run_url}/model-metrics")
    search = page.get_by_placeholder("Search metric charts")
    search.fill("^(train/loss|train/grad_norm|val/rmse)$")
    page.get_by_text("grad_norm", exact=True).first.wait_for()
    page.wait_for_timeout(5000)  # the charts render after their data arrives
    _save_screenshot(page, "mlflow_run_charts.png")
    search.fill("")  # the UI keeps the filter for the run: the checks below see every chart
    page.wait_for_timeout(1000)


def test_the_ui_shows_runs_metrics_and_the_champion(tracked, browser, mlflow_ui, tmp_path):
    run = tracked.run
    run_name, run_id, experiment_id = run.info.run_name, run.info.run_id, run.info.experiment_id
    client = MlflowClient(tracking_uri=tracked.uri)
    assert client.get_experiment(experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    version = run.data.tags["registered_version"]
    assert str(client.get_model_version_by_alias(tracked.model_name, CHAMPION).version) == version

    def version_shown(lines: list[str]) -> bool:  # the registered model's name, then v<version>
        return _adjacent(lines, tracked.model_name, f"v{version}")

    started = []
    with mlflow_ui(tracked, started) as base:
        printed = _printed_page(tracked.root / "ui.log", tracked.run_experiment)
        assert printed == f"{base}/#/experiments/{experiment_id}?workflowType=machine_learning"
        context = browser.new_context(viewport={"width": 1600, "height": 1000})  # a fresh
        page = context.new_page()  # profile: nothing kept from an earlier visit
        page.set_default_timeout(PAGE_S * 1000)
        try:
            # the UI's home as a new browser first sees it: Model training, no Assistant
            page.goto(f"{base}/")
            page.get_by_text("Model training", exact=True).first.wait_for()
            page.wait_for_timeout(3000)  # the Assistant opened itself by now, were it to
            assert ASSISTANT_PANEL not in _lines(page)

            # the address make ui printed: the experiment's runs table
            page.goto(printed)
            page.get_by_text(run_name, exact=True).first.wait_for()
            page.wait_for_url(f"**/experiments/{experiment_id}/runs**")
            lines = _lines_when(page, version_shown)
            assert "Run Name" in lines  # the runs table's header ...
            assert run_name in lines  # ... our run and its registered version
            assert version_shown(lines)
            for metric in ("val/rmse", "verdict/test/rmse"):  # columns a new browser shows
                assert metric in lines, (metric, lines)
            _in_model_training_view(lines)
            page.screenshot(path=str(tmp_path / "experiment.png"))
            if SCREENSHOTS:
                _save_screenshot(page, "mlflow_runs.png")

            # the run page, as a user gets there (a click: its address names no view): its
            # name, the training metrics, the registered model, still in Model training
            page.get_by_text(run_name, exact=True).first.click()
            page.wait_for_url(f"**/experiments/{experiment_id}/runs/{run_id}**")
            assert "workflowType" not in page.url
            page.get_by_text("val/rmse", exact=True).first.wait_for()
            page.get_by_text("Registered models", exact=True).first.wait_for()
            lines = _lines_when(page, version_shown)
            assert run_name in lines
            _in_model_training_view(lines)
            # its description: the batch as trained and the seeds, beside the metrics
            assert any("effective batch" in line and "micro-batch" in line for line in lines)
            for metric in ("train/loss", "train/grad_norm", "val/rmse"):
                assert metric in lines, metric
                shown = float(_value_after(lines, metric))  # the latest value, as stored
                assert shown == pytest.approx(run.data.metrics[metric], rel=1e-9), metric
            assert version_shown(lines)  # registered models
            page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
            if SCREENSHOTS:
                _save_run_charts(page, f"{base}/#/experiments/{experiment_id}/runs/{run_id}")

            # the model metrics tab of a finished run: its curves, then its results, each a
            # section of its own (no single numbers as dots in an unnamed one)
            page.goto(f"{base}/#/experiments/{experiment_id}/runs/{run_id}/model-metrics")
            page.get_by_text("verdict/test", exact=True).first.wait_for()
            page.get_by_text("grad_norm", exact=True).first.wait_for()  # the first charts
            lines = _lines(page)
            counted = {line: count for line, count in zip(lines, lines[1:])
                       if count.startswith("(") and count.endswith(")")}
            assert list(counted)[:4] == ["train", "val", "verdict/interval", "verdict/test"], \
                counted
            for section in ("train", "val", "verdict/interval", "verdict/test"):  # all of each
                group = [m for m in run.data.metrics if m.rsplit("/", 1)[0] == section]
                assert counted[section] == f"({len(group)})", (section, group)
            assert not any(m.startswith(("test_", "best_", "interval_", "test/", "interval/"))
                           for m in run.data.metrics)
            charts = [line for line in lines if line in TRAIN_CHARTS]
            assert charts[:4] == TRAIN_CHARTS, charts
            # the loss curve drawn above the results' sections, none of their charts before it
            assert lines.index("loss") < lines.index("verdict/interval")
            assert "system/samples_per_s" not in lines  # in the System metrics tab
            page.screenshot(path=str(tmp_path / "model_metrics.png"))

            # the registered model: the description and the champion alias on our version
            page.goto(f"{base}/#/models/{tracked.model_name}")
            page.get_by_text(f"Version {version}", exact=True).wait_for()
            page.get_by_text(f"@ {CHAMPION}").first.wait_for()
            lines = _lines(page)
            assert f"@ {CHAMPION}" in _version_row(lines, version)
            assert any(line.startswith("Remaining useful life") for line in lines)
            for column in ("unit", "rul", "rul_lower", "rul_upper", "padded", "flagged",
                           "flag_reason"):  # every output column described
                assert any(line.startswith(f"{column} (") for line in lines), column
            for param in REQUEST_PARAMS:  # and every request parameter
                assert any(line.startswith(f"{param.name} ({param.type}") for line in lines)
            page.screenshot(path=str(tmp_path / "model.png"), full_page=True)
        finally:
            context.close()
    assert not any("huey" in command for _, command in started)  # no job consumers
    assert len(started) <= 2, started  # `mlflow ui` and its one web worker
