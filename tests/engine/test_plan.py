"""The plan stage: how files are cut into chunks and how chunks are dealt to lanes.

The plan (docs/architecture.md, One lane): per source, every file is cut into chunks (plain
JSONL: ``chunk_bytes`` byte ranges, a record belonging to the chunk its first byte lies in;
Parquet: row groups, or ``chunk_rows`` ranges inside them); per epoch the chunks are permuted by
a key of ``(seed, "chunks", source, epoch)`` and dealt round-robin, so lane ``l`` of ``L`` reads
``perm[l], perm[l+L], ...``. The files are written here with known sizes (every JSONL line is 16
bytes) so the chunks are known by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datalane import ConfigError, Knobs, Loader, load_recipe
from datalane.engine.formats.megatron import write_dataset
from datalane.engine.plan import Plan
from datalane.engine.rng import permutation
from tests.support.stages import doc_ids, recipe_dict, write_jsonl, write_tokenizer

LINE = 16  # bytes of '{"text": "dNN"}\n' for a two-digit NN


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """a.jsonl: documents 10-17 (8 lines, 128 bytes); b.jsonl: 20-24 (5 lines, 80 bytes);
    c.parquet: documents 30-39 in row groups of 4, 4 and 2 rows."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    a = write_jsonl(tmp_path / "a.jsonl", [f"d{i}" for i in range(10, 18)])
    b = write_jsonl(tmp_path / "b.jsonl", [f"d{i}" for i in range(20, 25)])
    assert Path(a).stat().st_size == 8 * LINE and Path(b).stat().st_size == 5 * LINE, (
        "the fixture's lines must be 16 bytes each")
    writer = pq.ParquetWriter(tmp_path / "c.parquet", pa.schema([("text", pa.string())]))
    for group in ([30, 31, 32, 33], [34, 35, 36, 37], [38, 39]):
        writer.write_table(pa.table({"text": [f"d{i}" for i in group]}))
    writer.close()
    return {"tok": tok, "a": a, "b": b, "c": str(tmp_path / "c.parquet")}


def plan_of(files: dict[str, str], lanes: int, sources: list[dict[str, Any]],
            **over: Any) -> Plan:
    return Plan.build(load_recipe(recipe_dict(files["tok"], sources, lanes=lanes,
                                              global_batch_size=lanes, **over)))


def spans(chunks: list[Any]) -> list[tuple[int, int, int]]:
    return [(c.file, c.start, c.stop) for c in chunks]


def jsonl_source(files: dict[str, str], **over: Any) -> dict[str, Any]:
    return {"name": "j", "uris": [files["a"], files["b"]], "chunk_bytes": 2 * LINE, **over}


def test_jsonl_files_are_cut_into_byte_ranges(files: dict[str, str]) -> None:
    [sp] = plan_of(files, 1, [jsonl_source(files)]).sources
    assert spans(sp.chunks) == [(0, 0, 32), (0, 32, 64), (0, 64, 96), (0, 96, 128),
                                (1, 0, 32), (1, 32, 64), (1, 64, 80)], (
        "plain JSONL must be cut into chunk_bytes ranges per file, the last one shorter")


def test_parquet_files_are_cut_into_row_groups_or_row_ranges(files: dict[str, str]) -> None:
    [sp] = plan_of(files, 1, [{"name": "p", "uris": [files["c"]]}]).sources
    assert spans(sp.chunks) == [(0, 0, 4), (0, 4, 8), (0, 8, 10)], (
        "Parquet without chunk_rows must make each row group one chunk")
    [sp] = plan_of(files, 1, [{"name": "p", "uris": [files["c"]], "chunk_rows": 3}]).sources
    assert spans(sp.chunks) == [(0, 0, 3), (0, 3, 4), (0, 4, 7), (0, 7, 8), (0, 8, 10)], (
        "chunk_rows must cut inside each row group, never across two")


@pytest.mark.parametrize("lanes", [1, 2, 3, 7])
def test_lane_l_reads_perm_l_then_every_lth_chunk(files: dict[str, str], lanes: int) -> None:
    [sp] = plan_of(files, lanes, [jsonl_source(files)]).sources
    n = 7
    for epoch in range(3):
        perm = permutation(n, 3, "chunks", "j", epoch)
        for lane in range(lanes):
            expected = [sp.chunks[perm[i]] for i in range(lane, n, lanes)]
            assert sp.lane_chunks(lane, epoch) == expected, (
                f"lane {lane} of {lanes} must read chunks perm[{lane}], perm[{lane}+{lanes}], "
                f"... of epoch {epoch}'s permutation {perm}")
        # lane l gets ceil((n - l) / L) chunks: with 7 chunks and 3 lanes that is 3, 2, 2
        assert [len(sp.lane_chunks(lane, epoch)) for lane in range(lanes)] == [
            len(range(lane, n, lanes)) for lane in range(lanes)], (
            "lane l must get ceil((chunks - l) / lanes) chunks")


@pytest.mark.parametrize("lanes", [1, 2, 3, 4, 7])
def test_every_chunk_is_dealt_exactly_once_per_epoch(files: dict[str, str], lanes: int) -> None:
    [sp] = plan_of(files, lanes, [jsonl_source(files)]).sources
    for epoch in range(4):
        dealt = [c for lane in range(lanes) for c in sp.lane_chunks(lane, epoch)]
        assert sorted(spans(dealt)) == sorted(spans(sp.chunks)), (
            f"epoch {epoch}: the {lanes} lanes together must read every chunk exactly once; "
            f"they read {sorted(spans(dealt))}")


def test_the_dealing_changes_with_the_epoch_the_seed_and_the_source(files: dict[str, str]) -> None:
    [sp] = plan_of(files, 2, [jsonl_source(files)]).sources

    def dealing(plan_source: Any, epoch: int) -> list[list[tuple[int, int, int]]]:
        return [spans(plan_source.lane_chunks(lane, epoch)) for lane in range(2)]

    epochs = [dealing(sp, e) for e in range(4)]
    assert len({repr(d) for d in epochs}) == 4, (
        f"each epoch must deal the chunks in a new order (the epoch is part of the key): "
        f"{epochs}")
    [other_seed] = plan_of(files, 2, [jsonl_source(files)], seed=4).sources
    assert dealing(other_seed, 0) != epochs[0], "the seed must be part of the dealing key"
    [other_name] = plan_of(files, 2, [jsonl_source(files, name="k")]).sources
    assert dealing(other_name, 0) != epochs[0], "the source name must be part of the key"
    again = plan_of(files, 2, [jsonl_source(files)]).sources[0]
    assert [dealing(again, e) for e in range(4)] == epochs, (
        "the dealing must be a pure function of (seed, source, epoch)")


def test_more_lanes_than_chunks_is_refused_naming_the_counts(files: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as err:
        plan_of(files, 8, [jsonl_source(files)])
    msg = str(err.value)
    assert "7 chunk(s) in 2 file(s)" in msg and "8 lanes" in msg, (
        f"more lanes than chunks must be refused naming both counts: {msg}")
    assert "chunk_bytes" in msg, f"the message must name the knob to lower: {msg}"
    with pytest.raises(ConfigError, match=r"3 chunk\(s\) in 1 file\(s\), but 4 lanes.*"
                                          r"chunk_rows"):
        plan_of(files, 4, [{"name": "p", "uris": [files["c"]]}])
    plan_of(files, 7, [jsonl_source(files)])  # exactly one chunk per lane is enough


def test_each_lane_reads_the_documents_of_its_chunks_in_dealt_order(files: dict[str, str]) -> None:
    """End to end: with block_size 1 and one two-token document per sequence, lane l's
    sequences are the documents of its dealt chunks, chunk after chunk, in file order."""
    lanes = 3
    recipe = load_recipe(recipe_dict(files["tok"], [jsonl_source(files)], lanes=lanes,
                                      global_batch_size=lanes, seq_len=1))
    plan = Plan.build(recipe)
    [sp] = plan.sources
    first = {0: 10, 1: 20}  # document id of each file's first line
    for lane in range(lanes):
        expected = []
        for c in sp.lane_chunks(lane, 0):  # the lines starting in [start, stop)
            expected += [first[c.file] + pos // LINE for pos in range(c.start, c.stop, LINE)]
        got: list[int] = []
        with Loader(recipe, lane, lanes, Knobs(workers=1), plan=plan) as loader:
            for _ in range(20):
                step = loader.next_step()
                got += doc_ids(step.input_ids)
                if step.ended:
                    break
        assert got == expected, (
            f"lane {lane} must read the records of its chunks {spans(sp.lane_chunks(lane, 0))} "
            f"in order")


def test_each_epochs_dealing_is_computed_once_and_few_are_kept(
        files: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every lane of a process asks the shared plan for its chunks of each epoch: the epoch's
    permutation is computed once for all of them; and a run over many epochs (a repeated
    source) keeps no more than five epochs' permutations, not one per epoch read."""
    import datalane.engine.plan as plan_module

    [sp] = plan_of(files, 3, [jsonl_source(files)]).sources
    calls: list[tuple[object, ...]] = []

    def counted(n: int, *key: object) -> list[int]:
        calls.append(key)
        return permutation(n, *key)

    monkeypatch.setattr(plan_module, "permutation", counted)
    first = [sp.lane_chunks(lane, 0) for lane in range(3)]
    assert [sp.lane_chunks(lane, 0) for lane in range(3)] == first
    assert calls == [(3, "chunks", "j", 0)], (
        f"epoch 0's dealing must be computed once for every lane and every ask: {calls}")
    for epoch in range(1, 50):
        sp.lane_chunks(0, epoch)
    assert len(calls) == 50 and len(sp._perms) <= 5, (
        f"after 50 epochs the plan holds {len(sp._perms)} permutations; at most 5")


def test_an_empty_source_names_its_first_three_files(files: dict[str, str],
                                                     tmp_path: Path) -> None:
    """Up to three empty files are all named; a fourth and more are ``...``."""
    empty = [str(tmp_path / f"e{i}.jsonl") for i in range(4)]
    for path in empty:
        Path(path).write_text("")
    for n, tail in ((3, ""), (4, ", ...")):
        with pytest.raises(ConfigError) as err:
            plan_of(files, 1, [{"name": "e", "uris": empty[:n]}])
        assert str(err.value) == (f"sources[0] 'e' has no data: its {n} file(s) are empty "
                                  f"({', '.join(empty[:3])}{tail})")


def test_the_recipes_format_reads_a_file_its_name_does_not_tell(files: dict[str, str],
                                                                 tmp_path: Path) -> None:
    """``format`` names the format of a file whose extension says nothing (``.txt``): its
    lines are cut as JSONL chunks, as the same bytes named ``.jsonl`` are."""
    plain = tmp_path / "lines.txt"
    plain.write_bytes(Path(files["a"]).read_bytes())
    [sp] = plan_of(files, 1, [{"name": "t", "uris": [str(plain)], "format": "jsonl",
                               "chunk_bytes": 2 * LINE}]).sources
    assert [f.format for f in sp.files] == ["jsonl"]
    assert spans(sp.chunks) == [(0, 0, 32), (0, 32, 64), (0, 64, 96), (0, 96, 128)]


def test_only_kinds_other_than_text_put_their_identity_in_the_fingerprint(
        files: dict[str, str], tmp_path: Path) -> None:
    """A text recipe keeps the fingerprint it always had (no ``documents`` entry); a source
    of another kind (pre-tokenized ids here) is named there with its kind, next to none for
    the text source beside it."""
    text = plan_of(files, 1, [jsonl_source(files)])
    assert "documents" not in text.fingerprint_doc
    write_dataset(str(tmp_path / "ids"), [np.arange(3, 9, dtype=np.int64)], "uint16")
    both = plan_of(files, 1, [jsonl_source(files), {
        "name": "ids", "uris": [str(tmp_path / "ids.idx")], "tokens": {}}])
    documents = both.fingerprint_doc["documents"]
    assert isinstance(documents, dict) and list(documents) == ["ids"], documents
    assert documents["ids"]["kind"] == "tokens", documents


def test_only_kinds_of_whole_documents_bound_a_document_by_the_sequence(
        files: dict[str, str]) -> None:
    """A text document longer than a sequence is split by the packer, never set aside: the
    text source's map stage has no longest document (a vision source's has the sequence's
    tokens: tests/engine/images/test_vision_kind.py)."""
    plan = plan_of(files, 1, [jsonl_source(files)], seq_len=4)
    assert [stage.longest for stage in plan.map_stages()] == [None]
