"""``open_file`` gives every reader a file position of its own, on every filesystem.

fsspec's memory filesystem (``memory://``, handy for tests and notebooks) hands every reader
of a path the *same* file object; two readers of one file - a lane reading a chunk while
another lane opens the same file on another thread - then move each other's position, and a
reader that closes its handle closes the file for everyone. Seen as a WebDataset sample read
from the wrong offset about one run in ten (tests/engine/formats/test_formats_more.py,
memory:// URIs).

Remote files open with fsspec's cache options (``cache_type``, ``block_size``: see
tests/engine/test_remote_reads.py); a filesystem that does not take them opens with its own.
"""

from __future__ import annotations

import io
from typing import Any

import fsspec

from datalane.engine.files import open_file


def test_two_readers_of_one_memory_file_keep_their_own_positions() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/open-file-test/data.bin", bytes(range(32)))
    uri = "memory:///open-file-test/data.bin"
    a, b = open_file(uri), open_file(uri)
    assert a.read(3) == bytes([0, 1, 2])
    assert b.read(5) == bytes([0, 1, 2, 3, 4]), "a second reader starts at byte 0"
    assert a.read(3) == bytes([3, 4, 5]), "the first reader goes on where it was"
    b.close()
    assert a.read(2) == bytes([6, 7]), "closing one reader leaves the other open"
    with open_file(uri) as c:
        assert c.read() == bytes(range(32)), "and the file itself readable"


class _PlainFileSystem(fsspec.AbstractFileSystem):
    """A filesystem whose files take no ``cache_type`` (its ``_open`` has the arguments
    ``AbstractFileSystem.open`` always passes, and no ``**kwargs``): what a third-party
    implementation may look like."""

    protocol = "datalane-plain"

    def _open(self, path: str, mode: str = "rb", block_size: Any = None,  # type: ignore[override]
              autocommit: bool = True, cache_options: Any = None) -> io.BytesIO:
        return io.BytesIO(b"plain bytes of " + path.encode())


def test_a_filesystem_without_cache_options_opens_with_its_own_reading() -> None:
    fsspec.register_implementation("datalane-plain", _PlainFileSystem, clobber=True)
    for ranged in (False, True):
        with open_file("datalane-plain://a/b", ranged=ranged) as f:
            assert f.read().startswith(b"plain bytes of "), (
                "a filesystem that takes no cache_type / block_size must still open")
