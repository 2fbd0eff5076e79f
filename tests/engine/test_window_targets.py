"""A step's trained targets counted from what the lanes placed, not from the columns.

A lane that fills whole windows (``wrap``, no ``loss_mask``) knows its window's trained
targets without looking at them: a row is its pieces then padding and its first token is no
target, so the window trains its tokens less one per row that holds any; a window of padding
trains nothing. ``Step.step_tokens`` is the sum over the lanes, and must be exactly what
:func:`datalane.spec.targets.trained_tokens` counts in the columns.

The source is a Megatron dataset written here, read in file order (shuffle blocks of one
record); ``seq_len`` 7 makes a row 8 tokens, so every count below is worked out by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datalane.corpus import tokenizer_path
from datalane.engine.formats.megatron import write_dataset
from datalane.engine.loader import Loader
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.spec.targets import trained_tokens


def steps(tmp_path: Path, lengths: list[int], batch: int,
          lanes: int) -> list[tuple[int, bool]]:
    """``(step_tokens, ended)`` of every step until the data ends (and one padding step)."""
    docs = [np.full(n, 10 + k, dtype=np.int64) for k, n in enumerate(lengths)]
    write_dataset(str(tmp_path / "d"), docs, "uint16")
    recipe = load_recipe({
        "lanes": lanes, "global_batch_size": batch, "seq_len": 7, "seed": 3,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [{"name": "ids", "uris": [str(tmp_path / "d.idx")], "epochs": 1,
                     "tokens": {}, "chunk_rows": 2 if lanes > 1 else len(lengths)}],
        "shuffle": {"block_size": 1}, "packing": {"algorithm": "wrap"}})
    out = []
    with Loader(recipe, 0, 1, Knobs(workers=2)) as ld:
        while not out or not out[-1][1]:
            step = ld.next_step()
            assert step.step_tokens == trained_tokens(step.columns), (
                f"step {step.step}: the lanes count {step.step_tokens} trained targets, the "
                f"columns hold {trained_tokens(step.columns)}")
            out.append((step.step_tokens, step.ended))
    return out


@pytest.mark.parametrize(("lengths", "batch", "lanes", "want", "why"), [
    # 13 tokens in 3 rows: [5 + 3] [3 + 2, pad] [pad]: 7 + 4 + 0 targets, then padding
    ([5, 6, 2], 3, 1, [(11, True)], "a short last row and a padding row"),
    # 16 tokens end exactly at the window's end: 7 + 7, and the next window is padding
    ([5, 11], 2, 1, [(14, False), (0, True)], "a document ending exactly at the window end"),
    # 28 tokens: a document of 19 spans three rows and two windows, [8] [8], then its last
    # 3 tokens start the second window: [3 + 5] [3 + 1, pad]: 7 + 7, then 7 + 3
    ([19, 8, 1], 2, 1, [(14, False), (10, False), (0, True)],
     "a run spanning two windows, a short last row"),
    # two lanes of one row each, one chunk of two documents each: 9 + 4 and 8 + 3 tokens,
    # [8] then [5] on one lane and [8] then [3] on the other
    ([9, 4, 8, 3], 2, 2, [(7 + 7, False), (4 + 2, False), (0, True)], "two lanes"),
])
def test_a_steps_trained_targets_are_its_tokens_less_one_per_row_with_data(
        tmp_path: Path, lengths: list[int], batch: int, lanes: int,
        want: list[tuple[int, bool]], why: str) -> None:
    got = steps(tmp_path, lengths, batch, lanes)
    assert got == want, f"{why}: (step_tokens, ended) per step {got}, want {want}"
