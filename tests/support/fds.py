"""Open file descriptors of this process (Linux ``/proc``), for tests that a reader closes
the files it opened."""

from __future__ import annotations

import os
from pathlib import Path


def open_fds(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    target = str(path.resolve())
    return sum(1 for fd in Path("/proc/self/fd").iterdir() if os.path.realpath(fd) == target)
