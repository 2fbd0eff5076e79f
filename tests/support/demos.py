"""Running a training demo (``datalane.demos.*``) as ``make`` does, at its CI size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_short_demo(module: str, workdir: Path) -> tuple[str, list[list[str]]]:
    """``python -m <module> --short --workdir <workdir>``: its stdout and the rows of its table
    (one per step; steps 1 to 4), after checking it exited 0."""
    proc = subprocess.run([sys.executable, "-m", module, "--short", "--workdir", str(workdir)],
                          capture_output=True, text=True, timeout=1200)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    rows = [line.split() for line in out.splitlines() if line[:4].strip().isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3", "4"], out
    return out, rows
