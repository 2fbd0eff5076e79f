"""Eval streams in process: what an evaluation holds, and that it repeats.

The recipe trains on the test corpus and has one eval stream, ``heldout``, over four JSONL
files of six short documents each (one chunk a file: one file a lane on 4 lanes), packed with
``bestfit`` so that every document lies whole in one sequence. The expectations are computed
by hand from those documents: the segments of an evaluation (a segment starts at position 0)
are exactly the eval documents, each once, tokenized as the engine does (no special tokens,
EOS appended); the later steps are padding with ``ended`` set; every evaluation is
byte-identical; the global batch is the same at world sizes 1, 2 and 3.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.client import InProcessLoader
from datalane.corpus import DemoCorpus
from datalane.engine.plan import Plan
from datalane.spec import ConfigError, Recipe, load_recipe
from datalane.spec.evals import eval_recipe
from tests.conftest import base_recipe_dict

LANES, BATCH, SEQ = 4, 8, 64
STEPS = 5  # the data ends within 3 steps: the last ones are padding


def eval_texts() -> list[list[str]]:
    """Six documents per file, four files; short enough that each fits a sequence."""
    return [[f"held out {f} number {i} " + "the quick brown fox " * (i % 3)
             for i in range(6)] for f in range(4)]


@pytest.fixture
def eval_files(tmp_path: Path) -> str:
    folder = tmp_path / "val"
    folder.mkdir()
    for f, texts in enumerate(eval_texts()):
        with open(folder / f"val-{f}.jsonl", "w", encoding="utf-8") as out:
            for t in texts:
                out.write(json.dumps({"text": t}) + "\n")
    return str(folder / "*.jsonl")


def eval_recipe_dict(corpus: DemoCorpus, eval_files: str, **stream: Any) -> dict[str, Any]:
    return base_recipe_dict(
        corpus, lanes=LANES, global_batch_size=BATCH, seq_len=SEQ,
        packing={"algorithm": "bestfit", "bestfit_bins": 4},
        sources=[{"name": "web", "uris": [corpus.web], "epochs": None, "chunk_rows": 50},
                 {"name": "code", "uris": [corpus.code], "epochs": None,
                  "chunk_bytes": 8192, "weight": 0.3}],
        eval=[{"name": "heldout", "steps": STEPS,
               "sources": [{"name": "val", "uris": [eval_files]}], **stream}])


@pytest.fixture
def recipe(corpus: DemoCorpus, eval_files: str) -> Recipe:
    return load_recipe(eval_recipe_dict(corpus, eval_files))


def expected_documents(tokenizer: str) -> Counter[tuple[int, ...]]:
    """Each eval document's tokens as the engine makes them: no special tokens, then EOS."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    eos = tok.token_to_id("<|eos|>")
    docs = Counter(tuple([*tok.encode(t, add_special_tokens=False).ids, eos])
                   for texts in eval_texts() for t in texts)
    assert all(len(d) <= SEQ + 1 for d in docs)  # each fits one sequence: never split
    assert sum(docs.values()) == 24
    return docs


def segments(ids: np.ndarray, positions: np.ndarray) -> list[tuple[int, ...]]:
    """The documents of (rows, seq) sequences: a segment starts at position 0."""
    out = []
    for row_ids, row_pos in zip(ids, positions, strict=True):
        starts = np.flatnonzero(row_pos == 0)
        for s in starts:
            e = s + 1
            while e < len(row_pos) and row_pos[e] == row_pos[e - 1] + 1:
                e += 1
            out.append(tuple(int(t) for t in row_ids[s:e]))
    return out


def evaluate(loader: Any) -> list[Any]:
    return list(loader)


def global_steps(per_rank: list[list[Any]], world: int, microbatch: int) -> list[bytes]:
    """The global batch of every step: each rank's real microbatches (its lanes' rows, past
    them the padded ones are dropped), in rank order - which is lane order."""
    from datalane.spec.lanes import lanes_of_rank

    steps: dict[int, list[np.ndarray]] = {}
    for rank, batches in enumerate(per_rank):
        real = len(lanes_of_rank(LANES, world, rank)) * (BATCH // LANES) // microbatch
        for b in batches:
            if b.index < real:
                steps.setdefault(b.step, []).append(np.concatenate(
                    [b.input_ids, b.positions], axis=1))
            else:
                assert (b.positions == -1).all()
    return [np.concatenate(steps[s]).tobytes() for s in sorted(steps)]


def test_an_evaluation_holds_exactly_the_eval_documents_then_padding(
        recipe: Recipe, corpus: DemoCorpus) -> None:
    loader = InProcessLoader(recipe, 0, 1, microbatch_size=2, stream="heldout")
    try:
        got = evaluate(loader)
    finally:
        loader.close()
    assert [(b.step, b.index) for b in got] == [(s, i) for s in range(STEPS) for i in range(4)]
    assert loader.steps == STEPS and loader.per_step == 4
    found = Counter(seg for b in got for seg in segments(b.input_ids, b.positions))
    assert found == expected_documents(corpus.tokenizer)  # each once, nothing of training
    ended = [s for s in range(STEPS) if all(b.ended for b in got if b.step == s)]
    assert ended and ended == list(range(ended[0], STEPS)) and ended[0] < STEPS - 1
    for b in got:
        if b.step > ended[0]:  # after the data ran out: every sequence is padding
            assert (b.positions == -1).all()


def test_every_evaluation_gives_the_same_bytes_and_restart_goes_back_to_step_0(
        recipe: Recipe) -> None:
    loader = InProcessLoader(recipe, 1, 2, microbatch_size=1, stream="heldout")
    try:
        first = [b.input_ids.tobytes() + b.positions.tobytes() for b in loader]
        assert len(first) == STEPS * 4  # 2 lanes of 2 sequences, one a microbatch
        second = [b.input_ids.tobytes() + b.positions.tobytes() for b in loader]
        it = iter(loader)
        partial = [next(it) for _ in range(3)]
        loader.restart()
        with pytest.raises(ConfigError, match="retired"):
            next(it)
        third = [b.input_ids.tobytes() + b.positions.tobytes() for b in loader]
    finally:
        loader.close()
    assert second == first and third == first
    assert [b.input_ids.tobytes() + b.positions.tobytes() for b in partial] == first[:3]


def test_the_global_eval_batch_is_the_same_at_world_sizes_1_2_and_3(recipe: Recipe) -> None:
    batches = {}
    for world in (1, 2, 3):
        per_rank = []
        for rank in range(world):
            loader = InProcessLoader(recipe, rank, world, microbatch_size=1, stream="heldout")
            try:
                per_rank.append(evaluate(loader))
            finally:
                loader.close()
        batches[world] = global_steps(per_rank, world, 1)
    assert len(batches[1]) == STEPS
    assert batches[2] == batches[1] and batches[3] == batches[1]


def test_the_training_position_does_not_change_the_eval_bytes(recipe: Recipe) -> None:
    train = InProcessLoader(recipe, 0, 1, microbatch_size=2)
    heldout = InProcessLoader(recipe, 0, 1, microbatch_size=2, stream="heldout")
    try:
        at_0 = [b.input_ids.tobytes() for b in heldout]
        it = iter(train)
        trained = [next(it) for _ in range(7 * 4)]  # 7 training steps
        assert train.state_dict()["step"] == 7
        at_7 = [b.input_ids.tobytes() for b in heldout]
    finally:
        train.close()
        heldout.close()
    assert at_7 == at_0
    eval_ids = {t for b in at_0 for t in np.frombuffer(b, np.int32)}
    assert trained and eval_ids  # both streams produced tokens


def test_eval_streams_do_not_change_the_training_fingerprint_and_have_their_own(
        corpus: DemoCorpus, eval_files: str) -> None:
    with_eval = load_recipe(eval_recipe_dict(corpus, eval_files))
    without = load_recipe({k: v for k, v in eval_recipe_dict(corpus, eval_files).items()
                           if k != "eval"})
    plain = Plan.build(without)
    assert Plan.build(with_eval).fingerprint == plain.fingerprint
    assert "eval" not in plain.fingerprint_doc["recipe"]  # type: ignore[operator]
    heldout = Plan.build(eval_recipe(with_eval, "heldout"))
    assert heldout.fingerprint != plain.fingerprint
    assert heldout.fingerprint_doc["files"].keys() == {"val"}  # type: ignore[attr-defined]
    other = load_recipe(eval_recipe_dict(corpus, eval_files, seed=9))
    assert Plan.build(other).fingerprint == plain.fingerprint
    assert Plan.build(eval_recipe(other, "heldout")).fingerprint != heldout.fingerprint


def test_an_eval_stream_s_own_batch_size_and_seed(corpus: DemoCorpus, eval_files: str) -> None:
    recipe = load_recipe(eval_recipe_dict(corpus, eval_files, global_batch_size=4, seed=9))
    loader = InProcessLoader(recipe, 0, 1, microbatch_size=4, stream="heldout")
    try:
        got = evaluate(loader)
    finally:
        loader.close()
    assert [b.step for b in got] == list(range(STEPS))  # one microbatch of 4 a step
    assert all(b.input_ids.shape == (4, SEQ + 1) for b in got)
    found = Counter(seg for b in got for seg in segments(b.input_ids, b.positions))
    assert found == expected_documents(corpus.tokenizer)


def test_unknown_streams_and_what_an_eval_loader_refuses(recipe: Recipe) -> None:
    with pytest.raises(ConfigError) as info:
        InProcessLoader(recipe, 0, 1, stream="heldot")
    assert str(info.value) == ("no stream is named 'heldot'; the recipe's streams are 'train', "
                               "'heldout'")
    loader = InProcessLoader(recipe, 0, 1, stream="heldout")
    train = InProcessLoader(recipe, 0, 1)
    try:
        for call in (loader.state_dict, lambda: loader.load_state_dict(train.state_dict())):
            with pytest.raises(ConfigError, match="eval stream 'heldout' has no"):
                call()
        with pytest.raises(ConfigError, match="restart\\(\\) is for eval streams"):
            train.restart()
    finally:
        loader.close()
        train.close()


def test_the_torch_adapter_yields_one_evaluation_per_iteration(recipe: Recipe) -> None:
    from datalane.client.torch import DataLaneDataset

    loader = InProcessLoader(recipe, 0, 2, microbatch_size=2, stream="heldout")
    data = DataLaneDataset(loader, global_tokens=True)
    try:
        first = [item["input_ids"].clone() for item in data]
        second = list(data)
    finally:
        loader.close()
    assert len(first) == len(second) == STEPS * 2
    assert all(bool((a == b["input_ids"]).all()) for a, b in zip(first, second, strict=True))
    assert all(int(b["global_tokens"]) == int(b["step_tokens"]) for b in second)  # one rank

