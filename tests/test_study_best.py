"""tools/study_best.py: a study's best trial as the KEY=VALUE overrides `rul evaluate` takes,
from the storage `rul tune` wrote; a missing file or study is one line, and nothing is
created."""

import subprocess
import sys
from pathlib import Path

import optuna
from optuna.storages.journal import JournalFileBackend

TOOL = Path(__file__).resolve().parents[1] / "tools" / "study_best.py"


def best(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                          text=True)


def scored(val_rmse: float):
    """An objective that draws lr and epochs (enqueued) and scores `val_rmse`."""
    def objective(trial: optuna.Trial) -> float:
        trial.suggest_float("lr", 1e-4, 1.0)
        trial.suggest_categorical("epochs", [100, 150])
        return val_rmse

    return objective


def test_the_best_trial_as_overrides_from_a_journal_and_sqlite(tmp_path):
    journal = tmp_path / "optuna.journal"
    for storage in (optuna.storages.JournalStorage(JournalFileBackend(str(journal))),
                    f"sqlite:///{tmp_path}/optuna.db"):
        study = optuna.create_study(study_name="s", storage=storage)
        for lr, epochs, val_rmse in ((1e-3, 100, 12.5), (8e-3, 150, 11.2), (2e-2, 100, 13.0)):
            study.enqueue_trial({"lr": lr, "epochs": epochs})
            study.optimize(scored(val_rmse), n_trials=1)
    for storage in (journal, f"sqlite:///{tmp_path}/optuna.db"):
        done = best(storage, "s")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "epochs=150 lr=0.008"


def test_a_missing_file_or_study_is_one_line_and_nothing_is_created(tmp_path):
    for storage in (tmp_path / "none.journal", f"sqlite:///{tmp_path}/none.db"):
        done = best(storage, "s")
        assert done.returncode == 1 and done.stderr.strip() == f"s: {storage}: no such file"
    assert list(tmp_path.iterdir()) == []
    optuna.create_study(study_name="other", storage=f"sqlite:///{tmp_path}/optuna.db")
    done = best(f"sqlite:///{tmp_path}/optuna.db", "s")
    assert done.returncode == 1 and done.stderr.strip().endswith("s: no such study in "
                                                                 f"sqlite:///{tmp_path}/optuna.db")
