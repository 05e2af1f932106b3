"""What rul does to files beyond reading them: renames made durable (`sync_folder`)."""

import os
from pathlib import Path


def sync_folder(folder: Path) -> None:
    """Make the renames in `folder` durable (POSIX; a no-op where folders cannot be
    opened)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
