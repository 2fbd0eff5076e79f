"""Pre-tokenized sources end to end: Megatron datasets,
flat token files (boundary id and offsets file), Parquet id columns, mixed with text.

The token corpus is written here by hand: document ``i`` is ``[MARK, 3 + i // 1000,
3 + i % 1000, body..., EOS]`` with body ids in ``[3, 1024)`` (the bundled tokenizer's
vocabulary is 1,024; ``MARK`` is ``<|bos|>`` = 0, which no body id and no text document uses,
``EOS`` is ``<|eos|>`` = 1). Documents are counted from the batches alone - each lane's
tokens, split at ``MARK`` - not from datalane's counters, so "every document exactly once per
epoch" is checked independently of the engine.
"""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from datalane.corpus import DemoCorpus, tokenizer_path
from datalane.engine import Loader, Plan
from datalane.engine.formats.flatbin import write_flat
from datalane.engine.formats.megatron import write_dataset
from datalane.runner import run_world
from datalane.spec.errors import DataError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe, load_recipe
from tests.support import paths

MARK, EOS, VOCAB = 0, 1, 1024
ROOT = paths.REPO


def document(i: int, body: int, rng: np.random.Generator) -> np.ndarray:
    head = [MARK, 3 + i // 1000, 3 + i % 1000]
    return np.array([*head, *rng.integers(3, VOCAB, size=body).tolist(), EOS], np.int64)


def doc_id(doc: np.ndarray) -> int:
    return int(doc[1] - 3) * 1000 + int(doc[2] - 3)


class TokenCorpus:
    """Documents by id, and the files holding them, per source."""

    def __init__(self, root: Path) -> None:
        rng = np.random.default_rng(11)
        self.root = root
        self.docs: dict[int, np.ndarray] = {}
        self.by_source: dict[str, list[int]] = {}

        def make(name: str, first: int, n: int, lo: int, hi: int) -> list[np.ndarray]:
            out = [document(first + k, int(rng.integers(lo, hi)), rng) for k in range(n)]
            for k, d in enumerate(out):
                self.docs[first + k] = d
            self.by_source[name] = list(range(first, first + n))
            return out

        (root / "meg").mkdir()
        meg = make("meg", 0, 300, 0, 200)
        write_dataset(str(root / "meg" / "a"), meg[:180], "uint16")
        write_dataset(str(root / "meg" / "b"), meg[180:], "int32")
        (root / "flat").mkdir()
        flat = make("flat", 1000, 200, 0, 150)  # ended by EOS: boundary 1
        write_flat(str(root / "flat" / "a.u16"), flat[:120], "uint16")
        write_flat(str(root / "flat" / "b.u16"), flat[120:], "uint16")
        (root / "offs").mkdir()
        offs = make("offs", 2000, 150, 0, 150)
        write_flat(str(root / "offs" / "a.bin"), offs, "uint32", offsets=True)
        (root / "pq").mkdir()
        rows = make("pq", 3000, 160, 0, 150)
        for s in range(2):
            part = rows[s * 80:(s + 1) * 80]
            pq.write_table(pa.table({"input_ids": pa.array([d.tolist() for d in part],
                                                           pa.list_(pa.int32()))}),
                           root / "pq" / f"{s}.parquet", row_group_size=20)
        # long documents for carried pieces: several sequences each
        (root / "long").mkdir()
        long = make("long", 5000, 12, 150, 400)
        write_dataset(str(root / "long" / "a"), long, "uint16")
        write_flat(str(root / "long" / "a.u16"), long, "uint16")

    def sources(self, epochs: int | None = 1) -> list[dict[str, Any]]:
        r = self.root
        return [
            {"name": "meg", "uris": [str(r / "meg" / "*.idx")], "tokens": {}, "epochs": epochs,
             "chunk_rows": 16},
            {"name": "flat", "uris": [str(r / "flat" / "*.u16")], "epochs": epochs,
             "tokens": {"boundary": EOS}, "chunk_bytes": 2048},
            {"name": "offs", "uris": [str(r / "offs" / "a.bin")], "format": "flatbin",
             "epochs": epochs, "tokens": {"dtype": "uint32"}, "chunk_rows": 10},
            {"name": "pq", "uris": [str(r / "pq" / "*.parquet")], "tokens": {},
             "epochs": epochs, "chunk_rows": 10},
        ]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> TokenCorpus:
    return TokenCorpus(tmp_path_factory.mktemp("tokens"))


def recipe_of(sources: list[dict[str, Any]], **top: Any) -> Recipe:
    data: dict[str, Any] = {"lanes": 4, "global_batch_size": 8, "seq_len": 64, "seed": 3,
                            "tokenizer": {"uri": tokenizer_path()}, "sources": sources,
                            "shuffle": {"block_size": 16}}
    data.update(top)
    return load_recipe(data)


def lane_streams(recipe: Recipe, workers: int = 2) -> list[np.ndarray]:
    """Each lane's delivered tokens (padding dropped), in order, read until the data ends."""
    per = recipe.lane_batch
    out: list[list[np.ndarray]] = [[] for _ in range(recipe.lanes)]
    with Loader(recipe, 0, 1, Knobs(workers=workers)) as ld:
        while True:
            step = ld.next_step()
            for lane in range(recipe.lanes):
                ids = step.input_ids[lane * per:(lane + 1) * per]
                pos = step.positions[lane * per:(lane + 1) * per]
                out[lane].append(ids[pos >= 0])
            if step.ended:
                break
    return [np.concatenate(parts) for parts in out]


def split_documents(stream: np.ndarray) -> list[np.ndarray]:
    starts = np.flatnonzero(stream == MARK)
    assert len(stream) == 0 or starts[0] == 0, "a lane's stream starts with a document"
    return np.split(stream, starts[1:]) if len(starts) else []


def test_every_document_of_every_token_format_is_read_exactly_once_per_epoch(
        tokens: TokenCorpus) -> None:
    recipe = recipe_of(tokens.sources(epochs=2))
    seen: collections.Counter[int] = collections.Counter()
    for stream in lane_streams(recipe):
        for doc in split_documents(stream):
            i = doc_id(doc)
            assert np.array_equal(doc, tokens.docs[i]), f"document {i} arrived changed"
            seen[i] += 1
    expected = {i for ids in tokens.by_source.values() for i in ids} - set(
        tokens.by_source["long"])
    assert set(seen) == expected
    assert set(seen.values()) == {2}, "each document once in each of the 2 epochs"


def test_token_sources_are_never_tokenized(tokens: TokenCorpus,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane.engine.tokenize import TokenizerHandle

    def refuse(self: Any, texts: list[str]) -> Any:
        raise AssertionError("the tokenizer ran on a pre-tokenized source")

    monkeypatch.setattr(TokenizerHandle, "encode", refuse)
    streams = lane_streams(recipe_of(tokens.sources()[:2]), workers=1)
    assert sum(len(s) for s in streams) == sum(
        len(tokens.docs[i]) for name in ("meg", "flat") for i in tokens.by_source[name])


@pytest.mark.slow  # importing megatron-core takes about 10 s
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # megatron-core's own, on numpy 2
def test_a_dataset_megatron_core_wrote_is_read_document_by_document(
        tokens: TokenCorpus, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    import torch

    ids = tokens.by_source["meg"][:180]
    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=np.uint16)
    for i in ids:
        builder.add_document(torch.from_numpy(tokens.docs[i]), [len(tokens.docs[i])])
    builder.finalize(str(tmp_path / "m.idx"))
    # datalane's writer (which the other tests use) writes the same bytes
    for ext in (".idx", ".bin"):
        assert (tmp_path / f"m{ext}").read_bytes() == (tokens.root / "meg" / f"a{ext}").read_bytes()
    recipe = recipe_of([{"name": "m", "uris": [str(tmp_path / "m.idx")], "tokens": {},
                         "chunk_rows": 16}])
    seen = collections.Counter(doc_id(d) for s in lane_streams(recipe) for d in split_documents(s))
    assert seen == collections.Counter(ids)


def _bad_parquet(path: Path) -> list[Any]:
    rng = np.random.default_rng(5)
    rows: list[Any] = [document(9000 + k, 20, rng).tolist() for k in range(40)]
    rows[3][5] = 5000  # out of range
    rows[17][2] = VOCAB  # the first id past the vocabulary
    rows[21] = []
    rows[30] = None  # a null row: missing_field
    pq.write_table(pa.table({"input_ids": pa.array(rows, pa.list_(pa.int64()))}), path)
    return rows


def test_bad_token_records_are_counted_under_skip_and_named_under_fail(
        tmp_path: Path) -> None:
    _bad_parquet(tmp_path / "bad.parquet")
    rng = np.random.default_rng(6)
    meg = [document(9500 + k, 10, rng) for k in range(30)]
    meg[7][4] = 4096
    write_dataset(str(tmp_path / "bad"), meg, "uint16")
    sources = [{"name": "pq", "uris": [str(tmp_path / "bad.parquet")], "tokens": {}},
               {"name": "meg", "uris": [str(tmp_path / "bad.idx")], "tokens": {}}]
    recipe = recipe_of(sources, lanes=1, global_batch_size=2)
    [stream] = lane_streams(recipe)
    kept = collections.Counter(doc_id(d) for d in split_documents(stream))
    good = {9000 + k for k in range(40)} - {9003, 9017, 9021, 9030}
    good |= {9500 + k for k in range(30)} - {9507}
    assert set(kept) == good and set(kept.values()) == {1}
    with Loader(recipe, 0, 1) as ld:
        while not ld.next_step().ended:
            pass
        counters = ld.counters()
    assert counters.skipped == {"token_out_of_range": 3, "empty_ids": 1, "missing_field": 1}
    assert counters.docs == 70 and counters.kept == 65
    unshuffled = recipe_of(sources[:1], lanes=1, global_batch_size=2, bad_records="fail",
                           shuffle={"block_size": 1})
    with pytest.raises(DataError, match=(
            r"source 'pq': token id 5000 at index 5 is outside the vocabulary \[0, 1024\) of "
            rf"the tokenizer in {tmp_path / 'bad.parquet'} at row 3 \(bad_records is "
            r"'fail'\)")), Loader(unshuffled, 0, 1) as ld:
        while not ld.next_step().ended:
            pass


def test_a_megatron_id_out_of_range_is_named_by_document(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    meg = [document(k, 10, rng) for k in range(5)]
    meg[2][6] = 2000
    write_dataset(str(tmp_path / "m"), meg, "uint16")
    recipe = recipe_of([{"name": "m", "uris": [str(tmp_path / "m.idx")], "tokens": {}}],
                       lanes=1, global_batch_size=1, bad_records="fail",
                       shuffle={"block_size": 1})
    with pytest.raises(DataError, match=(
            r"source 'm': token id 2000 at index 6 is outside the vocabulary \[0, 1024\) of "
            rf"the tokenizer in {tmp_path / 'm.idx'} at document 2 \(bad_records is "
            r"'fail'\)")), Loader(recipe, 0, 1) as ld:
        while not ld.next_step().ended:
            pass


@pytest.mark.parametrize("fmt", ["megatron", "flatbin"])
def test_a_carried_piece_of_a_token_document_resumes_by_reference(
        tokens: TokenCorpus, fmt: str) -> None:
    long = tokens.root / "long"
    source = ({"name": "long", "uris": [str(long / "a.idx")], "tokens": {}, "chunk_rows": 1}
              if fmt == "megatron" else
              {"name": "long", "uris": [str(long / "a.u16")], "tokens": {"boundary": EOS},
               "chunk_bytes": 64})
    recipe = recipe_of([source], lanes=2, global_batch_size=2, seq_len=31)
    full = run_world(recipe, 1, Knobs(workers=2), 40, save_at=frozenset({9}))
    state = full.checkpoints[9]
    pieces = [lane.packer.data["held"] for lane in state.lanes.values()]
    assert any(held for held in pieces), "the test needs a document carried over a step"
    starts = np.cumsum([0] + [len(tokens.docs[i]) for i in tokens.by_source["long"]])
    for held in pieces:
        for source_index, ref, start, stop in held:
            file, pos = ref
            assert (source_index, file) == (0, 0)
            # megatron: the document index; flatbin with a boundary: its first token's index
            k = pos if fmt == "megatron" else int(np.flatnonzero(starts == pos)[0])
            assert 0 < start < stop <= len(tokens.docs[5000 + k])
    resumed = run_world(recipe, 2, Knobs(workers=1), 31, start=state)
    assert resumed.hashes == {s: h for s, h in full.hashes.items() if s >= 9}


def test_token_files_are_read_from_any_fsspec_uri(tokens: TokenCorpus) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    for name in ("meg/a.idx", "meg/a.bin", "offs/a.bin", "offs/a.offsets.npy", "flat/a.u16"):
        fs.pipe(f"/tok/{name}", (tokens.root / name).read_bytes())
    local = tokens.sources()
    remote = [dict(local[0], uris=["memory://tok/meg/a.idx"]),
              dict(local[1], uris=["memory://tok/flat/a.u16"]),
              dict(local[2], uris=["memory://tok/offs/a.bin"])]
    here = [dict(local[0], uris=[str(tokens.root / "meg/a.idx")]),
            dict(local[1], uris=[str(tokens.root / "flat/a.u16")]), local[2]]
    a = run_world(recipe_of(remote), 2, Knobs(workers=2), None)
    b = run_world(recipe_of(here), 1, Knobs(workers=1), None)
    assert a.hashes == b.hashes and len(a.hashes) > 10


def test_verify_a_recipe_mixing_text_with_every_token_format(
        tokens: TokenCorpus, corpus: DemoCorpus, tmp_path: Path) -> None:
    recipe = {
        "lanes": 8, "global_batch_size": 16, "seq_len": 96, "seed": 9,
        "tokenizer": {"uri": corpus.tokenizer},
        "sources": [{"name": "web", "uris": [corpus.web], "weight": 0.4, "epochs": None,
                     "chunk_rows": 50},
                    *[dict(s, weight=0.15, epochs=None) for s in tokens.sources()]],
        "shuffle": {"block_size": 16},
    }
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(recipe))
    plan = Plan.build(load_recipe(str(path)))
    assert [sp.kind.__class__.__name__ for sp in plan.sources] == [
        "TextKind", "TokensKind", "TokensKind", "TokensKind", "TokensKind"]
    proc = subprocess.run(
        [sys.executable, "-m", "datalane.cli", "verify", str(path), "--steps", "10",
         "--worlds", "1,2,4,8", "--workers", "1,3", "--resume-at", "0,4,9"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 32 runs" in proc.stdout, proc.stdout
    assert "DIFFERS" not in proc.stdout
    # and the batches really hold both kinds: text ids and the token corpus's marked documents
    with Loader(load_recipe(str(path)), 0, 1) as ld:
        ids = np.concatenate([ld.next_step().input_ids.ravel() for _ in range(6)])
    assert (ids == MARK).sum() > 10
