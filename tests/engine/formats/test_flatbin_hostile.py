"""Flat token files that do not fit their settings or their offsets file, and documents over
the record bound (:mod:`datalane.engine.formats.flatbin`).

Every file is written here by hand (uint16 ids back to back, offsets with ``np.save``); each
expected value is worked out from the ids written. A bad offsets file is a DataError naming it
and the bad value; a setting that cannot apply is a ConfigError naming the source.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from datalane.engine.files import SourceFile, expand
from datalane.engine.formats import flatbin
from datalane.engine.formats.base import TooLarge
from datalane.engine.formats.flatbin import FLATBIN, Flatbin, offsets_path, read_offsets
from datalane.spec.errors import ConfigError, DataError, StorageError


def listed(path: Path) -> SourceFile:
    ((uri, size, ident),) = expand(str(path), "test")
    return SourceFile(uri, size, ident, "flatbin", None)


def u16_file(path: Path, ids: list[int]) -> SourceFile:
    path.write_bytes(np.array(ids, "<u2").tobytes())
    return listed(path)


def bounded(boundary: int = 1) -> Flatbin:
    return Flatbin("ids", "uint16", boundary)


def read(fmt: Flatbin, sf: SourceFile, chunk_bytes: int = 1 << 20) -> list[tuple[int, object]]:
    """Every (position, document) of ``sf``, chunk by chunk; arrays as lists."""
    reader = fmt.reader([sf], "")
    return [(p, r.tolist() if isinstance(r, np.ndarray) else r)
            for ch in fmt.cut(0, sf, chunk_bytes, None) for p, r in reader.records(ch)]


# -- offsets files -------------------------------------------------------------------------------

@pytest.mark.parametrize(("uri", "offsets"), [
    ("/d/train.bin", "/d/train.offsets.npy"),
    ("/d/train.v2.bin", "/d/train.v2.offsets.npy"),  # only the last extension goes
    ("s3://b/d/train", "s3://b/d/train.offsets.npy"),
    ("train.u16", "train.offsets.npy"),
])
def test_the_offsets_file_replaces_the_last_extension(uri: str, offsets: str) -> None:
    assert offsets_path(uri) == offsets


def test_a_file_that_is_not_npy_is_named(tmp_path: Path) -> None:
    (tmp_path / "o.npy").write_bytes(b"not an array")
    with pytest.raises(DataError, match=r"o.npy is not a .npy file of document offsets: "):
        read_offsets(str(tmp_path / "o.npy"), 0)


@pytest.mark.parametrize(("array", "what"), [
    (np.array([0.0, 3.0]), r"a float64 array of shape \(2,\)"),
    (np.zeros(0, np.int64), r"a int64 array of shape \(0,\)"),
])
def test_offsets_are_a_non_empty_1d_integer_array(tmp_path: Path, array: np.ndarray,
                                                  what: str) -> None:
    """Floats and an empty array are refused (n + 1 >= 1 entries, integers)."""
    np.save(tmp_path / "o.npy", array)
    with pytest.raises(DataError, match=rf"o.npy holds {what}; the document offsets are a 1-D "
                                        rf"integer array of n \+ 1 entries"):
        read_offsets(str(tmp_path / "o.npy"), 3)


def test_unsigned_offsets_beyond_int64_are_refused(tmp_path: Path) -> None:
    """A uint64 of 2^63 cannot become an int64 offset: refused, not wrapped negative."""
    np.save(tmp_path / "o.npy", np.array([0, 1 << 63], np.uint64))
    with pytest.raises(DataError, match=r"o.npy holds offsets beyond the range of int64"):
        read_offsets(str(tmp_path / "o.npy"), 3)


def test_unsigned_offsets_up_to_int64_max_are_read(tmp_path: Path) -> None:
    """uint64 and uint32 offsets within int64 are read as int64, unchanged."""
    for dtype in (np.uint64, np.uint32, np.int32):
        np.save(tmp_path / "o.npy", np.array([0, 2, 5], dtype))
        got = read_offsets(str(tmp_path / "o.npy"), 5)
        assert got.dtype == np.int64 and got.tolist() == [0, 2, 5]


def test_one_offset_is_a_file_of_no_documents(tmp_path: Path) -> None:
    """``[0]`` for a file of 0 tokens: 0 documents, valid."""
    np.save(tmp_path / "o.npy", np.array([0], np.int64))
    assert read_offsets(str(tmp_path / "o.npy"), 0).tolist() == [0]


def test_equal_offsets_are_an_empty_document(tmp_path: Path) -> None:
    """Offsets never decrease; equal neighbours are allowed (an empty document)."""
    np.save(tmp_path / "o.npy", np.array([0, 2, 2, 4], np.int64))
    assert read_offsets(str(tmp_path / "o.npy"), 4).tolist() == [0, 2, 2, 4]


def test_a_decreasing_offset_is_named_with_its_neighbour(tmp_path: Path) -> None:
    """[0, 3, 5, 4, 2, 6]: the steps are 3, 2, -1, -2, 4; the largest drop (offset 4, 2 < 4)
    is the one named, with the offset before it."""
    np.save(tmp_path / "o.npy", np.array([0, 3, 5, 4, 2, 6], np.int64))
    with pytest.raises(DataError, match=r"o.npy: offset 4 \(2\) is below offset 3 \(4\); "
                                        r"offsets never decrease"):
        read_offsets(str(tmp_path / "o.npy"), 6)


def test_a_listed_offsets_file_must_still_be_the_one_listed(tmp_path: Path) -> None:
    """Offsets listed when the plan was made and rewritten since are refused."""
    np.save(tmp_path / "o.npy", np.array([0, 3], np.int64))
    listed_offsets = dataclasses.replace(listed(tmp_path / "o.npy"), format="npy")
    np.save(tmp_path / "o.npy", np.array([0, 1, 3], np.int64))
    with pytest.raises(DataError, match=r"o.npy changed after the plan was made"):
        read_offsets(listed_offsets, 3)


def test_a_remote_object_array_is_never_unpickled() -> None:
    """A .npy of Python objects would run code when unpickled: refused unread (a local one
    is refused by the memory map, which cannot hold objects)."""
    import io

    import fsspec

    buf = io.BytesIO()
    np.save(buf, np.array([0, 3], object), allow_pickle=True)
    fsspec.filesystem("memory").pipe("/test_flatbin/obj.npy", buf.getvalue())
    with pytest.raises(DataError, match=r"obj.npy is not a .npy file of document offsets: "
                                        r"Object arrays cannot be loaded when allow_pickle=False"):
        read_offsets("memory://test_flatbin/obj.npy", 3)


def test_a_missing_offsets_file_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"gone.npy disappeared after planning"):
        read_offsets(str(tmp_path / "gone.npy"), 0)


def test_a_remote_offsets_file_is_read(tmp_path: Path) -> None:
    """Offsets on fsspec's memory filesystem are loaded from their bytes and checked."""
    import io

    import fsspec

    buf = io.BytesIO()
    np.save(buf, np.array([0, 1, 3], np.int64))
    fsspec.filesystem("memory").pipe("/test_flatbin/o.npy", buf.getvalue())
    assert read_offsets("memory://test_flatbin/o.npy", 3).tolist() == [0, 1, 3]


# -- settings ------------------------------------------------------------------------------------

def test_a_boundary_id_wider_than_the_tokens_is_a_config_error(tmp_path: Path) -> None:
    """uint16 ids reach 65535: a boundary of 65536 could never be found."""
    sf = u16_file(tmp_path / "f.bin", [1, 2])
    assert bounded(65535).layout(sf).boundary == 65535
    with pytest.raises(ConfigError, match=r"source 'ids': tokens.boundary 65536 does not fit "
                                          r"in uint16"):
        bounded(65536).layout(sf)


def test_a_compressed_flat_file_is_refused(tmp_path: Path) -> None:
    sf = dataclasses.replace(u16_file(tmp_path / "f.bin", [1]), compression="zstd")
    with pytest.raises(ConfigError, match=r"f.bin: flat token files are read in place; store "
                                          r"them uncompressed"):
        bounded().cut(0, sf, 1 << 20, None)


def test_chunk_rows_does_not_apply_with_a_boundary(tmp_path: Path) -> None:
    sf = u16_file(tmp_path / "f.bin", [1])
    with pytest.raises(ConfigError, match=r"source 'ids': chunk_rows does not apply to flat "
                                          r"token files with a boundary token"):
        bounded().cut(0, sf, 1 << 20, 4)


def test_an_unconfigured_flatbin_refuses_to_read(tmp_path: Path) -> None:
    """The shared FLATBIN knows no dtype or boundary: it reads nothing."""
    sf = u16_file(tmp_path / "f.bin", [1])
    for call in (lambda: FLATBIN.layout(sf), lambda: FLATBIN.reader([sf], "")):
        with pytest.raises(ConfigError, match=r"flatbin files are read with their source's "
                                              r"tokens settings"):
            call()


def test_boundary_chunks_are_chunk_bytes_of_tokens(tmp_path: Path) -> None:
    """7 uint16 tokens, 4 bytes a chunk: token ranges [0, 2), [2, 4), [4, 6), [6, 7); less
    than one token a chunk is one token a chunk."""
    sf = u16_file(tmp_path / "f.bin", [1] * 7)
    assert [(c.start, c.stop) for c in bounded().cut(0, sf, 4, None)] == [
        (0, 2), (2, 4), (4, 6), (6, 7)]
    assert len(bounded().cut(0, sf, 1, None)) == 7


# -- documents with a boundary ---------------------------------------------------------------------

def test_read_one_past_the_last_document_is_named(tmp_path: Path) -> None:
    """Documents start at tokens 0 and 2 of [5, 1, 6]; token 3 is past the end."""
    sf = u16_file(tmp_path / "f.bin", [5, 1, 6])
    reader = bounded().reader([sf], "")
    assert reader.read_one((0, 2)).tolist() == [6]
    with pytest.raises(DataError, match=r"f.bin has 3 tokens, no document at token 3; did the "
                                        r"file change\?"):
        reader.read_one((0, 3))


def test_read_one_by_document_index_refuses_positions_out_of_range(tmp_path: Path) -> None:
    """With an offsets file, positions are document indexes 0 .. n - 1."""
    sf = u16_file(tmp_path / "f.bin", [5, 6, 7])
    np.save(tmp_path / "f.offsets.npy", np.array([0, 1, 3], np.int64))
    reader = Flatbin("ids", "uint16", None).reader([sf], "")
    assert reader.read_one((0, 0)).tolist() == [5]
    assert reader.read_one((0, 1)).tolist() == [6, 7]
    for pos in (-1, 2):
        with pytest.raises(DataError, match=rf"f.bin has 2 documents, no document {pos}; "):
            reader.read_one((0, pos))


@pytest.mark.parametrize("window", [4, 8, 1 << 20])
def test_a_boundary_document_over_the_bound_is_too_large_and_the_next_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    """A bound of 8 bytes (4 uint16 tokens): [5, 6, 7, 1] is read, [8, 9, 10, 11, 12, 1] is a
    TooLarge of 12 bytes, [13, 1] and the unended [14, 15, 16, 17, 18] (10 bytes: too large)
    follow; whatever the read window."""
    monkeypatch.setattr(flatbin, "MAX_RECORD_BYTES", 8)
    monkeypatch.setattr(flatbin, "WINDOW_BYTES", window)
    ids = [5, 6, 7, 1, 8, 9, 10, 11, 12, 1, 13, 1, 14, 15, 16, 17, 18]
    sf = u16_file(tmp_path / "f.bin", ids)
    assert read(bounded(), sf) == [(0, [5, 6, 7, 1]), (4, TooLarge(12, "document")),
                                   (10, [13, 1]), (12, TooLarge(10, "document"))]
