"""Which process owns a RUNNING run: a live one stays its owner through a stepped wall clock,
a gone one does not, and tags in the older wall-clock form are still read."""

import subprocess
import sys

import psutil

from rul.tracking.run_owner import OWNER_TAG, owner_alive, owner_tags


def test_a_live_owner_stays_alive_when_the_wall_clock_is_stepped(monkeypatch):
    """psutil puts a process's start on the wall clock through the boot time, which the kernel
    keeps on the wall clock too: a clock stepped by 22 s (seen on a virtual machine) moves
    both, and the run of a live process must not look abandoned."""
    tags = owner_tags()
    assert owner_alive(tags) is True
    create_time, boot_time = psutil.Process.create_time, psutil.boot_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: create_time(self) + 22.0)
    monkeypatch.setattr(psutil, "boot_time", lambda: boot_time() + 22.0)
    assert owner_alive(tags) is True


def test_an_owner_tag_of_the_older_wall_clock_form_is_still_read():
    host, pid, _ = owner_tags()[OWNER_TAG].split(" ")
    started = psutil.Process(int(pid)).create_time()
    assert owner_alive({OWNER_TAG: f"{host} {pid} {started:.2f}"}) is True
    assert owner_alive({OWNER_TAG: f"{host} {pid} {started - 5:.2f}"}) is False


def test_a_gone_owner_or_a_reused_pid_is_not_alive_and_another_machine_cannot_tell():
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host, pid, after_boot = owner_tags()[OWNER_TAG].split(" ")
    assert owner_alive({OWNER_TAG: f"{host} {gone} {after_boot}"}) is False
    assert owner_alive({OWNER_TAG: f"{host} {pid} {float(after_boot) - 5:.2f}"}) is False
    assert owner_alive({OWNER_TAG: f"another-machine {pid} {after_boot}"}) is None
    assert owner_alive({}) is None
