"""What shapes a run's numbers without being in its config is said and recorded: a test unit
shorter than the window padded into the test metrics, an effective batch trained with a short
last micro-batch; and the hint after training names the store that was used."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.cli import browse_hint
from rul.preprocessing.windows import PaddedUnitWarning
from rul.tracking.metric_names import logged
from rul.training.batching import micro_batch_split, split_note
from rul.workflows.train import train_tracked

TRAIN_LENGTHS = (52, 60, 35, 47, 41, 55, 49, 58, 44, 50)
TINY = {"epochs": 1, "window": 20, "filters": 4, "num_layers": 2, "hidden_size": 8,
        "register": False, "interval_coverage": None}


@pytest.fixture
def short_test_unit(write_cmapss, mlflow_store):
    """Synthetic files whose test unit 2 has a single row."""
    data_dir = write_cmapss(train_lengths=TRAIN_LENGTHS, test_lengths=(31, 1, 22, 38))
    return lambda **changes: cfg.load(None, {**TINY, "data_dir": str(data_dir),
                                             "tracking_uri": mlflow_store.uri,
                                             "checkpoint_dir": str(mlflow_store.root / "ck"),
                                             **changes})


def test_a_padded_test_unit_and_a_short_last_micro_batch_are_said_and_recorded(
        short_test_unit, capsys):
    config = short_test_unit(effective_batch_size=100, micro_batch_size=64,
                             accumulation_steps=2)
    with pytest.warns(PaddedUnitWarning) as caught:
        outcome, run_id = train_tracked(config, progress=False)
    (warning,) = [w for w in caught if w.category is PaddedUnitWarning]
    assert str(warning.message) == (
        "padded 1 test unit(s) shorter than the window (20 cycles) to one window by repeating "
        "their first row: unit 2 (1 rows); their predictions count in the test metrics")
    assert capsys.readouterr().err.splitlines().count(
        "effective_batch_size=100 trains as micro-batches of 64 + 36 (the last one short); "
        "each step weights its samples exactly, so the model is that of B=100") == 1
    run = MlflowClient(config.tracking_uri).get_run(run_id)
    assert run.data.tags["padded_test_units"] == "2 (1 rows)"
    assert run.data.metrics[logged("test_units_padded")] == 1
    assert run.data.tags["batch.micro_batches"] == "64 + 36"
    assert outcome.predictions["unit"].tolist() == [1, 2, 3, 4]  # in the metrics


def test_a_run_without_either_records_zero_and_no_tags(mlflow_store):
    import mlflow
    import numpy as np

    from rul.preprocessing.windows import WindowSet
    from rul.tracking.run_notes import log_run_notes

    test = WindowSet(np.zeros((4, 2), np.float32), np.arange(2), np.zeros(2, np.float32),
                     np.arange(2), 2)
    with mlflow.start_run() as run:
        log_run_notes(cfg.TrainConfig(), test)  # 256 x 2 = 512: no short micro-batch
    run = MlflowClient().get_run(run.info.run_id)
    assert run.data.metrics == {"verdict/test/units_padded": 0}
    assert not {"padded_test_units", "batch.micro_batches"} & set(run.data.tags)


@pytest.mark.parametrize(("b", "micro", "split"), [
    (500, 256, "256 + 244"), (512, 256, None), (500, 8, "62 x 8 + 4"), (100, 100, None),
    (100, 64, "64 + 36"), (7, 2, "3 x 2 + 1")])
def test_the_micro_batches_of_an_effective_batch(b, micro, split):
    assert micro_batch_split(b, micro) == split
    assert (split_note(b, micro) is None) == (split is None)


# ---------------------------------------------------------------- the browse hint

PAGE = "/#/experiments/3?workflowType=machine_learning"


def test_the_hint_names_make_ui_for_the_default_store_beside_the_makefile(tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUL_UI_PORT", "5111")
    (tmp_path / "Makefile").write_text("ui: x\n\tmlflow ui\n")
    hint = browse_hint("sqlite:///mlflow.db", "3")
    assert hint.startswith("make ui UI_PORT=5111 (or: ")
    assert f"ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db --port 5111), " in hint
    assert hint.endswith(f"then http://127.0.0.1:5111{PAGE}")


def test_the_hint_names_the_store_used_when_it_is_another(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RUL_UI_PORT", raising=False)
    (tmp_path / "Makefile").write_text("ui: x\n\tmlflow ui\n")
    other = "sqlite:////data/runs/my store.db"
    hint = browse_hint(other, "3")
    assert hint.startswith("make ui STORE='sqlite:////data/runs/my store.db' UI_PORT=5000 (or: ")
    assert "ui --backend-store-uri 'sqlite:////data/runs/my store.db' --port 5000), " in hint
    relative = browse_hint("sqlite:///runs/mlflow.db", "3")  # from the working directory
    assert relative.startswith(f"make ui STORE=sqlite:///{tmp_path}/runs/mlflow.db UI_PORT=")
    assert browse_hint("postgresql://u@db/mlflow", "3").startswith(
        "make ui STORE=postgresql://u@db/mlflow UI_PORT=5000")


def test_without_a_makefile_here_the_hint_is_the_mlflow_command_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RUL_UI_PORT", raising=False)
    hint = browse_hint("sqlite:///mlflow.db", "3")
    assert "make ui" not in hint
    assert hint.endswith(f"ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db --port 5000, "
                         f"then http://127.0.0.1:5000{PAGE}")
    assert Path(hint.split(" ui ")[0]).name == "mlflow"


def test_a_tracking_server_is_its_own_address():
    assert browse_hint("http://tracking:5000/", "3") == f"http://tracking:5000{PAGE}"
