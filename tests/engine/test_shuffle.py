"""The shuffle stages: counter-based permutations and the block shuffle of a lane's documents.

:func:`datalane.engine.rng.permutation` is a pure function of its key (no generator state).
The block shuffle (docs/architecture.md, One lane) cuts a lane's records of a source, epoch
by epoch, into blocks of ``block_size`` records in reading order and permutes each block by the key
``(seed, "block", source, lane, epoch, block)``; the last, shorter block of an epoch is
permuted within itself. The documents here are one word each (``d<i>``, two tokens with EOS)
and ``seq_len`` is 1, so every sequence of a ``wrap`` lane is exactly one document and the
order of the lane's documents can be read off its steps.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from datalane import Knobs, Loader, load_recipe
from datalane.engine.rng import permutation
from tests.support.stages import doc_ids, recipe_dict, write_jsonl, write_tokenizer

SEED = 3


# -- rng.permutation -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64, 1000])
def test_permutation_is_a_permutation(n: int) -> None:
    perm = permutation(n, 0, "k")
    assert sorted(perm) == list(range(n)), f"permutation({n}) must hold each index once"


def test_permutation_is_a_pure_function_of_the_key() -> None:
    assert permutation(8, 0, "chunks", "web", 0) == [6, 0, 4, 7, 5, 3, 2, 1], (
        "the permutation of a fixed key changed: every recipe's stream would change with it")
    assert permutation(5, 1, "x") == [0, 3, 1, 4, 2]
    assert permutation(50, 9, "a", 2) == permutation(50, 9, "a", 2), (
        "the same key must give the same permutation (no hidden generator state)")


def _fisher_yates(n: int, *key: object) -> list[int]:
    """The documented algorithm, written out: word k is little-endian word k of the BLAKE2b
    (64-byte) digests of the key joined by 0x1f, then the block counter as <Q; step k swaps
    index n - 1 - k with word k modulo n - k."""
    import hashlib
    import struct

    data = "\x1f".join(str(p) for p in key).encode()
    words: list[int] = []
    block = 0
    while len(words) < n - 1:
        words += struct.unpack("<8Q", hashlib.blake2b(data + struct.pack("<Q", block),
                                                      digest_size=64).digest())
        block += 1
    perm = list(range(n))
    for k in range(n - 1):
        i = n - 1 - k
        j = words[k] % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


@pytest.mark.parametrize("n", [2, 3, 8, 9, 17, 1023, 1024, 1025, 4099])
def test_permutation_is_the_documented_fisher_yates(n: int) -> None:
    """Blocks of every length (a word block partly used, words past 2^63) give exactly the
    permutation of the algorithm as documented in datalane.engine.rng."""
    for key in ((SEED, "block", "s", 0, 0, n), ("chunks", "web", 7)):
        assert permutation(n, *key) == _fisher_yates(n, *key), f"n={n}, key={key}"


def test_every_part_of_the_key_changes_the_permutation() -> None:
    base: tuple[int | str, ...] = (SEED, "block", "s", 0, 0, 0)
    ref = permutation(8, *base)
    for i, part in enumerate(base):
        key = list(base)
        key[i] = part + 1 if isinstance(part, int) else part + "'"
        assert permutation(8, *key) != ref, f"key part {i} ({part!r}) must change the result"
    # the parts are kept apart: ("ab", "c") and ("a", "bc") are different keys
    assert permutation(16, "ab", "c") != permutation(16, "a", "bc")


def test_all_permutations_are_reachable_and_about_equally_likely() -> None:
    """Fisher-Yates with j in [0, i]: an off-by-one (j in [0, i), Sattolo's cycles) would never
    leave an element in place."""
    counts = Counter(tuple(permutation(3, "u", k)) for k in range(3000))
    assert set(counts) == set(itertools.permutations(range(3))), (
        f"every permutation of 3 must be reachable; got only {sorted(counts)}")
    assert all(400 < c < 600 for c in counts.values()), (
        f"permutations of 3 must be about equally likely (500 each of 3000): {counts}")


# -- block shuffle through a lane ----------------------------------------------------------------

@pytest.fixture
def tok(tmp_path: Path) -> str:
    return write_tokenizer(tmp_path / "tokenizer.json")


def read_lanes(recipe: Any, max_steps: int = 200) -> list[list[int]]:
    """Every lane's document ids until the lane ended (one lane per rank)."""
    out = []
    for lane in range(recipe.lanes):
        got: list[int] = []
        with Loader(recipe, lane, recipe.lanes, Knobs(workers=2, task_docs=3)) as loader:
            for _ in range(max_steps):
                step = loader.next_step()
                got += doc_ids(step.input_ids)
                if step.ended:
                    break
            assert step.ended, "the lane did not end"
        out.append(got)
    return out


def one_source(tok: str, path: str, *, block: int, epochs: int = 1, name: str = "s",
               **over: Any) -> Any:
    return load_recipe(recipe_dict(tok, [{"name": name, "uris": [path], "epochs": epochs}],
                                   seq_len=1, global_batch_size=over.pop("batch", 4),
                                   shuffle={"block_size": block}, **over))


def block_perm(block: list[int], original: list[int]) -> list[int]:
    """The permutation that took ``original`` (reading order) to ``block`` (shuffled)."""
    return [original.index(d) for d in block]


def test_block_size_one_keeps_file_order(tok: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [f"d{i}" for i in range(11)])
    [got] = read_lanes(one_source(tok, path, block=1, epochs=2))
    assert got == list(range(11)) * 2, f"block_size 1 must keep the file order: {got}"


def test_blocks_permuted_by_their_key_each_record_once(tok: str, tmp_path: Path) -> None:
    # 11 records in blocks of 4: [0-3] [4-7] [8-10], each permuted by
    # permutation(len, seed, "block", source, lane, epoch, block)
    path = write_jsonl(tmp_path / "a.jsonl", [f"d{i}" for i in range(11)])
    [got] = read_lanes(one_source(tok, path, block=4, epochs=2))
    assert len(got) == 22, f"2 epochs of 11 records must give 22 documents: {len(got)}"
    blocks = [list(range(0, 4)), list(range(4, 8)), list(range(8, 11))]
    for epoch in range(2):
        out = got[11 * epoch:11 * (epoch + 1)]
        assert sorted(out) == list(range(11)), (
            f"epoch {epoch}: every record must appear exactly once per epoch: {out}")
        at = 0
        for b, records in enumerate(blocks):
            part = out[at:at + len(records)]
            assert sorted(part) == records, (
                f"epoch {epoch} block {b}: the shuffle must permute within blocks of "
                f"block_size records in reading order: {part}")
            perm = permutation(len(records), SEED, "block", "s", 0, epoch, b)
            assert part == [records[i] for i in perm], (
                f"epoch {epoch} block {b} must be permuted by the key (seed, 'block', source, "
                f"lane, epoch, block): want {[records[i] for i in perm]}, got {part}")
            at += len(records)
    # the hand-checked facts the assertions above rest on, spelled out:
    assert got[8:11] == [8, 10, 9], "the last, short block (3 records) must be permuted too"
    assert got[:11] != got[11:], (
        f"each epoch must shuffle anew (the epoch is part of the block key): {got}")
    assert block_perm(got[0:4], blocks[0]) != block_perm(got[4:8], blocks[1]), (
        "each block of an epoch must get its own permutation (the block is part of the key)")


def test_blocks_differ_across_lanes(tok: str, tmp_path: Path) -> None:
    # two files of 8 records, one chunk each, two lanes: each lane reads one whole file as
    # one block; the permutations applied must differ
    a = write_jsonl(tmp_path / "a.jsonl", [f"d{i}" for i in range(8)])
    b = write_jsonl(tmp_path / "b.jsonl", [f"d{100 + i}" for i in range(8)])
    recipe = load_recipe(recipe_dict(tok, [{"name": "s", "uris": [a, b]}], lanes=2,
                                      global_batch_size=2, seq_len=1,
                                      shuffle={"block_size": 8}))
    lanes = read_lanes(recipe)
    perms = [[d % 100 for d in got] for got in lanes]
    assert all(sorted(p) == list(range(8)) for p in perms), f"each lane reads one file: {lanes}"
    for lane, p in enumerate(perms):
        assert p == permutation(8, SEED, "block", "s", lane, 0, 0), (
            f"lane {lane}'s block must be permuted by its own key: {p}")
    assert perms[0] != perms[1], (
        f"lanes must shuffle their blocks differently (the lane is part of the key): {perms}")


def test_blocks_differ_across_sources(tok: str, tmp_path: Path) -> None:
    # two sources with the same layout in one lane; equal weights and lengths alternate them
    a = write_jsonl(tmp_path / "a.jsonl", [f"d{i}" for i in range(8)])
    b = write_jsonl(tmp_path / "b.jsonl", [f"d{100 + i}" for i in range(8)])
    recipe = load_recipe(recipe_dict(tok, [{"name": "s", "uris": [a]},
                                           {"name": "t", "uris": [b]}],
                                      seq_len=1, global_batch_size=2,
                                      shuffle={"block_size": 8}))
    [got] = read_lanes(recipe)
    first = [d for d in got if d < 100]
    second = [d - 100 for d in got if d >= 100]
    for name, order in (("s", first), ("t", second)):
        assert order == permutation(8, SEED, "block", name, 0, 0, 0), (
            f"source {name!r}'s block must be permuted by its own key (seed, 'block', {name!r}, "
            f"lane, epoch, block): {order}")
    assert first != second, (
        f"sources must shuffle their blocks differently (the source is part of the key): "
        f"{first} {second}")


def test_blocks_differ_across_seeds_and_repeat_for_the_same_seed(tok: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [f"d{i}" for i in range(8)])
    [three] = read_lanes(one_source(tok, path, block=8, seed=3))
    [four] = read_lanes(one_source(tok, path, block=8, seed=4))
    assert three != four, f"the seed must change the block shuffle: {three}"
    assert four == permutation(8, 4, "block", "s", 0, 0, 0), (
        f"with seed 4 the block must be permuted by the key of seed 4: {four}")
    [again] = read_lanes(one_source(tok, path, block=8, seed=3))
    assert again == three, "the block shuffle must be a pure function of the recipe"


def test_a_lane_restored_mid_block_continues_the_shuffled_order(tok: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [f"d{i}" for i in range(11)])
    recipe = one_source(tok, path, block=8, epochs=2, batch=3)
    [ref] = read_lanes(recipe)
    for stop in (1, 2, 3, 5):  # after 3, 6, 9, 15 documents: mid-block and across blocks
        with Loader(recipe, 0, 1, Knobs(workers=1)) as loader:
            head: list[int] = []
            for _ in range(stop):
                head += doc_ids(loader.next_step().input_ids)
            state = loader.state_dict()
        with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:
            loader.load_state_dict(state)
            tail: list[int] = []
            while True:
                step = loader.next_step()
                tail += doc_ids(step.input_ids)
                if step.ended:
                    break
        assert head + tail == ref, (
            f"a lane restored after step {stop} must continue the same shuffled order")
