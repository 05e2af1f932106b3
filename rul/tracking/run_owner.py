"""Which process a RUNNING run belongs to, so that the next command can tell a run whose
process is gone (killed, even with SIGKILL) from one that is still training.

Every run rul creates or sets RUNNING again carries OWNER_TAG: this machine's name, the
process id and the process's start as seconds after the machine booted (a reused pid is another
process). Not its start on the wall clock, which psutil derives from the boot time the kernel
keeps on the wall clock: a clock that is stepped (NTP, a virtual machine's clock sync; 22 s
were seen) moved it, and the next command then took every live run for abandoned and marked
it KILLED. Tags written in that older form are still read. A RUNNING run
whose owner ran on this machine and is gone was abandoned; a run owned on another machine
(a shared tracking server) is judged by its checkpoint lock instead
(rul.tracking.run_checkpoints).
"""

import os
import socket

import psutil

OWNER_TAG = "rul.process"


def _identities(pid: int) -> tuple[str, str] | None:
    """The process's identity: its start after boot, and (older tags) on the wall clock."""
    try:
        started = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    host = socket.gethostname()
    return f"{host} {pid} {started - psutil.boot_time():.2f}", f"{host} {pid} {started:.2f}"


def owner_tags() -> dict[str, str]:
    """The tag that says this process trains the run."""
    return {OWNER_TAG: _identities(os.getpid())[0]}


def owner_alive(tags: dict) -> bool | None:
    """Whether the run's owner (its OWNER_TAG) is alive: True or False when it ran on this
    machine, None when this machine cannot tell (another machine's, or no tag)."""
    owner = tags.get(OWNER_TAG, "")
    host, _, rest = owner.partition(" ")
    pid = rest.partition(" ")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return owner in (_identities(int(pid)) or ())


def reopen(client, run_id: str) -> None:
    """Set run `run_id` RUNNING again, owned by this process (its owner tag first: a run is
    never RUNNING under a process that is gone)."""
    for key, value in owner_tags().items():
        client.set_tag(run_id, key, value)
    client.update_run(run_id, status="RUNNING")
