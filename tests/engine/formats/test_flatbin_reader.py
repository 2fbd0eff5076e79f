"""Flat token files read chunk by chunk (:class:`~datalane.engine.formats.flatbin.FlatbinReader`)
and the format's settings, by hand.

Files are written here (uint16 ids back to back; offsets with ``np.save``). With a boundary id
(1 here) a document's position is its first token's index; with an offsets file, its index.
Every expected document below is worked out from the ids written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datalane.engine.chunks import Chunk
from datalane.engine.formats.flatbin import Flatbin
from datalane.spec.errors import ConfigError, DataError
from datalane.spec.recipe import Source
from datalane.spec.tokens import TokensSpec
from tests.engine.formats.test_flatbin_hostile import u16_file

# documents ended by the boundary id 1 (the last unended): tokens 0-2, 3, 4-8, 9-10, 11-12
IDS = [5, 6, 1, 1, 7, 8, 9, 10, 1, 11, 1, 12, 13]


def lists(records: object) -> list[tuple[int, list[int]]]:
    return [(p, np.asarray(r).tolist()) for p, r in records]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("chunk", "want"), [
    # a chunk yields the documents whose first token lies in it, each read whole
    ((0, 1), [(0, [5, 6, 1])]),
    ((1, 4), [(3, [1])]),                                       # after the boundary at 2
    ((4, 5), [(4, [7, 8, 9, 10, 1])]),                          # runs past the chunk's end
    ((5, 9), []),                                               # inside document 4-8 only
    ((5, 10), [(9, [11, 1])]),
    ((10, 13), [(11, [12, 13])]),                               # the unended last document
    ((12, 13), []),
])
def test_a_boundary_chunk_yields_the_documents_that_start_in_it(
        tmp_path: Path, chunk: tuple[int, int], want: list[tuple[int, list[int]]]) -> None:
    sf = u16_file(tmp_path / "f.bin", IDS)
    reader = Flatbin("ids", "uint16", 1).reader([sf], "")
    assert lists(reader.records(Chunk(0, *chunk))) == want


def test_offsets_documents_resume_at_an_index_and_stop_at_the_last(tmp_path: Path) -> None:
    """Documents [5, 6], [], [7, 8, 9], [10] (offsets 0 2 2 5 6): resumed at document 2 of a
    chunk of 0..3, documents 2 and 3; a chunk reaching past the last document ends there."""
    sf = u16_file(tmp_path / "f.bin", [5, 6, 7, 8, 9, 10])
    np.save(tmp_path / "f.offsets.npy", np.array([0, 2, 2, 5, 6], np.int64))
    reader = Flatbin("ids", "uint16", None).reader([sf], "")
    assert lists(reader.records(Chunk(0, 0, 4), start=2)) == [(2, [7, 8, 9]), (3, [10])]
    assert lists(reader.records(Chunk(0, 1, 9))) == [(1, []), (2, [7, 8, 9]), (3, [10])]
    assert reader.read_one((0, 3)).tolist() == [10]


def test_read_one_with_a_boundary_reads_the_document_at_its_first_token(tmp_path: Path) -> None:
    sf = u16_file(tmp_path / "f.bin", IDS)
    reader = Flatbin("ids", "uint16", 1).reader([sf], "")
    assert [reader.read_one((0, p)).tolist() for p in (0, 3, 4, 9, 11)] == [
        [5, 6, 1], [1], [7, 8, 9, 10, 1], [11, 1], [12, 13]]


def test_read_one_refuses_a_token_inside_a_document(tmp_path: Path) -> None:
    """A carried piece names its document by its first token; token 5 lies inside the
    document of tokens 4-8 (token 4 is no boundary), so no document starts there: refused,
    not read as the fragment [8, 9, 10, 1]. Token 3 follows the boundary at 2: a document."""
    sf = u16_file(tmp_path / "f.bin", IDS)
    reader = Flatbin("ids", "uint16", 1).reader([sf], "")
    with pytest.raises(DataError) as info:
        reader.read_one((0, 5))
    assert str(info.value) == (f"{sf.uri} has no document at token 5 (token 4 is 7, not the "
                               f"boundary 1); did the file change?")
    assert reader.read_one((0, 3)).tolist() == [1]


def test_a_resume_point_inside_a_document_is_refused(tmp_path: Path) -> None:
    """A chunk resumed at token 6 (inside the document of tokens 4-8) is refused, not read
    as the fragment [9, 10, 1] and the documents after it; resumed at token 9 (after the
    boundary at 8) or at 0, it reads on from there."""
    sf = u16_file(tmp_path / "f.bin", IDS)
    reader = Flatbin("ids", "uint16", 1).reader([sf], "")
    with pytest.raises(DataError) as info:
        list(reader.records(Chunk(0, 4, 13), start=6))
    assert str(info.value) == (f"{sf.uri} has no document at token 6 (token 5 is 8, not the "
                               f"boundary 1); did the file change?")
    assert lists(reader.records(Chunk(0, 4, 13), start=9)) == [(9, [11, 1]), (11, [12, 13])]
    assert lists(reader.records(Chunk(0, 0, 4), start=0)) == [(0, [5, 6, 1]), (3, [1])]


def test_the_format_takes_its_width_and_boundary_from_the_source(tmp_path: Path) -> None:
    """A source's ``tokens`` configure the shared format: positions are tokens with a
    boundary, documents without; a source without ``tokens`` cannot read flat files."""
    sf = u16_file(tmp_path / "f.bin", IDS)
    fmt = Flatbin().for_source(Source(name="ids", uris=["x"],
                                      tokens=TokensSpec(dtype="uint16", boundary=1)))
    assert fmt.unit == "token" and fmt.layout(sf).boundary == 1
    assert fmt.layout(sf).dtype == np.dtype("<u2")
    assert Flatbin("ids", "uint16", None).unit == "document"
    with pytest.raises(ConfigError) as info:
        Flatbin().for_source(Source(name="text", uris=["x"]))
    assert str(info.value) == ("source 'text' reads flat token files (flatbin), which hold "
                               "token ids, not text; set its `tokens` (at least `tokens: "
                               "{dtype: uint16}`)")


def test_what_to_change_for_more_chunks_and_what_a_record_decodes_to(tmp_path: Path) -> None:
    fmt = Flatbin("ids", "uint16", 1)
    assert fmt.fewer_chunks_hint([], "sources[2]") == (
        "set a smaller sources[2].chunk_bytes, add files")
    ids = np.array([5, 1], np.uint16)
    raw, reason, extra = fmt.decode(ids, "")
    assert raw is ids and reason is None and extra is None, "ids pass through undecoded"
    assert fmt.reader([u16_file(tmp_path / "f.bin", IDS)], "").fields(0) == []
