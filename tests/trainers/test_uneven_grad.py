"""The gradient of a world size that does not divide the lanes equals the one-rank gradient:
a real gloo DDP job of 3 ranks over 8 lanes (ranks of 2, 3 and 3 lanes; the
2-lane rank ends each step with a fully padded microbatch), the loss normalized by the torch
adapter's ``global_tokens``, against 1 rank and 4 ranks, over two optimizer steps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.trainers.test_dcp import run_job

pytestmark = pytest.mark.slow  # torchrun jobs on gloo


def test_uneven_world_gradient_equals_the_one_rank_gradient(write_recipe: Callable[..., str],
                                                            tmp_path: Path) -> None:
    recipe = write_recipe()  # 8 lanes, B=16: 2 sequences a lane
    runs = {w: run_job(w, tmp_path, f"grad{w}", "--recipe", recipe, "--microbatch", "2",
                       "--steps", "2", job="grad_job.py") for w in (1, 3, 4)}
    # every rank steps with the same number of microbatches: ceil(8/W) * 2 / 2
    assert [o["microbatches"] for o in runs[3]] == [[3, 3]] * 3
    assert [o["lanes"] for o in runs[3]] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert runs[1][0]["microbatches"] == [8, 8]
    want = np.array(runs[1][0]["grads"])
    assert np.abs(want).max() > 1e-3  # a real gradient, not zeros
    for w in (3, 4):
        for out in runs[w]:  # DDP gave every rank the averaged gradient
            np.testing.assert_allclose(np.array(out["grads"]), want, rtol=1e-9, atol=1e-12)
