"""TorchTitan on a DP degree that does not divide the lanes.

TorchTitan has one ``local_batch_size`` and one gradient-accumulation count for all ranks, so
every rank reads the same number of microbatches per step - a rank with fewer lanes ends its
step with microbatches whose labels are all -100 - and ``training.global_batch_size`` is the
padded global batch (``titan_global_batch_size``). TorchTitan's ``global_valid_tokens`` (the
labels that are not -100, summed over the step and the DP ranks) is then the global trained-token
count, and its loss per step is the same on 1, 3 and 4 ranks (a real torchrun of the CPU demo).
"""

from __future__ import annotations

import re
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest
import torch

from datalane.client.torchtitan import DataLaneDataLoader, TitanBatch, titan_global_batch_size
from datalane.demos.torchtitan import parse_legs
from datalane.spec.errors import ConfigError

IGNORE = -100
LOCAL = 2  # divides the local batches of 2, 4 and 6 sequences (1, 2 or 3 lanes of 2)


def build(recipe: str, dp_rank: int, dp_world_size: int) -> DataLaneDataLoader:
    """As ``Trainer.__init__`` builds ``config.dataloader``."""
    loader: DataLaneDataLoader = DataLaneDataLoader.Config(recipe=recipe).build(
        dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=None, seq_len=128,
        local_batch_size=LOCAL, snapshot_every_n_steps=10)
    return loader


def test_torchtitans_global_batch_size_is_the_padded_global_batch() -> None:
    # 8 lanes of 2 sequences (B=16); ceil(8/W) lanes x 2 sequences on each of W ranks
    assert titan_global_batch_size(8, 16, 1, LOCAL) == 16
    assert titan_global_batch_size(8, 16, 2, LOCAL) == 16
    assert titan_global_batch_size(8, 16, 3, LOCAL) == 18  # 3 x 3 lanes x 2
    assert titan_global_batch_size(8, 16, 5, 1) == 20  # 5 x 2 lanes x 2
    assert titan_global_batch_size(8, 16, 7, LOCAL) == 28  # 7 x 2 lanes x 2
    assert titan_global_batch_size(8, 16, 8, LOCAL) == 16
    with pytest.raises(ConfigError, match=r"microbatch size 4 does not divide the local batch "
                                          r"of 4 or 6 sequences .* use one of \[1, 2\]"):
        titan_global_batch_size(8, 16, 3, 4)


def _steps(loader: DataLaneDataLoader, steps: int, per_step: int) -> list[list[TitanBatch]]:
    items = list(islice(loader, steps * per_step))
    loader.close()
    return [items[i * per_step:(i + 1) * per_step] for i in range(steps)]


def test_three_ranks_read_the_one_rank_batch_and_its_trained_token_count(
        repeat_recipe: str) -> None:
    steps = 2
    whole = _steps(build(repeat_recipe, 0, 1), steps, 8)  # 8 lanes x 2 / 2 per step
    ranks = [_steps(build(repeat_recipe, r, 3), steps, 3) for r in range(3)]  # 3 x 3 = 9 mb
    for s in range(steps):
        # rank 0 owns lanes 0-1 (2 real microbatches, then 1 whose labels are all -100),
        # ranks 1 and 2 own 3 lanes each (3 real microbatches)
        pad_inputs, pad_labels = ranks[0][s][2]
        assert (pad_labels == IGNORE).all()
        assert (pad_inputs["positions"] == 0).all()
        real = ranks[0][s][:2] + ranks[1][s] + ranks[2][s]
        assert len(real) == len(whole[s]) == 8
        for (a_in, a_lab), (b_in, b_lab) in zip(real, whole[s], strict=True):
            assert torch.equal(a_in["input"], b_in["input"])
            assert torch.equal(a_lab, b_lab)
        # what TorchTitan's train_step sums over the step's microbatches and the batch mesh
        per_rank = [sum(int((lab != IGNORE).sum()) for _, lab in ranks[r][s])
                    for r in range(3)]
        one_rank = sum(int((lab != IGNORE).sum()) for _, lab in whole[s])
        assert sum(per_rank) == one_rank > 0
        assert per_rank[0] < per_rank[1]  # 2 lanes of trained targets against 3


def test_a_checkpoint_in_the_middle_of_a_step_is_refused_naming_the_batch_size(
        repeat_recipe: str) -> None:
    loader = build(repeat_recipe, 0, 3)  # 3 microbatches a step (the last one padding)
    it = iter(loader)
    next(it)
    next(it)
    with pytest.raises(ConfigError, match=r"after microbatch 2 of the 3 of datalane step 0 "
                                          r"\(DP rank 0 of 3\).* Set "
                                          r"--training.global_batch_size 18 "):
        loader.state_dict()
    next(it)  # the padded microbatch ends the step: a checkpoint here is exact
    assert set(loader.state_dict()) == {"recipe", "lane_00000", "lane_00001"}
    loader.close()


def test_demo_legs_take_any_dp_degree_up_to_the_lanes() -> None:
    assert parse_legs("1,3,4,4>3") == [(1,), (3,), (4,), (4, 3)]
    assert parse_legs("8>7, 7>3") == [(8, 7), (7, 3)]
    with pytest.raises(ConfigError, match=r"leg '9' of --legs '1,9': a DP degree is 1 to 8"):
        parse_legs("1,9")
    with pytest.raises(ConfigError, match=r"leg '4>3>2' .* not a DP degree or two joined"):
        parse_legs("4>3>2")


@pytest.mark.slow
def test_torchtitan_trains_the_same_on_1_3_and_4_ranks(tmp_path: Path) -> None:
    """A real TorchTitan train_step (CPU demo, torchrun, gloo) on 1, 3 and 4 ranks over 8 lanes
    and 4 -> 3 through TorchTitan's checkpointer: the same global batch at every step and the
    same loss up to float-reduction order."""
    proc = subprocess.run([sys.executable, "-m", "datalane.demos.torchtitan", "--legs",
                           "1,3,4,4>3", "--steps", "4", "--resume-at", "2", "--workdir",
                           str(tmp_path)], capture_output=True, text=True, timeout=1500)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "MATCH: all 4 global batches identical in DP1, DP3, DP4 and DP4>DP3" in out
    assert ("DP4>DP3: checkpoint step-2 (written at DP 4) holds 9 dataloader entries: "
            "dataloader.lane_00000 ... dataloader.recipe") in out
    each = re.search(r"largest loss difference to DP1 \S+ \((.*)\)", out)
    assert each is not None, out
    drifts = dict(part.split() for part in each.group(1).split(", "))
    assert set(drifts) == {"DP3", "DP4", "DP4>DP3"}
    for leg, drift in drifts.items():  # float32 losses near 8: a few units in the last place
        assert float(drift) < 1e-5, (leg, out)
