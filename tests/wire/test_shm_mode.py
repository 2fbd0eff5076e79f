"""The shared-memory ring's file mode: the socket's, whatever the umask, so a trainer of
another user in the pod's group (fsGroup, socket mode 0660) can map the ring it is handed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from datalane.spec.schema import text_schema
from datalane.wire.layout import Layout
from datalane.wire.shm import ShmWriter


@pytest.mark.parametrize("mode", [0o600, 0o660])
def test_the_ring_has_the_mode_it_is_given(tmp_path: Path, mode: int) -> None:
    old = os.umask(0o077)  # a umask that would strip the group bits of a plain open()
    try:
        writer = ShmWriter(str(tmp_path / "ring"), slots=2,
                           layout=Layout.of(text_schema(0), 2, 8), mode=mode)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE((tmp_path / "ring").stat().st_mode) == mode
    finally:
        writer.close()


def test_the_default_is_owner_only(tmp_path: Path) -> None:
    writer = ShmWriter(str(tmp_path / "ring"), slots=2, layout=Layout.of(text_schema(0), 2, 8))
    try:
        assert stat.S_IMODE((tmp_path / "ring").stat().st_mode) == 0o600
    finally:
        writer.close()


def test_a_ring_that_cannot_be_mapped_leaves_no_file(tmp_path: Path) -> None:
    """Review finding 8's neighbour: a ring whose mapping fails (here none of its 0 slots
    can be mapped) is not left on the pod's tmpfs, where nothing would remove it."""
    path = tmp_path / "datalane-0000000000000000.shm"
    with pytest.raises(ValueError):
        ShmWriter(str(path), 0, Layout.of(text_schema(0), 2, 8), 0o600)
    assert not path.exists()
