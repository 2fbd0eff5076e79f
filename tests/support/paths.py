"""Where the tests find the repository, their data and the golden files, from any test folder
(the test modules import these instead of counting ``Path(__file__).parents``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA", "GOLDEN", "REPO"]

#: the repository root (the working directory of the commands the tests run)
REPO = Path(__file__).resolve().parents[2]
#: tests/data: the small checked-in inputs (chat templates, tokenizers, MDS shards)
DATA = REPO / "tests" / "data"
#: tests/golden: the append-only golden hashes and checkpoints
GOLDEN = REPO / "tests" / "golden"
