"""The elastic loss-curve experiment (bench/elastic_training.py) at its CI smoke size.

``--tiny``: a 1-layer TinyLM, 8 steps of 16 x 256 tokens, DDP over gloo on 2 rank processes,
then a ``torch.distributed.checkpoint`` at step 4 resumed on 1 rank; and the same on 3 ranks
(2, 3 and 3 of the 8 lanes, the 2-lane rank ending each step with a padded microbatch) resumed
on 1 (about 2 min on 2 cores). datalane must give the resumed runs the global batches of the
uninterrupted one at every step (equal hashes, losses equal up to float reduction order); the
ordinary loader, resumed by skipping the microbatches each rank had consumed, must not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # torchrun jobs on gloo

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "elastic_training.py"


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("elastic")
    out, png = tmp / "result.json", tmp / "loss.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--workdir", str(tmp / "w"),
                           "--out", str(out), "--plot", str(png)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads(out.read_text())


def test_datalane_resume_on_another_world_keeps_every_global_batch(result) -> None:
    assert result["config"]["worlds"] == [2, 1] and result["config"]["resume_at"] == [4]
    for key in ("b_vs_a", "b_vs_a_tokens"):  # lane-digest hash and token-bytes hash
        cmp = result[key]
        assert cmp["steps"] == 8
        assert cmp["steps_hash_equal"] == 8, cmp
        assert cmp["first_step_hash_differs"] is None
    b = result["b_vs_a"]
    assert b["max_abs_loss_diff_before_resume"] == 0.0  # same world, same bytes: bitwise
    assert b["max_abs_loss_diff"] < 1e-5  # another world: only the reduction order differs
    assert b["same_sequences_as"] == {}
    control = result["control_vs_a"]  # uninterrupted on 1 rank: the same batches as well
    assert control["steps_hash_equal"] == 8 and control["max_abs_loss_diff"] < 1e-5
    losses = [r["loss"] for r in result["curves"]["a_datalane"]]
    assert losses[-1] < losses[0] - 0.2  # it trains


def test_datalane_on_a_world_that_does_not_divide_the_lanes_keeps_every_global_batch(
        result) -> None:
    assert result["config"]["uneven_worlds"] == [3, 1]
    for key in ("d_vs_a", "d_vs_a_tokens"):  # lane digests, and the real rows' token bytes
        cmp = result[key]
        assert (cmp["steps"], cmp["steps_hash_equal"]) == (8, 8), cmp
        assert cmp["same_sequences_as"] == {}
    # 3 ranks from the first step: another reduction order than the 2-rank reference, and the
    # loss normalized by the global token count (a per-rank mean would weigh the 2-lane rank's
    # tokens by 3/2 and differ by far more than rounding)
    d = result["d_vs_a"]
    assert d["max_abs_loss_diff"] < 1e-5, d
    tokens = [r["tokens"] for r in result["curves"]["d_datalane"]]
    assert tokens == [r["tokens"] for r in result["curves"]["a_datalane"]]


def test_usual_loader_resume_on_another_world_repeats_sequences(result) -> None:
    c = result["c_vs_a"]
    assert c["steps_hash_equal"] == 4 and c["first_step_hash_differs"] == 4
    assert c["max_abs_loss_diff_before_resume"] == 0.0
    assert c["max_abs_loss_diff"] > 1e-4
    # On 2 ranks a step is 4 microbatches of 2 per rank, so at step 4 each rank has consumed
    # 16 microbatches: the first 64 sequences of the epoch's permutation. The single rank
    # skips its 16 consumed microbatches - 32 sequences - and trains again on the sequences
    # of steps 2, 3, 4, 5 of the uninterrupted run.
    assert c["same_sequences_as"] == {"4": 2, "5": 3, "6": 4, "7": 5}
    assert c["same_sequences_segments"] == [{"first": 4, "last": 7, "ref_first": 2}]
