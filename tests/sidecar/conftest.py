"""Real sidecar processes on real Unix sockets for the sidecar tier."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class SidecarProc:
    socket: str
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(self, timeout: float = 60.0) -> SidecarProc:
        cmd = [sys.executable, "-m", "datalane_sidecar", "serve", "--socket", self.socket,
               *self.args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sidecar exited {self.proc.returncode}:\n"
                                     f"{self.log.read_text()}")
            probe = subprocess.run([sys.executable, "-m", "datalane_sidecar", "probe",
                                    "--socket", self.socket, "--timeout", "1"],
                                   capture_output=True, check=False)
            if probe.returncode == 0:
                return self
            time.sleep(0.2)
        raise AssertionError(f"sidecar not serving after {timeout} s:\n{self.log.read_text()}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired as e:
            self.proc.send_signal(signal.SIGUSR1)  # the sidecar dumps every thread's stack
            time.sleep(2)
            raise AssertionError(
                f"sidecar did not exit on SIGTERM:\n{self.log.read_text()}") from e

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Callable[..., SidecarProc]]:
    """``sidecar(recipe_path, *flags)`` starts a sidecar on a socket in a fresh folder."""
    procs: list[SidecarProc] = []

    def start(recipe: str, *flags: str, socket: str | None = None,
              env: dict[str, str] | None = None) -> SidecarProc:
        folder = tmp_path / f"pod{len(procs)}"
        folder.mkdir(exist_ok=True)
        sc = SidecarProc(socket or str(folder / "datalane.sock"),
                         ["--recipe", recipe, "--workers", "2", *flags],
                         folder / "sidecar.log", env=env or {})
        procs.append(sc)
        return sc.start()

    yield start
    for p in procs:
        p.stop()


@pytest.fixture
def repeat_recipe(write_recipe: Callable[..., str], corpus: Any) -> str:
    """Two repeated sources (Parquet and JSONL), mixed 0.7/0.3: an endless stream."""
    return write_recipe(sources=[
        {"name": "web", "uris": [corpus.web], "epochs": None, "chunk_rows": 50, "weight": 0.7},
        {"name": "code", "uris": [corpus.code], "epochs": None, "chunk_bytes": 8192,
         "weight": 0.3}])
