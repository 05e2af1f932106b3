"""The lock beside a local study (rul.tuning.storage.study_lock): one `rul tune` process at a
time holds it, and no lock file stays beside the study once it is released, a study stopped
by Ctrl-C included."""

import fcntl
import threading
import time

import pytest

from rul.tuning.storage import study_lock


def _held_by_someone(path) -> bool:
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


@pytest.mark.parametrize("url, workers", [("sqlite:///{}/optuna.db", 1),
                                          ("{}/optuna.journal", 2)])
def test_no_lock_file_is_left_beside_the_study(tmp_path, url, workers):
    storage = url.format(tmp_path)
    with study_lock(storage, workers, "s"):
        (lock,) = tmp_path.glob("*.lock")
        assert _held_by_someone(lock)
    assert list(tmp_path.glob("*.lock")) == []


def test_a_study_stopped_by_ctrl_c_leaves_no_lock_file(tmp_path):
    with pytest.raises(KeyboardInterrupt), study_lock(f"sqlite:///{tmp_path}/optuna.db", 1, "s"):
        raise KeyboardInterrupt
    assert list(tmp_path.glob("*.lock")) == []


def test_a_waiting_process_holds_the_lock_after_the_file_was_removed(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    lock = tmp_path / "optuna.db.s.lock"
    got, release = threading.Event(), threading.Event()

    def waiter():
        with study_lock(storage, 1, "s"):
            got.set()
            release.wait(10)

    with study_lock(storage, 1, "s"):
        other = threading.Thread(target=waiter)
        other.start()
        time.sleep(0.3)
        assert not got.is_set()  # it waits on the file the holder will remove
    assert got.wait(10)
    try:  # the waiter's lock is the one a newcomer finds at the path
        assert _held_by_someone(lock)
    finally:
        release.set()
        other.join(10)
    assert not lock.exists()
