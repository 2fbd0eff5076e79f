"""Megatron indexes written by hand, field by field, good and hostile (``read_index``).

Each index is built from the layout in :mod:`datalane.engine.formats.megatron`'s docstring:
the 34-byte header (magic, version, token type code, S sequences, D document indices), then S
``<i4`` lengths, S ``<i8`` byte pointers and D ``<i8`` document indices. Every expected value
is worked out here from those fields; a damaged field is a DataError naming the file and the
bad value.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np
import pytest

from datalane.engine.files import SourceFile, expand
from datalane.engine.formats.megatron import (
    MAGIC,
    MEGATRON,
    megatron_paths,
    read_index,
    write_dataset,
)
from datalane.spec.errors import ConfigError, DataError
from datalane.spec.recipe import Source
from datalane.spec.tokens import TokensSpec
from tests.support.fds import open_fds

SOURCE = Source(name="ids", uris=["unused"], tokens=TokensSpec())


def index_bytes(lengths: list[int], pointers: list[int], doc_index: list[int], code: int = 8,
                seqs: int | None = None, docs: int | None = None) -> bytes:
    """An index with these fields; ``seqs`` / ``docs`` override the counts in the header."""
    s = len(lengths) if seqs is None else seqs
    d = len(doc_index) if docs is None else docs
    return (MAGIC + struct.pack("<QBQQ", 1, code, s, d)
            + struct.pack(f"<{len(lengths)}i", *lengths)
            + struct.pack(f"<{len(pointers)}q", *pointers)
            + struct.pack(f"<{len(doc_index)}q", *doc_index))


def listed(path: Path) -> SourceFile:
    ((uri, size, ident),) = expand(str(path), "test")
    return SourceFile(uri, size, ident, "megatron", None)


def write_index(tmp_path: Path, data: bytes) -> tuple[str, str]:
    (tmp_path / "d.idx").write_bytes(data)
    return str(tmp_path / "d.idx"), str(tmp_path / "d.bin")


def test_megatron_paths_name_the_pair_from_either_file() -> None:
    """A dataset is named by its .idx or its .bin; both give the same pair."""
    assert megatron_paths("/d/owt.idx") == ("/d/owt.idx", "/d/owt.bin")
    assert megatron_paths("s3://b/owt.bin") == ("s3://b/owt.idx", "s3://b/owt.bin")


def test_a_file_that_is_neither_idx_nor_bin_is_a_config_error() -> None:
    """Any other name is refused, naming it, rather than guessing a pair."""
    with pytest.raises(ConfigError, match=r"^/d/owt.txt is neither a Megatron .idx nor .bin"):
        megatron_paths("/d/owt.txt")


@pytest.mark.parametrize(("code", "dtype", "itemsize"), [
    (1, "uint8", 1), (2, "int8", 1), (3, "int16", 2), (4, "int32", 4), (5, "int64", 8),
    (8, "uint16", 2)])
def test_each_integer_token_type_code_is_megatron_cores(tmp_path: Path, code: int, dtype: str,
                                                        itemsize: int) -> None:
    """megatron-core's DType codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16; the
    code sets the token width, so 3 tokens need 3 * itemsize bytes of .bin."""
    idx, bin_ = write_index(tmp_path, index_bytes([3], [0], [0, 1], code=code))
    index = read_index(idx, bin_, 3 * itemsize)
    assert index.dtype == np.dtype(dtype).newbyteorder("<")
    assert index.starts.tolist() == [0, 3]


@pytest.mark.parametrize(("code", "name"), [(6, "float64"), (7, "float32")])
def test_float_token_types_are_refused_by_name(tmp_path: Path, code: int, name: str) -> None:
    """Codes 6 and 7 are known float types, refused as such (not as unknown codes)."""
    idx, bin_ = write_index(tmp_path, index_bytes([1], [0], [0, 1], code=code))
    with pytest.raises(DataError, match=rf"d.idx stores {name} tokens; token ids are integers"):
        read_index(idx, bin_, 8)


def test_an_index_is_immutable_and_names_its_bin(tmp_path: Path) -> None:
    """An index is cached and shared by every reader of the process: it cannot be changed,
    and it names the .bin it was checked against."""
    idx, bin_ = write_index(tmp_path, index_bytes([2], [0], [0, 1]))
    index = read_index(idx, bin_, 4)
    assert (index.idx_uri, index.bin_uri, index.documents) == (idx, bin_, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        index.idx_uri = "other"  # type: ignore[misc]


def test_an_empty_dataset_has_no_documents(tmp_path: Path) -> None:
    """0 sequences and one document index (0): a valid dataset of 0 documents, 0-byte .bin."""
    write_dataset(str(tmp_path / "d"), [], "uint16")
    assert (tmp_path / "d.idx").read_bytes() == index_bytes([], [], [0])
    index = read_index(str(tmp_path / "d.idx"), str(tmp_path / "d.bin"), 0)
    assert index.documents == 0 and index.starts.tolist() == [0]


def test_a_header_alone_is_too_short_for_its_document_index(tmp_path: Path) -> None:
    """Exactly the 34-byte header is not "shorter than the header": it lacks the 8 bytes of
    its one document index (34 + 0 * 12 + 1 * 8 = 42)."""
    idx, bin_ = write_index(tmp_path, index_bytes([], [], [0])[:34])
    with pytest.raises(DataError, match=r"d.idx is not a Megatron index: 34 bytes, but 0 "
                                        r"sequences and 1 document indices need 42$"):
        read_index(idx, bin_, 0)


def test_no_document_index_at_all_is_refused(tmp_path: Path) -> None:
    """D = 0 cannot be: the document indices hold at least the 0 that starts the first."""
    idx, bin_ = write_index(tmp_path, index_bytes([], [], [0], docs=0))
    with pytest.raises(DataError, match=r"42 bytes, but 0 sequences and 0 document indices "
                                        r"need 34$"):
        read_index(idx, bin_, 0)


def test_a_bad_magic_is_named_by_its_nine_bytes(tmp_path: Path) -> None:
    """The message shows the 9 bytes read where the magic belongs."""
    idx, bin_ = write_index(tmp_path, b"XXXXXXXXXY" + index_bytes([], [], [0])[10:])
    with pytest.raises(DataError, match=r"it starts with b'XXXXXXXXX', not the magic"):
        read_index(idx, bin_, 0)


def test_a_negative_sequence_length_is_named(tmp_path: Path) -> None:
    """A negative length is refused before any pointer is checked, naming the sequence."""
    idx, bin_ = write_index(tmp_path, index_bytes([2, -1, 3], [0, 4, 2], [0, 3]))
    with pytest.raises(DataError, match=r"d.idx is not a Megatron index: sequence 1 has a "
                                        r"negative length$"):
        read_index(idx, bin_, 8)


def test_an_empty_sequence_is_a_valid_empty_document(tmp_path: Path) -> None:
    """Length 0 is allowed: documents [5, 6], [], [7] are tokens [0, 2), [2, 2), [2, 3)."""
    idx, bin_ = write_index(tmp_path, index_bytes([2, 0, 1], [0, 4, 4], [0, 1, 2, 3]))
    assert read_index(idx, bin_, 6).starts.tolist() == [0, 2, 2, 3]


def test_a_pointer_out_of_place_is_named_with_the_byte_it_should_be(tmp_path: Path) -> None:
    """uint16 sequences of 3, 1, 4 tokens start at bytes 0, 6, 8 of the .bin; a pointer of 9
    for sequence 2 is refused, naming 9 and the 8 it must be (the first wrong pointer)."""
    idx, bin_ = write_index(tmp_path, index_bytes([3, 1, 4], [0, 6, 9], [0, 3]))
    with pytest.raises(DataError, match=r"sequence 2 starts at byte 9 of the .bin, not right "
                                        r"after the sequence before it \(byte 8\)"):
        read_index(idx, bin_, 16)


@pytest.mark.parametrize("doc_index", [
    [1, 2],     # does not start at sequence 0
    [0, 1],     # ends before the last of the 2 sequences
    [0, 2, 1, 2],  # goes back
])
def test_document_indices_must_run_from_0_to_the_sequence_count_in_order(
        tmp_path: Path, doc_index: list[int]) -> None:
    """Each of the three rules on its own: first 0, last S, never decreasing."""
    idx, bin_ = write_index(tmp_path, index_bytes([1, 1], [0, 2], doc_index))
    with pytest.raises(DataError, match=r"d.idx is not a Megatron index: its document indices "
                                        r"do not run from 0 to 2 in order$"):
        read_index(idx, bin_, 4)


def test_a_document_of_no_sequences_is_an_empty_document(tmp_path: Path) -> None:
    """Equal neighbouring document indices are allowed: [0, 1, 1, 2] is documents of 1, 0
    and 1 sequences (tokens [0, 2), [2, 2), [2, 5) for lengths 2 and 3)."""
    idx, bin_ = write_index(tmp_path, index_bytes([2, 3], [0, 4], [0, 1, 1, 2]))
    assert read_index(idx, bin_, 10).starts.tolist() == [0, 2, 2, 5]


def test_a_dataset_named_by_its_bin_reads_through_the_idx_beside_it(tmp_path: Path) -> None:
    """``uris: [NAME.bin]`` with ``format: megatron`` is the same dataset as NAME.idx."""
    write_dataset(str(tmp_path / "d"), [[5, 6], [7]], "uint16")
    fmt = MEGATRON.for_source(SOURCE)
    sf = listed(tmp_path / "d.bin")
    chunks = fmt.cut(0, sf, 1 << 20, None)
    assert [(c.start, c.stop) for c in chunks] == [(0, 2)]
    got = [(pos, ids.tolist()) for pos, ids in fmt.reader([sf], "").records(chunks[0])]
    assert got == [(0, [5, 6]), (1, [7])]


def test_a_bin_without_its_idx_names_the_missing_file(tmp_path: Path) -> None:
    """The missing file's kind is its extension, even under a directory with a dot in its
    name (``v1.2/d.idx``: "its idx file")."""
    root = tmp_path / "v1.2"
    root.mkdir()
    write_dataset(str(root / "d"), [[5]], "uint16")
    (root / "d.idx").unlink()
    with pytest.raises(ConfigError, match=rf"^{root / 'd.bin'} is a Megatron dataset without "
                                          rf"its idx file: {root / 'd.idx'} does not exist$"):
        MEGATRON.for_source(SOURCE).cut(0, listed(root / "d.bin"), 1 << 20, None)


def test_read_one_reads_documents_0_to_n_minus_1_and_no_other(tmp_path: Path) -> None:
    """The first and last documents are read by reference; -1 and n are refused, named."""
    write_dataset(str(tmp_path / "d"), [[5, 6], [7], [8, 9, 10]], "uint16")
    reader = MEGATRON.for_source(SOURCE).reader([listed(tmp_path / "d.idx")], "")
    assert reader.read_one((0, 0)).tolist() == [5, 6]
    assert reader.read_one((0, 2)).tolist() == [8, 9, 10]
    for pos in (-1, 3):
        with pytest.raises(DataError, match=rf"d.idx has 3 documents, no document {pos}; "):
            reader.read_one((0, pos))
    assert reader.fields(0) == []  # token ids: no named fields
    assert MEGATRON.unit == "document"  # a bad record is named "at document N"


def test_close_closes_the_bin_files_it_read(tmp_path: Path) -> None:
    """A reader keeps its .bin open between reads and closes it on close()."""
    write_dataset(str(tmp_path / "d"), [[5, 6]], "uint16")
    reader = MEGATRON.for_source(SOURCE).reader([listed(tmp_path / "d.idx")], "")
    reader.read_one((0, 0))
    assert open_fds(tmp_path / "d.bin") == 1
    reader.close()
    assert open_fds(tmp_path / "d.bin") == 0


def test_a_compressed_dataset_is_refused(tmp_path: Path) -> None:
    """Documents are read in place by byte range, which a compressed file cannot give."""
    write_dataset(str(tmp_path / "d"), [[5]], "uint16")
    sf = dataclasses.replace(listed(tmp_path / "d.idx"), compression="gzip")
    with pytest.raises(ConfigError, match=r"d.idx: Megatron datasets are read in place by "
                                          r"document; store them uncompressed"):
        MEGATRON.for_source(SOURCE).cut(0, sf, 1 << 20, None)


def test_too_few_chunks_names_both_chunk_settings() -> None:
    """A Megatron source cut into too few chunks is told of chunk_bytes and chunk_rows."""
    assert MEGATRON.fewer_chunks_hint([], "sources[0]") == (
        "set a smaller sources[0].chunk_bytes (token bytes per chunk) or "
        "sources[0].chunk_rows (documents per chunk), add datasets")


def test_the_writer_points_the_second_of_two_documents_past_the_first(tmp_path: Path) -> None:
    """Two int32 documents of 3 and 1 tokens: pointers 0 and 12 (3 tokens of 4 bytes)."""
    write_dataset(str(tmp_path / "d"), [[5, 6, 7], [8]], "int32")
    assert (tmp_path / "d.idx").read_bytes() == index_bytes([3, 1], [0, 12], [0, 1, 2], code=4)
