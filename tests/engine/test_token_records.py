"""A block of token-file documents held as arrays (:mod:`datalane.engine.tokenrecords`).

A lane reads a Megatron source a span of documents at a time; the block is the same block the
record-by-record read gives - the same records in the same shuffled order, the same start and
the same cursor after it - so nothing downstream can tell them apart. The records, the span
reads and the map stage's whole-span path are checked on hand-made values; the blocks of both
reads are compared on streams of many shapes (documents of 0 ids, blocks across chunks and
files, epochs, resumes, the two reads taking turns).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datalane import Knobs, Loader
from datalane.corpus import tokenizer_path
from datalane.engine import chunks, docstream
from datalane.engine.docstream import DocStream
from datalane.engine.formats import format_for, tokenfile
from datalane.engine.formats.base import Chunk
from datalane.engine.formats.flatbin import write_flat
from datalane.engine.formats.megatron import MegatronReader, write_dataset
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.engine.rng import permutation
from datalane.engine.tokenrecords import TokenRecords, shuffled
from datalane.spec.errors import ConfigError
from datalane.spec.recipe import load_recipe
from datalane.spec.state import Counters, SourceCursor
from tests.support.formats import listed_files


def _records() -> TokenRecords:
    # record 0: ids 0-2 of file 0 at position 4; record 1: no ids (file 0, position 7);
    # record 2: ids 3-9 of file 1 at position 2
    return TokenRecords([0, 0, 1], [4, 7, 2], np.arange(10, dtype=np.uint16),
                        np.array([0, 3, 3, 10]))


def _plain(records: Any) -> list[tuple[int, int, list[int]]]:
    return [(f, p, np.asarray(raw).tolist()) for f, p, raw in records]


def test_records_are_tuples_of_file_position_and_a_view_of_their_ids() -> None:
    r = _records()
    assert len(r) == 3
    assert _plain(r) == [(0, 4, [0, 1, 2]), (0, 7, []), (1, 2, [3, 4, 5, 6, 7, 8, 9])]
    assert _plain([r[0], r[1], r[2]]) == _plain(r)
    assert _plain([r[-1], r[-3]]) == [(1, 2, [3, 4, 5, 6, 7, 8, 9]), (0, 4, [0, 1, 2])]
    assert r[2][2].base is not None and r[2][2].dtype == np.uint16  # a view, as read
    for bad in (3, -4):
        with pytest.raises(IndexError, match=f"record {bad} of 3"):
            r[bad]


def test_a_slice_shares_the_buffer_and_gives_its_ids_end_to_end() -> None:
    r = _records()
    tail = r[1:3]
    assert isinstance(tail, TokenRecords) and tail.buf is r.buf
    assert _plain(tail) == [(0, 7, []), (1, 2, [3, 4, 5, 6, 7, 8, 9])]
    ids, lens = tail.tokens()
    assert ids.tolist() == [3, 4, 5, 6, 7, 8, 9] and lens.tolist() == [0, 7]
    ids, lens = r.tokens()
    assert ids.tolist() == list(range(10)) and lens.tolist() == [3, 0, 7]
    empty = r[2:1]
    assert len(empty) == 0 and _plain(empty) == []
    assert empty.tokens()[0].tolist() == [] and empty.tokens()[1].tolist() == []
    assert _plain(r[-2:]) == _plain(tail)
    with pytest.raises(ValueError, match="not by step 2"):
        r[::2]


def test_records_refuse_arrays_that_disagree_and_pickle_as_a_list() -> None:
    with pytest.raises(ValueError, match="2 files, 3 positions and 4 offsets"):
        TokenRecords([0, 0], [1, 2, 3], np.zeros(3, np.uint16), np.array([0, 1, 2, 3]))
    back = pickle.loads(pickle.dumps(_records()))  # (to a map process)
    assert type(back) is list and _plain(back) == _plain(_records())


def test_shuffled_permutes_the_records_of_its_spans_as_a_list_of_them() -> None:
    spans = [(0, np.array([5, 6, 7]), np.array([1, 1, 2, 3, 3, 3], np.uint16),
              np.array([0, 2, 3, 6])),
             (2, np.array([0, 1]), np.array([4, 5, 5], np.uint16), np.array([0, 1, 3]))]
    in_order = [(0, 5, [1, 1]), (0, 6, [2]), (0, 7, [3, 3, 3]), (2, 0, [4]), (2, 1, [5, 5])]
    order = permutation(5, "key", 1)
    assert order != list(range(5))  # (the key shuffles)
    got = shuffled(spans, "key", 1)
    assert _plain(got) == [in_order[i] for i in order]
    ids, lens = got.tokens()
    assert ids.tolist() == [t for i in order for t in in_order[i][2]]
    assert lens.tolist() == [len(in_order[i][2]) for i in order]
    assert ids.dtype == np.uint16


def test_shuffled_keeps_a_record_without_ids_in_its_place() -> None:
    got = shuffled([(3, np.array([0, 1, 2]), np.array([7, 8], np.uint32),
                     np.array([0, 1, 1, 2]))], "k")
    in_order = [(3, 0, [7]), (3, 1, []), (3, 2, [8])]
    assert _plain(got) == [in_order[i] for i in permutation(3, "k")]


# -- span reads ---------------------------------------------------------------------------


@pytest.fixture
def dataset(tmp_path: Path) -> MegatronReader:
    write_dataset(str(tmp_path / "d"), [[1, 2, 3], [], [4, 5, 6, 7, 8], [9, 10]], "uint16")
    return MegatronReader(listed_files(str(tmp_path / "d.idx"), None), None, "ids")


def test_a_span_is_documents_first_to_stop_in_one_read(dataset: MegatronReader) -> None:
    whole = Chunk(0, 0, 4)
    first, stop, ids, offs = dataset.span(whole, None, 10)  # type: ignore[misc]
    assert (first, stop) == (0, 4)
    assert ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] and offs.tolist() == [0, 3, 3, 8, 10]
    first, stop, ids, offs = dataset.span(whole, 2, 1)  # type: ignore[misc]
    assert (first, stop, ids.tolist(), offs.tolist()) == (2, 3, [4, 5, 6, 7, 8], [0, 5])
    first, stop, ids, offs = dataset.span(Chunk(0, 1, 3), None, 10)  # type: ignore[misc]
    assert (first, stop, ids.tolist(), offs.tolist()) == (1, 3, [4, 5, 6, 7, 8], [0, 0, 5])
    first, stop, ids, offs = dataset.span(whole, 4, 10)  # type: ignore[misc]  # (none left)
    assert (first, stop, ids.tolist(), offs.tolist()) == (4, 4, [], [0])
    # a chunk said to run past the documents ends with them
    first, stop, ids, offs = dataset.span(Chunk(0, 2, 10), None, 100)  # type: ignore[misc]
    assert (first, stop, ids.tolist(), offs.tolist()) == (2, 4, [4, 5, 6, 7, 8, 9, 10],
                                                          [0, 5, 7])


def test_a_span_over_its_bounds_is_read_record_by_record(
        dataset: MegatronReader, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = Chunk(0, 0, 4)
    monkeypatch.setattr(tokenfile, "MAX_RECORD_BYTES", 8)  # document 2: 10 bytes
    assert dataset.span(whole, None, 10) is None
    assert dataset.span(whole, 3, 10) is not None  # (document 3 alone: 4 bytes)
    monkeypatch.setattr(tokenfile, "MAX_RECORD_BYTES", 10)
    assert dataset.span(whole, None, 10) is not None
    monkeypatch.setattr(tokenfile, "SPAN_BYTES", 19)  # the 4 documents: 20 bytes
    assert dataset.span(whole, None, 10) is None
    assert dataset.span(whole, None, 3) is not None  # (16 bytes)
    monkeypatch.setattr(tokenfile, "SPAN_BYTES", 20)
    assert dataset.span(whole, None, 10) is not None


# -- the map stage -------------------------------------------------------------------------


def _stage(tmp_path: Path) -> Any:
    write_dataset(str(tmp_path / "s"), [[1]], "uint16")
    recipe = load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 16, "seed": 3,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [{"name": "ids", "uris": [str(tmp_path / "s.idx")], "tokens": {}}],
        "bad_records": "skip"})
    plan = Plan.build(recipe)
    return plan.map_stages()[0], plan.sources[0]


def _result(res: Any) -> tuple[Any, ...]:
    return ({k: v.tolist() for k, v in res.columns.items()}, res.offsets.tolist(), res.status,
            res.detail, res.bounds, res.set_aside)


@pytest.mark.parametrize("docs, status", [
    ([[5, 6], [7], [8, 9, 10]], [None, None, None]),
    ([[5, 6], [], [8]], [None, "empty_ids", None]),
    ([[5, 6], [7, 5000], [8]], [None, "token_out_of_range", None]),
])
def test_the_map_stage_maps_token_records_as_the_same_records_in_a_list(
        tmp_path: Path, docs: list[list[int]], status: list[str | None]) -> None:
    stage, source = _stage(tmp_path)
    formats = [format_for(f.format, source.source) for f in source.files]
    lens = [len(d) for d in docs]
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    records = TokenRecords([0] * len(docs), list(range(len(docs))),
                           np.array([t for d in docs for t in d], np.uint16), offs)
    got = stage.run(records, formats)
    assert _result(got) == _result(stage.run(list(records), formats))
    assert got.status == status
    kept = [d for d, s in zip(docs, status, strict=True) if s is None]
    assert got.columns["input_ids"].tolist() == [t for d in kept for t in d]
    assert got.columns["input_ids"].dtype == np.int32


def test_a_task_of_token_records_is_mapped_without_walking_its_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stage, source = _stage(tmp_path)
    formats = [format_for(f.format, source.source) for f in source.files]
    records = TokenRecords([0, 0], [0, 1], np.array([5, 6, 7], np.uint16), np.array([0, 2, 3]))

    def walked(values: Any) -> None:
        raise AssertionError("the values were walked one by one")

    monkeypatch.setattr(stage.kind, "tokenize_values", walked)
    monkeypatch.setattr(stage, "_whole", walked)
    got = stage.run(records, formats)
    assert got.columns["input_ids"].tolist() == [5, 6, 7] and got.bounds == [0, 2, 3]


def test_token_records_the_span_path_refuses_are_mapped_as_a_whole_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stage, source = _stage(tmp_path)
    formats = [format_for(f.format, source.source) for f in source.files]
    records = TokenRecords([0, 0], [0, 1], np.array([5, 6, 7], np.uint32), np.array([0, 2, 3]))
    assert stage.kind.tokenize_span(*records.tokens()) is None  # (uint32: not the common case)

    def rendered(*args: Any) -> None:
        raise AssertionError("the records were mapped one at a time")

    monkeypatch.setattr(stage, "_render", rendered)
    got = stage.run(records, formats)
    assert got.columns["input_ids"].tolist() == [5, 6, 7] and got.bounds == [0, 2, 3]


def test_tokenize_span_takes_only_the_common_case(tmp_path: Path) -> None:
    stage, _ = _stage(tmp_path)
    kind = stage.kind
    ids = np.array([3, 4, 5], np.uint16)
    cols, offsets, lens = kind.tokenize_span(ids, np.array([2, 1]))
    assert cols["input_ids"].tolist() == [3, 4, 5] and cols["input_ids"].dtype == np.int32
    assert offsets.tolist() == [0, 2, 3] and lens.tolist() == [2, 1]
    ids32 = np.array([3, 4, 5], np.int32)  # (a copy even when the ids are int32 already:
    cols, _, _ = kind.tokenize_span(ids32, np.array([3]))  # a task never pins its block)
    assert cols["input_ids"].tolist() == [3, 4, 5] and not np.shares_memory(cols["input_ids"],
                                                                            ids32)
    vocab = kind.vocab_size
    refused = [
        (ids, np.array([], np.int64)),  # no document
        (ids, np.array([3, 0])),  # an empty one
        (np.array([3, vocab], np.uint16), np.array([1, 1])),  # an id past the vocabulary
        (np.array([3, vocab], np.int32), np.array([2])),
        (np.array([3], np.int64), np.array([1])),  # int64: int32 may not hold its ids
        (np.array([3, -1], np.int16), np.array([1, 1])),  # a negative id
        (np.array([3.0, 4.0]), np.array([1, 1])),  # not integers
        (np.array([3, 4], np.uint32), np.array([1, 1])),  # uint32: int32 may not hold
    ]
    for bad_ids, bad_lens in refused:
        assert kind.tokenize_span(bad_ids, bad_lens) is None, (bad_ids, bad_lens)
    assert vocab < 1 << 15  # (the ids below fit every type)
    cols, offsets, _ = kind.tokenize_span(np.array([3, 4, vocab - 1], np.int32), np.array([3]))
    assert cols["input_ids"].tolist() == [3, 4, vocab - 1] and offsets.tolist() == [0, 3]
    cols, offsets, _ = kind.tokenize_span(np.array([0, 4], np.int16), np.array([1, 1]))
    assert cols["input_ids"].tolist() == [0, 4] and offsets.tolist() == [0, 1, 2]  # (0 is an id)


# -- the two reads give the same blocks ----------------------------------------------------


@pytest.fixture(scope="module")
def pool() -> Iterator[TaskPool]:
    with TaskPool(1) as p:
        yield p


def _stream(root: Path, chunk_rows: int, block: int, lanes: int, lane: int, pool: TaskPool,
            cursor: SourceCursor | None = None, reads: str = "spans",
            fmt: str = "megatron") -> DocStream:
    source: dict[str, Any] = {"name": "ids", "epochs": 2, "chunk_rows": chunk_rows}
    if fmt == "megatron":
        source.update(uris=[str(root / "*.idx")], tokens={})
    elif fmt == "offsets":  # flat files listed in offsets files
        source.update(uris=[str(root / "*.u16")], tokens={"dtype": "uint16"})
    else:  # flat files whose documents end with the id 0: chunks of bytes
        source.update(uris=[str(root / "*.u16")], chunk_rows=None, chunk_bytes=8 * chunk_rows,
                      tokens={"dtype": "uint16", "boundary": 0})
    recipe = load_recipe({
        "lanes": lanes, "global_batch_size": lanes, "seq_len": 16, "seed": 5,
        "tokenizer": {"uri": tokenizer_path()}, "sources": [source],
        "shuffle": {"block_size": block}, "bad_records": "skip"})
    plan = Plan.build(recipe)
    stream = DocStream(plan.sources[0], lane, plan.map_stages()[0], pool, Knobs(workers=1),
                       block, "skip", Counters(), cursor)
    span = stream._reader.span
    if reads == "records":
        stream._reader.span = lambda *a: None  # type: ignore[method-assign]
    elif reads == "turns":  # every other span refused: the two reads hand over to each other
        calls = iter(range(1 << 30))
        stream._reader.span = (  # type: ignore[method-assign]
            lambda *a: span(*a) if next(calls) % 2 else None)
    return stream


def _blocks(stream: DocStream) -> list[tuple[Any, ...]]:
    out = []
    while (block := stream._read_block()) is not None:
        out.append((block.epoch, block.index, block.chunk, block.pos, block.after,
                    type(block.records).__name__,
                    [(f, p, raw.dtype.str, raw.tolist()) for f, p, raw in block.records]))
    stream.close()
    return out


def _write(root: Path, files: list[list[int]], fmt: str = "megatron") -> None:
    """Document ``k`` of the source: ``n`` ids ``k % 1000 + 1`` (a boundary file: and its id 0
    last, so never empty)."""
    k = 0
    for f, lengths in enumerate(files):
        docs = [[(k + d) % 1000 + 1] * n for d, n in enumerate(lengths)]
        k += len(lengths)
        if fmt == "megatron":
            write_dataset(str(root / f"part-{f}"), docs, "uint16")
        else:
            write_flat(str(root / f"part-{f}.u16"), [d + [0] for d in docs] if
                       fmt == "boundary" else docs, offsets=fmt == "offsets")


def _same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> None:
    assert [x[:5] + x[6:] for x in a] == [x[:5] + x[6:] for x in b]


def test_spans_and_records_give_the_same_blocks_by_hand(tmp_path: Path,
                                                         pool: TaskPool) -> None:
    # two files of 5 and 4 documents (one without ids), chunks of 2 documents, blocks of 3:
    # blocks cross chunks and files; the last block of each epoch is short
    _write(tmp_path, [[2, 0, 3, 1, 4], [5, 2, 1, 3]])
    spans = _blocks(_stream(tmp_path, 2, 3, 1, 0, pool))
    records = _blocks(_stream(tmp_path, 2, 3, 1, 0, pool, reads="records"))
    _same(spans, records)
    assert {x[5] for x in spans} == {"TokenRecords"} and {x[5] for x in records} == {"list"}
    # 9 documents an epoch, 2 epochs: blocks 3, 3, 3 each
    assert [(x[0], x[1], len(x[6])) for x in spans] == [
        (0, 0, 3), (0, 1, 3), (0, 2, 3), (1, 0, 3), (1, 1, 3), (1, 2, 3)]
    assert sorted((f, p) for x in spans[:3] for f, p, _, _ in x[6]) == [
        (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3)]
    # where each block starts and where the next one does, from the lane's chunks in its
    # reading order: records listed chunk by chunk, 3 a block
    stream = _stream(tmp_path, 2, 3, 1, 0, pool)
    for epoch in (0, 1):
        listed = [(k, pos) for k, c in enumerate(stream.source.lane_chunks(0, epoch))
                  for pos in range(c.start, c.stop)]
        assert len(listed) == 9
        for b in range(3):
            got = spans[3 * epoch + b]
            assert (got[2], got[3]) == listed[3 * b]
            assert got[4] == (SourceCursor(epoch, b + 1, *listed[3 * b + 3], 0) if b < 2
                              else SourceCursor(epoch + 1, 0, 0, -1, 0))
    stream.close()


def test_a_block_over_datasets_of_two_id_types_is_read_record_by_record(
        tmp_path: Path, pool: TaskPool) -> None:
    write_dataset(str(tmp_path / "a"), [[1, 2], [3]], "uint16")
    write_dataset(str(tmp_path / "b"), [[4], [5, 6]], "int32")
    spans = _blocks(_stream(tmp_path, 2, 4, 1, 0, pool))
    _same(spans, _blocks(_stream(tmp_path, 2, 4, 1, 0, pool, reads="records")))
    assert [x[5] for x in spans] == ["list", "list"]  # (each epoch one block of both)
    assert sorted((p, dtype) for f, p, dtype, _ in spans[0][6]) == [
        (0, "<i4"), (0, "<u2"), (1, "<i4"), (1, "<u2")]


@pytest.mark.parametrize("fmt", ["megatron", "offsets", "boundary"])
@settings(max_examples=30, derandomize=True, deadline=None)
@given(files=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=9), min_size=1,
                      max_size=3),
       chunk_rows=st.integers(1, 5), block=st.integers(1, 7), lanes=st.integers(1, 3),
       data=st.data())
def test_spans_records_and_their_turns_give_the_same_blocks(
        tmp_path_factory: pytest.TempPathFactory, pool: TaskPool, fmt: str,
        files: list[list[int]], chunk_rows: int, block: int, lanes: int,
        data: st.DataObject) -> None:
    root = tmp_path_factory.mktemp("spans")
    _write(root, files, fmt)
    lane = data.draw(st.integers(0, lanes - 1))

    def blocks(reads: str, cursor: SourceCursor | None = None) -> list[tuple[Any, ...]]:
        return _blocks(_stream(root, chunk_rows, block, lanes, lane, pool, cursor, reads, fmt))

    try:
        records = blocks("records")
    except ConfigError as e:  # fewer chunks than lanes
        assert "lanes each need at least one" in str(e)
        return
    for reads in ("spans", "turns"):
        got = blocks(reads)
        _same(got, records)
        if fmt != "boundary" and reads == "spans":
            assert all(x[5] == "TokenRecords" for x in got)
    # a resume at any block's start reads the rest again, the same; so does one from the
    # cursor the block before it gave
    if records:
        k = data.draw(st.integers(0, len(records) - 1))
        epoch, index, chunk, pos = records[k][:4]
        _same(blocks("spans", SourceCursor(epoch, index, chunk, pos, 0)), records[k:])
        if k > 0 and records[k - 1][4].epoch == epoch:
            _same(blocks("spans", records[k - 1][4]), records[k:])


def test_a_loader_over_spans_makes_the_steps_records_do(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    rng = np.random.default_rng(7)
    _write(tmp_path, [rng.integers(1, 40, 60).tolist(), rng.integers(1, 40, 45).tolist()])
    recipe = load_recipe({
        "lanes": 2, "global_batch_size": 4, "seq_len": 32, "seed": 1,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [{"name": "ids", "uris": [str(tmp_path / "*.idx")], "epochs": 2,
                     "tokens": {}, "chunk_rows": 7}],
        "shuffle": {"block_size": 16}})

    def run() -> list[dict[int, bytes]]:
        with Loader(recipe, 0, 1, Knobs(workers=1)) as loader:
            out = []
            while not (step := loader.next_step()).ended:
                out.append(step.lane_digests)
            return out

    blocks = []
    real = docstream.shuffled
    monkeypatch.setattr(docstream, "shuffled", lambda *a: blocks.append(1) or real(*a))
    spans = run()
    assert len(blocks) > 10  # (blocks of 16 of 105 documents, 2 epochs, 2 lanes)
    monkeypatch.setattr(chunks.RecordReader, "span", lambda self, *a: None)
    assert run() == spans and len(spans) > 10


@pytest.mark.slow
def test_token_records_go_to_a_map_process_as_records(tmp_path: Path) -> None:
    """A map process gets a task's records one by one (pickled as a list) and maps them as
    the thread maps the arrays: the same steps."""
    rng = np.random.default_rng(3)
    _write(tmp_path, [rng.integers(1, 40, 50).tolist()])
    recipe = load_recipe({
        "lanes": 1, "global_batch_size": 2, "seq_len": 32, "seed": 1,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [{"name": "ids", "uris": [str(tmp_path / "*.idx")], "epochs": 1,
                     "tokens": {}}],
        "shuffle": {"block_size": 16}})

    def run(knobs: Knobs) -> list[dict[int, bytes]]:
        with Loader(recipe, 0, 1, knobs) as loader:
            out = []
            while not (step := loader.next_step()).ended:
                out.append(step.lane_digests)
            return out

    threads = run(Knobs(workers=1))
    assert run(Knobs(workers=1, map_processes=1)) == threads and len(threads) > 5
