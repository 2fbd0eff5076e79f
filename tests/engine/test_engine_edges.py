"""Edges of the lane engine that the other suites do not name.

* Mixed formats in one recipe (Parquet with uneven row groups, plain JSONL with bad and blank
  lines, .jsonl.gz, .jsonl.zst), very short and very long documents: every token of every
  good document is emitted exactly once, for each BOS/EOS policy and both packers.
* The same recipe gives the same global batches on every world size and worker count, and a
  checkpoint taken on one topology (through JSON) resumes on another one at step 0, mid-way,
  at the last step with data, and after every lane has ended.
* Loader API: ``state_dict`` right after ``load_state_dict``, restoring twice, rewinding.
* Repeated sources whose chunks are mostly barren, or whose filter keeps few documents, run on
  (an epoch count alone used to stop them with a false "holds no documents" error); a
  repeated source with nothing keepable still stops.
* Documents that tokenize to zero tokens; one file named twice; tampered lane states.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import Tokenizer

from datalane import ConfigError, DataError, Knobs, Loader, MismatchError, load_recipe
from datalane.corpus import tokenizer_path
from datalane.engine.plan import Plan
from datalane.runner import run_world
from datalane.spec.hashing import global_hash
from datalane.spec.state import Checkpoint, merge_checkpoints


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 7)))
                    for _ in range(n))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Four sources in four formats; every 10th document is many times ``seq_len`` long."""
    root = tmp_path_factory.mktemp("mixed")
    rng = random.Random(3)
    tok = str(root / "tokenizer.json")
    shutil.copyfile(tokenizer_path(), tok)

    def doc(i: int) -> str:
        return _words(rng, rng.randint(300, 900) if i % 10 == 0 else rng.randint(1, 30))

    texts: dict[str, list[str]] = {}
    pq_texts = [doc(i) for i in range(80)]
    pq.write_table(pa.table({"text": pq_texts[:40]}), root / "a.parquet", row_group_size=7)
    pq.write_table(pa.table({"text": pq_texts[40:]}), root / "b.parquet", row_group_size=13)
    texts["pq"] = pq_texts
    lines, good = [], []
    for i in range(40):
        good.append(doc(i))
        lines.append(json.dumps({"text": good[-1]}))
        if i % 17 == 5:
            lines.append('{"text": "broken')
        if i % 19 == 3:
            lines.append('{"other": 1}')
        if i % 23 == 7:
            lines.append("")
    (root / "c.jsonl").write_text("\n".join(lines) + "\n")
    texts["plain"] = good
    gz = [doc(i) for i in range(24)]
    for k in range(4):
        with gzip.open(root / f"d{k}.jsonl.gz", "wt") as f:
            f.write("".join(json.dumps({"text": t}) + "\n" for t in gz[k::4]))
    texts["gz"] = gz
    zs = [doc(i) for i in range(24)]
    for k in range(4):
        data = "".join(json.dumps({"text": t}) + "\n" for t in zs[k::4]).encode()
        (root / f"e{k}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    texts["zst"] = zs
    return {"root": str(root), "tok": tok, "texts": texts}


def mixed_recipe(m: dict[str, Any], *, epochs: tuple[int | None, ...] = (1, 1, 1, 1),
                 **over: Any) -> dict[str, Any]:
    root = m["root"]
    data: dict[str, Any] = {
        "lanes": 4, "global_batch_size": 8, "seq_len": 64, "seed": 11,
        "tokenizer": {"uri": m["tok"]},
        "sources": [
            {"name": "pq", "uris": [f"{root}/*.parquet"], "weight": 1.0, "epochs": epochs[0],
             "chunk_rows": 3},
            {"name": "plain", "uris": [f"{root}/c.jsonl"], "weight": 0.5, "epochs": epochs[1],
             "chunk_bytes": 512},
            {"name": "gz", "uris": [f"{root}/d*.jsonl.gz"], "weight": 2.0, "epochs": epochs[2]},
            {"name": "zst", "uris": [f"{root}/e*.jsonl.zst"], "weight": 0.3,
             "epochs": epochs[3]},
        ],
        "shuffle": {"block_size": 8},
    }
    data.update(over)
    return data


@pytest.mark.parametrize(("algorithm", "bos", "eos"), [
    ("wrap", False, True), ("wrap", True, False), ("bestfit", True, True),
    ("bestfit", False, False)])
def test_mixed_formats_emit_every_token_once(mixed, algorithm, bos, eos) -> None:
    recipe = load_recipe(mixed_recipe(
        mixed, packing={"algorithm": algorithm, "bestfit_bins": 3},
        tokenizer={"uri": mixed["tok"], "add_bos": bos, "add_eos": eos}))
    t = Tokenizer.from_file(mixed["tok"])
    specials = [t.token_to_id("<|bos|>")] if bos else []
    tail = [t.token_to_id("<|eos|>")] if eos else []
    expected = np.zeros(t.get_vocab_size(), dtype=np.int64)
    docs = 0
    for texts in mixed["texts"].values():
        for text in texts:
            ids = specials + t.encode(text, add_special_tokens=False).ids + tail
            expected += np.bincount(ids, minlength=expected.size)
            docs += 1
    got = np.zeros_like(expected)
    with Loader(recipe, 0, 1, Knobs(workers=2, task_docs=3)) as loader:
        for _ in range(2000):
            step = loader.next_step()
            got += np.bincount(step.input_ids[step.positions >= 0], minlength=got.size)
            if step.ended:
                break
        counters = loader.counters()
    assert step.ended
    assert counters.kept == docs
    assert counters.skipped == {"malformed_json": 3, "missing_field": 2}
    assert counters.tokens == int(expected.sum())
    np.testing.assert_array_equal(got, expected)


def _hashes_of_world(recipe, plan, world: int, knobs: Knobs, start: Checkpoint | None,
                     steps: int) -> dict[int, str]:
    return run_world(recipe, world, knobs, steps, plan=plan, start=start).hashes


@pytest.mark.parametrize("packing", [{"algorithm": "wrap"},
                                     {"algorithm": "bestfit", "bestfit_bins": 2}])
def test_mixed_formats_resume_across_topologies_through_the_end(mixed, packing) -> None:
    recipe = load_recipe(mixed_recipe(mixed, packing=packing))
    plan = Plan.build(recipe)
    reference = run_world(recipe, 1, Knobs(workers=1, prefetch=1, task_docs=1), None,
                          plan=plan)
    assert reference.ended
    n = max(reference.hashes) + 1  # the first step that is all padding
    points = [0, 1, n // 3, n - 2, n - 1, n, n + 2]
    total = n + 4
    ref = run_world(recipe, 1, Knobs(workers=1), total, plan=plan).hashes
    first = run_world(recipe, 4, Knobs(workers=3, prefetch=2, task_docs=5), total, plan=plan,
                      save_at=frozenset(points))
    assert first.hashes == ref
    for p in points:
        state = Checkpoint.from_json(json.loads(json.dumps(first.checkpoints[p].to_json())))
        rest = _hashes_of_world(recipe, plan, 2, Knobs(workers=2, prefetch=3), state,
                                min(4, total - p))
        assert rest == {s: h for s, h in ref.items() if p <= s < p + 4}, f"resume at {p}"


def test_no_drain_with_mixed_sources_repeats_and_epochs(mixed) -> None:
    """Saving and restoring (through JSON, on alternating ranks layouts) at every step changes
    nothing, with a repeated source next to sources of one and two epochs."""
    recipe = load_recipe(mixed_recipe(mixed, epochs=(2, None, 1, 1), seq_len=7,
                                      packing={"algorithm": "bestfit", "bestfit_bins": 2}))
    plan = Plan.build(recipe)
    steps = 40
    ref = run_world(recipe, 1, Knobs(workers=2), steps, plan=plan).hashes
    state: dict[str, Any] | None = None
    for s in range(steps):
        world = (1, 2, 4)[s % 3]
        loaders = [Loader(recipe, r, world, Knobs(workers=1 + s % 2), plan=plan)
                   for r in range(world)]
        try:
            digests: dict[int, bytes] = {}
            for ld in loaders:
                if state is not None:
                    ld.load_state_dict(state)
                digests.update(ld.next_step().lane_digests)
            assert global_hash(digests[k] for k in sorted(digests)) == ref[s], f"step {s}"
            merged = merge_checkpoints(Checkpoint.from_json(ld.state_dict()) for ld in loaders)
            state = json.loads(json.dumps(merged.to_json()))
        finally:
            for ld in loaders:
                ld.close()


def test_state_dict_after_load_restore_twice_and_rewind(mixed) -> None:
    recipe = load_recipe(mixed_recipe(mixed))
    plan = Plan.build(recipe)
    with Loader(recipe, 0, 1, Knobs(workers=1), plan=plan) as ld:
        hashes = [ld.next_step().global_hash() for _ in range(12)]
    with Loader(recipe, 0, 1, Knobs(workers=2), plan=plan) as ld:
        assert ld.state_dict()["step"] == 0
        for _ in range(3):
            ld.next_step()
        at3 = ld.state_dict()
        for _ in range(4):
            ld.next_step()
        at7 = ld.state_dict()
        ld.load_state_dict(at3)
        ld.load_state_dict(at7)  # the last restore wins
        assert ld.state_dict() == at7
        assert [ld.next_step().global_hash() for _ in range(2)] == hashes[7:9]
        ld.load_state_dict(json.loads(json.dumps(at3)))  # rewind the same loader
        assert ld.state_dict() == at3
        assert [ld.next_step().global_hash() for _ in range(5)] == hashes[3:8]


# -- repeated sources that are mostly barren ------------------------------------------------


def _one_source(tmp_path: Path, uris: list[str], lanes: int, **source: Any) -> dict[str, Any]:
    tok = tmp_path / "tokenizer.json"
    shutil.copyfile(tokenizer_path(), tok)
    return {"lanes": lanes, "global_batch_size": lanes, "seq_len": 8, "seed": 0,
            "tokenizer": {"uri": str(tok)},
            "sources": [{"name": "s", "uris": uris, "epochs": None, **source}],
            "shuffle": {"block_size": 4}}


def test_repeated_source_with_mostly_empty_files_keeps_running(tmp_path: Path) -> None:
    # 18 compressed files, one of them with documents: most epochs of a lane read nothing
    for k in range(18):
        body = "".join(json.dumps({"text": f"doc {k} {i}"}) + "\n" for i in range(5)) \
            if k == 0 else "\n"
        with gzip.open(tmp_path / f"p{k:02d}.jsonl.gz", "wt") as f:
            f.write(body)
    recipe = load_recipe(_one_source(tmp_path, [str(tmp_path / "*.jsonl.gz")], 18))
    run = run_world(recipe, 1, Knobs(workers=1), 3)  # was: "lane 0 read no record in 19
    assert len(run.hashes) == 3                     # epochs ...; its files hold no documents"


def test_repeated_source_with_a_strict_filter_keeps_running_and_resumes(tmp_path: Path) -> None:
    # one document of 100 passes the filter; a lane often draws no kept document for many
    # epochs in a row, which is not "every record is bad or filtered"
    rng = random.Random(1)
    texts = ["x" * 5 if i == 0 else _words(rng, 40) for i in range(100)]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    recipe = load_recipe(_one_source(tmp_path, [str(path)], 8, chunk_bytes=1200,
                                     filters={"max_chars": 10}))
    plan = Plan.build(recipe)
    ref = run_world(recipe, 1, Knobs(workers=1), 12, plan=plan, save_at=frozenset([4]))
    assert len(ref.hashes) == 12
    rest = run_world(recipe, 2, Knobs(workers=2), 8, plan=plan, start=ref.checkpoints[4])
    assert rest.hashes == {s: h for s, h in ref.hashes.items() if s >= 4}


def test_repeated_source_with_nothing_keepable_still_stops(tmp_path: Path) -> None:
    # as many lanes as chunks: half the files hold no record, half only texts the filter drops
    for k in range(16):
        body = "".join(json.dumps({"text": str(i)}) + "\n" for i in range(5)) if k % 2 else "\n"
        with gzip.open(tmp_path / f"p{k:02d}.jsonl.gz", "wt") as f:
            f.write(body)
    recipe = load_recipe({**_one_source(tmp_path, [str(tmp_path / "*.jsonl.gz")], 16),
                          "filters": {"min_chars": 5}})
    with Loader(recipe, 0, 16) as loader, pytest.raises(DataError) as info:
        loader.next_step()
    assert "source 's': lane 0 kept no document in " in str(info.value)
    assert "every record is bad or filtered (skipped so far: min_chars=" in str(info.value)


# -- documents without tokens, files named twice, chunk counts --------------------------------


def test_documents_that_tokenize_to_nothing_are_counted_and_resume(tmp_path: Path) -> None:
    spec = json.loads(Path(tokenizer_path()).read_text())
    spec["normalizer"] = {"type": "Strip", "strip_left": True, "strip_right": True}
    tok = tmp_path / "strip.json"
    tok.write_text(json.dumps(spec))
    rng = random.Random(5)
    texts = ["   " if i % 3 == 0 else _words(rng, rng.choice([1, 2, 50, 200]))
             for i in range(90)]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    recipe = load_recipe({
        "lanes": 2, "global_batch_size": 4, "seq_len": 32,
        "tokenizer": {"uri": str(tok), "add_bos": True},
        "sources": [{"name": "a", "uris": [str(path)], "chunk_bytes": 700}],
        "shuffle": {"block_size": 5}, "packing": {"algorithm": "bestfit"}})
    plan = Plan.build(recipe)
    run = run_world(recipe, 1, Knobs(workers=2), None, plan=plan, save_at=frozenset([5, 11]))
    assert run.ended
    assert (run.counters.kept, run.counters.skipped) == (60, {"empty_tokens": 30})
    for p, state in run.checkpoints.items():
        rest = run_world(recipe, 2, Knobs(workers=1), 4, plan=plan, start=state)
        assert rest.hashes == {s: h for s, h in run.hashes.items() if p <= s < p + 4}


def test_one_file_named_twice_is_read_once(mixed) -> None:
    root = mixed["root"]
    Path(root, "sub").mkdir(exist_ok=True)
    link = Path(root, "sub", "link.jsonl")
    if not link.exists():
        link.symlink_to(Path(root, "c.jsonl"))
    one = {"name": "s", "uris": [f"{root}/c.jsonl"]}
    twice = {"name": "s", "uris": [f"{root}/c.jsonl", f"{root}/./c.jsonl",
                                   f"{root}/sub/../c.jsonl", f"{root}/c*.jsonl", str(link)]}
    base = {"lanes": 1, "global_batch_size": 1, "seq_len": 32, "tokenizer": {"uri": mixed["tok"]}}
    a = Plan.build(load_recipe({**base, "sources": [one]})).sources[0]
    b = Plan.build(load_recipe({**base, "sources": [twice]})).sources[0]
    assert [f.uri for f in b.files] == [f.uri for f in a.files]
    assert b.chunks == a.chunks


def test_too_few_compressed_files_do_not_suggest_smaller_chunks(mixed) -> None:
    recipe = load_recipe(mixed_recipe(mixed, lanes=8, global_batch_size=8))
    with pytest.raises(ConfigError) as info:
        Plan.build(recipe)
    assert str(info.value) == (
        "sources[2] 'gz' has 4 chunk(s) in 4 file(s), but 8 lanes each need at least one per "
        "epoch; compressed files with one frame are one chunk each: write them with several "
        "frames (pzstd, bgzip, the zstd seekable format) or split them, or use fewer lanes")


# -- tampered lane states -----------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(mixed) -> tuple[Any, Plan, dict[str, Any]]:
    recipe = load_recipe(mixed_recipe(mixed))
    plan = Plan.build(recipe)
    with Loader(recipe, 0, 1, Knobs(workers=1), plan=plan) as ld:
        for _ in range(10):
            ld.next_step()
        state = ld.state_dict()
    assert state["lanes"]["1"]["pack"]["wrap"]["held"], "the test needs a lane with a carry-over"
    return recipe, plan, state


def _lane1(key: str, value: Any) -> Any:
    return lambda s: s["lanes"]["1"].__setitem__(key, value)


def _held(*pieces: Any) -> Any:
    return _lane1("pack", {"wrap": {"held": list(pieces)}})


def _v1(key: str, value: Any) -> Any:
    """The lane state rewritten in lane-state version 1 (carry/pend), then ``key`` set."""
    def change(s: Any) -> None:
        lane = s["lanes"]["1"]
        lane.pop("pack")
        lane.update({"v": 1, "carry": [], key: value})
    return change


TAMPERED = {
    "carry of an unknown source": (_held([9, [0, 0], 0, 5]),
                                   "carried piece of source 9, document [0, 0], is not a "
                                   "document of the recipe"),
    "carry of an unknown file": (_held([0, [99, 0], 0, 5]),
                                 "carried piece of source 0, document [99, 0], is not a "
                                 "document of the recipe"),
    "carry of a reference of another format": (_held([0, [0, 0, 7], 0, 5]),
                                               "document [0, 0, 7], is not a document"),
    "carry past its document": (_held([0, [0, 0], 0, 10**6]),
                                "carried piece [0, [0, 0], 0, 1000000] ends after its "
                                "document's"),
    "empty carried range": (_held([0, [0, 0], 5, 2]),
                            "held[0] [0, [0, 0], 5, 2] is an empty token range [5, 2)"),
    "carry of another packer": (_lane1("pack", {"bestfit": {"bins": [], "pending": None}}),
                                "lane 1 state was packed by 'bestfit'; the recipe packs with "
                                "'wrap'"),
    "unknown key in the packer's state": (_lane1("pack", {"wrap": {"held": [], "x": 1}}),
                                          "lane 1 state.pack.wrap has unknown keys ['x']"),
    "v1: carry past its document": (_v1("carry", [[[0, 0, 0, 0, 10**6]]]),
                                    "carried piece [0, [0, 0], 0, 1000000] ends after"),
    "v1: empty carried range": (_v1("carry", [[[0, 0, 0, 5, 2]]]),
                                "carry[0][0] [0, [0, 0], 5, 2] is an empty token range [5, 2)"),
    "v1: pending piece under wrap": (_v1("pend", [0, 0, 0, 0, 3]),
                                     "lane 1 state has a pending piece, which only 'bestfit'"),
    "cursor past the lane's chunks": (
        lambda s: s["lanes"]["1"]["src"].__setitem__(0, [0, 0, 99, 0, 0]),
        "cursor [0, 0, 99, 0, 0] of source 0 points outside the source"),
    "cursor offset past the block": (
        lambda s: s["lanes"]["1"]["src"].__setitem__(0, [0, 0, 0, -1, 8]),
        "cursor [0, 0, 0, -1, 8] of source 0 points outside the source"),
    "too few mixture counters": (_lane1("mix", [1, 2]),
                                 "lane 1 state has 2 mixture counters; the recipe has 4 "
                                 "sources"),
    "lane key not a number": (lambda s: s["lanes"].__setitem__("x", s["lanes"].pop("1")),
                              "has the lane key 'x', which is not a lane number"),
    "skip count not a number": (_lane1("n", [1, 1, 1, 0, {"a": "b"}]),
                                "skipped 'a' must be an integer, got 'b'"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_tampered_lane_state_is_refused_naming_the_value(saved, case) -> None:
    recipe, plan, state = saved
    change, message = TAMPERED[case]
    bad = copy.deepcopy(state)
    del bad["sha256"]  # the checks behind the seal: a state of a version that wrote none
    change(bad)
    with Loader(recipe, 0, 1, Knobs(workers=1), plan=plan) as ld, \
            pytest.raises(MismatchError) as info:
        ld.load_state_dict(bad, allow_unsealed=True)
        ld.next_step()  # the lanes open (and check their states) on the first step
    assert message in str(info.value)


# -- knobs built in code ----------------------------------------------------------------------


@pytest.mark.parametrize(("knobs", "message"), [
    ({"prefetch": 0}, "knobs.prefetch 0 must be >= 1"),  # used to end every stream at once
    ({"task_docs": 0}, "knobs.task_docs 0 must be >= 1"),  # used to spin forever
    ({"workers": 0}, "knobs.workers 0 must be >= 1"),
    ({"workers": 2.5}, "knobs.workers must be an integer, got 2.5"),
])
def test_knobs_built_in_code_are_checked(knobs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Knobs(**knobs)
    assert str(info.value) == message
