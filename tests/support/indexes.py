"""A fixture for the tests of compressed files: no frame index from another test (the
process's memo) or another run (the disk cache) is used."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from datalane.engine import compressed


@pytest.fixture(autouse=True)
def fresh_indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Autouse in every module that imports it."""
    monkeypatch.setenv("DATALANE_CACHE_DIR", str(tmp_path / "cache"))
    compressed.clear_index_memo()
    yield
    compressed.clear_index_memo()
