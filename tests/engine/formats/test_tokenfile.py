"""Token files piece by piece (:mod:`datalane.engine.formats.tokenfile`): the index cache, local
and remote names, whole-file loads, ranged token reads and their errors, and the document
reader's bound on one document (a document over it is a ``TooLarge``, never read).

Files are written here by hand; every expected value is worked out from the bytes written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from datalane.engine.files import SourceFile, expand
from datalane.engine.formats import tokenfile
from datalane.engine.formats.base import TooLarge
from datalane.engine.formats.tokenfile import (
    TokenFiles,
    cached,
    cut_documents,
    documents,
    is_local,
    load_bytes,
    local_path,
)
from datalane.spec.errors import DataError, StorageError
from tests.support.fds import open_fds

U16 = np.dtype("<u2")


def listed(path: Path) -> SourceFile:
    ((uri, size, ident),) = expand(str(path), "test")
    return SourceFile(uri, size, ident, "flatbin", None)


def u16_file(path: Path, ids: list[int]) -> SourceFile:
    path.write_bytes(np.array(ids, U16).tobytes())
    return listed(path)


class Builds:
    """Builders that record what they built."""

    def __init__(self) -> None:
        self.built: list[int] = []

    def of(self, value: int) -> Callable[[], int]:
        def build() -> int:
            self.built.append(value)
            return value
        return build


def test_the_cache_builds_once_per_key() -> None:
    """A key seen before returns the value built the first time, without building again."""
    b = Builds()
    key = ("test_tokenfile", "once")
    assert cached(key, b.of(1)) == 1
    assert cached(key, b.of(2)) == 1
    assert b.built == [1]


def test_the_cache_keeps_the_last_used_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 2: keys 0, 1, then 0 again (now the most recent), then 2 pushes out 1,
    the least recently used, which is then built again; 0 is still there."""
    monkeypatch.setattr(tokenfile, "_cache", OrderedDict())
    monkeypatch.setattr(tokenfile, "_CACHED", 2)
    b = Builds()
    for k in (0, 1, 0, 2):
        cached(("lru", k), b.of(k))
    assert b.built == [0, 1, 2]
    assert cached(("lru", 0), b.of(100)) == 0
    assert cached(("lru", 1), b.of(101)) == 101
    assert b.built == [0, 1, 2, 101]


@pytest.mark.parametrize(("uri", "local", "path"), [
    ("/data/a.bin", True, "/data/a.bin"),
    ("file:///data/a.bin", True, "/data/a.bin"),
    ("relative/a.bin", True, "relative/a.bin"),
    ("s3://bucket/a.bin", False, "s3://bucket/a.bin"),
    ("memory://a.bin", False, "memory://a.bin"),
])
def test_local_names_are_paths_or_file_uris(uri: str, local: bool, path: str) -> None:
    """Only a plain path or a file:// URI is read (memory-mapped) in place."""
    assert is_local(uri) is local
    if local:
        assert local_path(uri) == path


def test_load_bytes_of_an_empty_file_is_no_bytes(tmp_path: Path) -> None:
    """An empty file cannot be memory-mapped; it loads as 0 bytes (for the index checks to
    name), not as an error of mmap."""
    (tmp_path / "e.idx").write_bytes(b"")
    data = load_bytes(str(tmp_path / "e.idx"))
    assert len(data) == 0


def test_load_bytes_reads_a_local_file_whole(tmp_path: Path) -> None:
    (tmp_path / "a.idx").write_bytes(b"\x01\x02\x03")
    assert bytes(load_bytes(str(tmp_path / "a.idx"))) == b"\x01\x02\x03"


def test_load_bytes_of_a_listed_file_checks_it_is_still_the_one_listed(tmp_path: Path) -> None:
    """An index listed at 3 bytes and rewritten at 2 before it is read is refused."""
    (tmp_path / "a.idx").write_bytes(b"\x01\x02\x03")
    sf = listed(tmp_path / "a.idx")
    (tmp_path / "a.idx").write_bytes(b"\x01\x02")
    with pytest.raises(DataError, match=r"a.idx changed after the plan was made: the plan saw "
                                        r"3 bytes"):
        load_bytes(sf)


def test_load_bytes_reads_a_remote_file_whole() -> None:
    """A remote file (here fsspec's memory filesystem) is read, not mapped."""
    import fsspec

    fsspec.filesystem("memory").pipe("/test_tokenfile/a.idx", b"\x07\x08")
    assert bytes(load_bytes("memory://test_tokenfile/a.idx")) == b"\x07\x08"


def test_load_bytes_of_a_missing_file_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"gone.idx disappeared after planning"):
        load_bytes(str(tmp_path / "gone.idx"))


def test_load_bytes_of_a_listed_file_that_disappeared_is_a_storage_error(
        tmp_path: Path) -> None:
    """The check that a listed file is unchanged finds it gone: its StorageError passes."""
    (tmp_path / "a.idx").write_bytes(b"\x01")
    sf = listed(tmp_path / "a.idx")
    (tmp_path / "a.idx").unlink()
    with pytest.raises(StorageError, match=r"source file .*a.idx disappeared after planning"):
        load_bytes(sf)


def test_load_bytes_of_an_unreadable_path_is_a_transient_storage_error(tmp_path: Path) -> None:
    """An OSError other than a missing file (here: the path is a directory) may pass: the
    StorageError is transient, naming the path."""
    (tmp_path / "dir.idx").mkdir()
    with pytest.raises(StorageError, match=r"cannot read .*dir.idx: ") as e:
        load_bytes(str(tmp_path / "dir.idx"))
    assert e.value.transient


def test_a_read_past_the_end_names_the_byte_the_file_ends_at(tmp_path: Path) -> None:
    """4 uint16 tokens (8 bytes); tokens [2, 7) are asked for: the file ends at byte 8,
    before token 7."""
    sf = u16_file(tmp_path / "t.bin", [1, 2, 3, 4])
    with pytest.raises(DataError, match=r"t.bin ends at byte 8, before token 7 that its "
                                        r"documents reach"):
        TokenFiles().read(sf, U16, 2, 5)


def test_a_read_is_the_tokens_of_its_range(tmp_path: Path) -> None:
    sf = u16_file(tmp_path / "t.bin", [1, 2, 3, 4])
    assert TokenFiles().read(sf, U16, 1, 2).tolist() == [2, 3]


def test_a_failed_read_is_a_transient_storage_error_naming_the_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError while reading names the byte range (uint16 tokens [1, 3): bytes 2-6) and
    drops the file, so the next read opens it again."""
    sf = u16_file(tmp_path / "t.bin", [1, 2, 3, 4])
    files = TokenFiles()
    files.read(sf, U16, 0, 1)
    f = files._open[sf.uri]

    def broken(n: int = -1) -> bytes:
        raise OSError("the disk went away")

    monkeypatch.setattr(f, "read", broken)
    with pytest.raises(StorageError, match=r"cannot read .*t.bin bytes 2-6: the disk went "
                                           r"away") as e:
        files.read(sf, U16, 1, 2)
    assert e.value.transient
    assert files.read(sf, U16, 1, 2).tolist() == [2, 3]  # opened again


def test_a_reader_keeps_its_two_last_used_files_open(tmp_path: Path) -> None:
    """Reading a, b, a, c keeps a and c open (b was used least recently); close() closes
    all, and the reader can still read after it."""
    a, b, c = (u16_file(tmp_path / f"{n}.bin", [1]) for n in "abc")
    files = TokenFiles()
    for sf in (a, b, a, c):
        files.read(sf, U16, 0, 1)
    assert [open_fds(tmp_path / f"{n}.bin") for n in "abc"] == [1, 0, 1]
    files.close()
    assert [open_fds(tmp_path / f"{n}.bin") for n in "abc"] == [0, 0, 0]
    assert files.read(c, U16, 0, 1).tolist() == [1]  # a closed reader opens files again


@pytest.mark.parametrize("window", [2, 16, 18, 1 << 20])
def test_documents_over_the_bound_are_too_large_and_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    """With a bound of 8 bytes (4 uint16 tokens): documents of 4 tokens are read, one of 5
    is a TooLarge of 10 bytes, wherever it lies in a read window (window bytes: smaller than
    a document, one document, a document and the large one, everything), and from any first
    document."""
    monkeypatch.setattr(tokenfile, "MAX_RECORD_BYTES", 8)
    monkeypatch.setattr(tokenfile, "WINDOW_BYTES", window)
    ids = list(range(100, 117))  # documents of 4, 5, 4, 4 tokens
    starts = np.array([0, 4, 9, 13, 17], np.int64)
    sf = u16_file(tmp_path / "t.bin", ids)
    want = [(0, ids[0:4]), (1, TooLarge(10, "document")), (2, ids[9:13]), (3, ids[13:17])]
    for first in (0, 1):
        got = [(d, v.tolist() if isinstance(v, np.ndarray) else v)
               for d, v in documents(TokenFiles(), sf, U16, starts, first, 4)]
        assert got == want[first:], (window, first)


def test_documents_read_from_first_to_before_stop(tmp_path: Path) -> None:
    """Documents 1 and 2 of 4 ([3], [], [4, 5] of [1, 2], [3], [], [4, 5])."""
    sf = u16_file(tmp_path / "t.bin", [1, 2, 3, 4, 5])
    starts = np.array([0, 2, 3, 3, 5], np.int64)
    got = [(d, np.asarray(ids).tolist())
           for d, ids in documents(TokenFiles(), sf, U16, starts, 1, 3)]
    assert got == [(1, [3]), (2, [])]


def bounds(starts: list[int], itemsize: int, chunk_bytes: int,
           chunk_rows: int | None = None) -> list[tuple[int, int]]:
    chunks = cut_documents(0, np.array(starts, np.int64), itemsize, chunk_bytes, chunk_rows)
    return [(c.start, c.stop) for c in chunks]


def test_a_file_of_one_document_is_one_chunk() -> None:
    assert bounds([0, 5], 2, 1 << 20) == [(0, 1)]
    assert bounds([0, 5], 2, 1 << 20, chunk_rows=3) == [(0, 1)]
    assert bounds([0], 2, 1 << 20) == []  # no documents, no chunks


def test_chunk_bytes_below_one_token_is_one_token_a_chunk() -> None:
    """1 byte a chunk of 4-byte tokens: a mark at every token, so documents of one token
    each are a chunk each."""
    assert bounds([0, 1, 2, 3], 4, 1) == [(0, 1), (1, 2), (2, 3)]


def test_empty_documents_at_the_end_belong_to_the_last_chunk() -> None:
    """Documents [0, 1), [1, 1): the one mark (token 0) starts the only chunk, which also
    holds the empty document starting at the end."""
    assert bounds([0, 1, 1], 4, 4) == [(0, 2)]
    assert bounds([0, 0, 0], 4, 4) == [(0, 2)]  # only empty documents: one chunk
