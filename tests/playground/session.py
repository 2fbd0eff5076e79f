"""A playground for one test: ``python -m playground up`` (none may run already), a shell with
its KUBECONFIG and its kubectl and helm first on PATH, and ``python -m playground down`` at
the end, checked to leave no folder and no container behind. On a failure the commands run so
far and the tail of the playground's log go to stderr."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from playground.__main__ import FOLDER, read_state

from .trainers import ROOT

PLAYGROUND = [sys.executable, "-m", "playground"]


@dataclass
class Shell:
    """``bash -c`` in the repository root against the playground; remembers what it ran."""

    env: dict[str, str]
    ran: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def __call__(self, cmd: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        self.ran[cmd] = res = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=self.env,
                                             capture_output=True, text=True, timeout=timeout,
                                             check=False)
        return res

    def ok(self, cmd: str, timeout: float = 600) -> str:
        """The output of a command that must succeed."""
        res = self(cmd, timeout)
        assert res.returncode == 0, f"$ {cmd}\n{res.stdout}\n{res.stderr}"
        return res.stdout

    def status(self, pipeline: str, name: str) -> str:
        """A field of the DataPipeline's status ('' while unset)."""
        return self(f"kubectl get dp {pipeline} -o jsonpath='{{.status.{name}}}'").stdout


@contextmanager
def running_playground(*up: str) -> Iterator[tuple[subprocess.CompletedProcess[str], Shell]]:
    """(``up``'s output, a shell) while a playground started with ``up`` runs."""
    if read_state() is not None:
        pytest.fail("a playground runs already (this test starts its own): "
                    "make playground-down first")
    shell = Shell({})
    try:
        started = subprocess.run([*PLAYGROUND, "up", *up], cwd=ROOT, capture_output=True,
                                 text=True, timeout=1800, check=False)
        assert started.returncode == 0, started.stdout + started.stderr
        state = read_state()
        assert state is not None
        shell.env = {**os.environ, "KUBECONFIG": state["kubeconfig"],
                     "PATH": f"{state['bin']}{os.pathsep}{os.environ['PATH']}"}
        yield started, shell
    except BaseException:
        sys.stderr.write("\n".join(f"$ {c}\n{r.stdout}{r.stderr}" for c, r in shell.ran.items()))
        log = FOLDER / "playground.log"
        if log.exists():
            sys.stderr.write(log.read_text(errors="replace")[-6000:])
        raise
    finally:
        down = subprocess.run([*PLAYGROUND, "down"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, check=False)
        assert down.returncode == 0, down.stdout + down.stderr
    assert not FOLDER.exists()
    assert not re.search(r"dlp-", subprocess.run(
        ["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
        check=False, env={**os.environ, "CONTAINERS_CONF": str(ROOT / "images/containers.conf")},
    ).stdout)
