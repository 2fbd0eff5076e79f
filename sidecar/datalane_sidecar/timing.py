"""Where the time of a sidecar start goes: seconds since the process began, and named laps.

A restarted sidecar (kubelet's SIGTERM on every eviction and restart, a crash) keeps its
trainers waiting until it serves their next microbatch. :class:`Laps` records how long each
part of the start took - the interpreter and imports before :func:`datalane_sidecar.server.serve`
ran, loading the recipe, planning, the eval streams' plans, opening the store, binding the
socket - and the ``serving`` log line and the ``datalane_startup_seconds`` gauge report them
(docs/operator.md, Restarts). :func:`process_age` reads the process's start time from
``/proc`` (Linux); elsewhere the laps start at the first one. Callers: the server and the
service (the first microbatch sent after a start).
"""

from __future__ import annotations

import os
import time

__all__ = ["Laps", "process_age"]


def process_age() -> float | None:
    """Seconds since this process was started (``/proc/self/stat``), or None off Linux."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        # field 22 (starttime, clock ticks after boot); the command name (field 2) may hold
        # spaces, so count from the closing parenthesis
        started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


class Laps:
    """Named durations, each from the end of the previous lap; the first lap is the time
    the process lived before the ``Laps`` was made (``"imports"``: the interpreter's start
    and the imports), when the process's age is known."""

    def __init__(self, first: str = "imports") -> None:
        age = process_age()
        self._origin = time.monotonic() - (age or 0.0)
        self._last = time.monotonic()
        self.laps: dict[str, float] = {first: round(age, 3)} if age is not None else {}

    def lap(self, name: str) -> float:
        """Close the lap ``name`` now; its seconds."""
        now = time.monotonic()
        took = now - self._last
        self._last = now
        self.laps[name] = round(took, 3)
        return took

    def since_start(self) -> float:
        """Seconds since the process began (or since the ``Laps`` was made)."""
        return time.monotonic() - self._origin
