"""Signals end `rul train` and `rul tune` cleanly: real processes, real signals.

The first SIGINT/SIGTERM ends every open MLflow run of the process KILLED, keeps what resume
needs, prints one line and exits 130/143 with no traceback; a second signal during the
clean-up changes nothing.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
SLOW_TINY = ["epochs=40", "patience=40", "filters=4", "num_layers=2", "hidden_size=16",
             "micro_batch_size=512", "accumulation_steps=1"]


def start(args, tmp_path, real_data_dir) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CMAPSS_DIR": str(real_data_dir)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen([sys.executable, "-m", "rul", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_checkpoint(process, directory: Path, timeout: float = 120) -> None:
    """Training is under way once an epoch's checkpoint exists."""
    deadline = time.monotonic() + timeout
    while not list(directory.rglob("*.pt")):
        if process.poll() is not None:
            pytest.fail(f"exited early with {process.returncode}: {process.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, "no checkpoint within the time limit"
        time.sleep(0.2)


def finish(process, timeout: float = 120) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def runs_of(tmp_path) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("rul-fd001")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def train_args(tmp_path, epochs: int = 40):
    return ["train", str(ROOT / "experiments" / "fd001.yaml"), *SLOW_TINY, f"epochs={epochs}",
            f"checkpoint_dir={tmp_path / 'ckpt'}", "--no-progress"]


@pytest.mark.parametrize(("signals", "code", "said"), [
    ((signal.SIGTERM,), 143, "terminated (SIGTERM)"),
    ((signal.SIGINT,), 130, "interrupted"),
    ((signal.SIGTERM, signal.SIGINT, signal.SIGTERM), 143, "terminated (SIGTERM)"),
])
@pytest.mark.slow
def test_train_ends_its_run_killed_on_a_signal(tmp_path, real_data_dir, signals, code, said):
    process = start(train_args(tmp_path), tmp_path, real_data_dir)
    wait_for_checkpoint(process, tmp_path / "ckpt")
    for signum in signals:  # later ones arrive during the clean-up
        os.kill(process.pid, signum)
        time.sleep(0.05)
    returncode, _, err = finish(process)
    assert returncode == code, err[-3000:]
    assert "Traceback" not in err
    assert said in err and "--resume" in err
    (run,) = runs_of(tmp_path)
    assert run.info.status == "KILLED"
    assert (tmp_path / "ckpt" / f"{run.info.run_id}.pt").is_file()  # kept for --resume


@pytest.mark.slow
def test_resume_after_sigterm_finishes_the_same_run(tmp_path, real_data_dir):
    process = start(train_args(tmp_path, epochs=4), tmp_path, real_data_dir)
    wait_for_checkpoint(process, tmp_path / "ckpt")
    os.kill(process.pid, signal.SIGTERM)
    assert finish(process)[0] == 143
    (killed,) = runs_of(tmp_path)
    resumed = start([*train_args(tmp_path, epochs=4), "--resume"], tmp_path, real_data_dir)
    returncode, out, err = finish(resumed, timeout=300)
    assert returncode == 0, err[-3000:]
    assert f"resuming run {killed.info.run_id}" in err
    (run,) = runs_of(tmp_path)
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "signum", "code"), [(1, signal.SIGTERM, 143),
                                                         (2, signal.SIGINT, 130)])
def test_tune_ends_parent_and_trial_runs_killed_on_a_signal(tmp_path, real_data_dir, workers,
                                                            signum, code):
    storage = (f"sqlite:///{tmp_path}/optuna.db" if workers == 1
               else str(tmp_path / "optuna.journal"))
    process = start(["tune", str(ROOT / "experiments" / "tune_fd001.yaml"), *SLOW_TINY,
                     "baseline_trial=false", f"checkpoint_dir={tmp_path / 'ckpt'}",
                     "--n-trials", "4",
                     "--workers", str(workers), "--storage", storage, "--study-name", "s"],
                    tmp_path, real_data_dir)
    wait_for_checkpoint(process, tmp_path / "ckpt", timeout=180)
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)  # Ctrl-C reaches the whole process group
    else:
        os.kill(process.pid, signum)  # SIGTERM reaches the parent only (timeout, schedulers)
    returncode, _, err = finish(process, timeout=180)
    assert returncode == code, err[-3000:]
    assert "Traceback" not in err and "Aborted!" not in err
    assert "run the same command again" in err
    runs = runs_of(tmp_path)
    assert runs and not [r for r in runs if r.info.status == "RUNNING"]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [p.info.status for p in parents] == ["KILLED"]
    assert any(r.info.status == "KILLED" for r in runs if r not in parents)
    if workers == 1:
        study = optuna.load_study(study_name="s", storage=storage)
    else:
        from optuna.storages.journal import JournalFileBackend

        study = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(
            JournalFileBackend(storage)))
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.RUNNING not in states
    # the interrupted trial: FAIL in Optuna, KILLED in MLflow, the same reason in both
    said = "interrupted (SIGINT)" if signum == signal.SIGINT else "interrupted (SIGTERM)"
    stopped = [t for t in study.trials if t.user_attrs.get("reason") == said]
    assert stopped and all(t.state == optuna.trial.TrialState.FAIL for t in stopped), (
        [(t.number, t.state.name, t.user_attrs.get("reason")) for t in study.trials], err[-2000:])
    # A trial that another worker had only started (still reading its data) has no run yet;
    # the one whose checkpoint was waited for has.
    by_id = {r.info.run_id: r for r in runs}
    with_runs = [t for t in stopped if "mlflow_run_id" in t.user_attrs]
    assert with_runs, [(t.number, t.user_attrs) for t in stopped]
    numbered = {r.data.tags.get("optuna.trial") for r in runs}
    assert not [t.number for t in stopped if t not in with_runs and str(t.number) in numbered]
    for trial in with_runs:
        run = by_id[trial.user_attrs["mlflow_run_id"]]
        assert run.info.status == "KILLED"
        assert run.data.tags["optuna.trial_state"] == "FAIL"
        assert run.data.tags["optuna.reason"] == said
    for trial in stopped:
        assert f"trial {trial.number}: {said}, " in err  # and on the console


@pytest.mark.parametrize(("first", "then", "raised"), [
    (signal.SIGTERM, signal.SIGINT, "Terminated"),
    (signal.SIGINT, signal.SIGTERM, "KeyboardInterrupt"),
])
def test_the_first_signal_wins_when_both_arrive_during_one_long_call(first, then, raised):
    """Both signals arrive while the main thread is inside one C call (as in a training step
    on a loaded machine); Python then runs its handlers in signal-number order, SIGINT first.
    The first to arrive must decide: SIGTERM then SIGINT exits 143, not 130."""
    import hashlib
    import threading

    from rul.interrupts import exit_code, interrupts_as_exceptions

    inside, sent = threading.Event(), []

    def send():
        inside.wait()
        time.sleep(0.1)
        os.kill(os.getpid(), first)
        time.sleep(0.05)  # as from a shell: back to back, the kernel may hand them over swapped
        os.kill(os.getpid(), then)
        sent.append(time.monotonic())

    sender = threading.Thread(target=send)
    sender.start()
    with pytest.raises(KeyboardInterrupt) as caught, interrupts_as_exceptions() as received:
        inside.set()
        # one C call that releases the GIL and checks no signal: ~2 s here
        hashlib.pbkdf2_hmac("sha256", b"key", b"salt", 10_000_000)
    returned = time.monotonic()  # the handlers ran when the call returned
    sender.join()
    assert sent and sent[0] < returned, "the call ended before both signals: it proves nothing"
    assert type(caught.value).__name__ == raised and received == [first]
    assert exit_code(caught.value) == 128 + first


def test_a_signal_inside_a_deferred_block_is_raised_when_the_block_ends():
    """A database write is never cut in half: the signal waits for the block, then raises;
    inside `immediate()` it raises at once; a second signal is ignored."""
    from rul.interrupts import Terminated, deferred, immediate, interrupts_as_exceptions

    done = []
    with pytest.raises(Terminated), interrupts_as_exceptions():
        with deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            done.append("write finished")
            os.kill(os.getpid(), signal.SIGINT)  # second signal: ignored
        done.append("not reached")
    assert done == ["write finished"]

    with pytest.raises(KeyboardInterrupt), interrupts_as_exceptions(), deferred(), immediate():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        done.append("not reached either")
    assert done == ["write finished"]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # on its way out
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize("command", ["train", "evaluate", "tune"])
def test_ctrl_c_while_the_config_loads_exits_130_with_nothing_started(command, monkeypatch,
                                                                         tmp_path):
    """Before any run exists: one line, the signal's exit code, no traceback, no store."""
    from click.testing import CliRunner

    from rul.cli import main
    from rul.config import loading

    def interrupted_while_reading(text, Loader):  # SIGINT: without rul's handler, "Aborted!"
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler raises here
        raise AssertionError("the signal was not raised")

    monkeypatch.setattr(loading.yaml, "load", interrupted_while_reading)
    monkeypatch.chdir(tmp_path)
    path = Path(__file__).resolve().parents[1] / "experiments" / (
        "tune_fd001.yaml" if command == "tune" else "fd001.yaml")
    result = CliRunner().invoke(main, [command, str(path)])
    assert result.exit_code == 130, result.output
    assert "interrupted: nothing was started" in result.output
    assert "Traceback" not in result.output and list(tmp_path.iterdir()) == []
