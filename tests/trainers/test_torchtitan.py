"""TorchTitan integration: datalane's dataloader built the way TorchTitan's Trainer builds it.

The dataloader comes out of TorchTitan's own config parsing (``ConfigManager`` with the demo's
config-registry function) and ``Config.build`` with the Trainer's keyword arguments; batches are
TorchTitan's ``(input_dict, labels)``; the state re-deals lanes between DP degrees; the CPU demo
trains TorchTitan's debug llama3 through TorchTitan's DCP checkpointer on 2 -> 1 and 1 -> 2
ranks (real torchrun jobs on gloo) and finds every global batch unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

from datalane import Loader, load_recipe
from datalane.client import Batch, InProcessLoader
from datalane.client.torch import DataLaneDataset, to_tensors
from datalane.client.torchtitan import DataLaneDataLoader, to_titan
from datalane.demos.torchtitan import mismatches, step_hashes
from datalane.spec.errors import ConfigError
from datalane.spec.hashing import global_hash
from datalane.spec.schema import Column, text_schema
from tests.support.demos import run_short_demo

LOCAL = 4  # sequences per microbatch; B = 16, so DP 2 has 2 microbatches per step, DP 1 has 4


def build(recipe: str, dp_rank: int, dp_world_size: int, **fields: str) -> DataLaneDataLoader:
    """As ``Trainer.__init__`` builds ``config.dataloader``."""
    return DataLaneDataLoader.Config(recipe=recipe, **fields).build(
        dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=None, seq_len=128,
        local_batch_size=LOCAL, snapshot_every_n_steps=10)


def plain(batch: tuple[dict[str, torch.Tensor], torch.Tensor]) -> list[list[list[int]]]:
    inputs, labels = batch
    return [inputs["input"].tolist(), inputs["positions"].tolist(), labels.tolist()]


def test_a_microbatch_becomes_torchtitans_input_dict_and_labels() -> None:
    ids = np.array([[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]], dtype=np.int32)
    pos = np.array([[0, 1, 0, 1, 2], [0, 1, 2, -1, -1]], dtype=np.int32)  # -1: padding
    inputs, labels = to_titan(to_tensors(Batch(0, 0, {"input_ids": ids, "positions": pos})),
                              seq_len=4)
    assert sorted(inputs) == ["input", "positions"]  # other keys would reach model.forward
    assert inputs["input"].tolist() == [[5, 6, 7, 8], [1, 2, 3, 0]]
    assert inputs["positions"].tolist() == [[0, 1, 0, 1], [0, 1, 2, 0]]  # no -1 for RoPE
    assert labels.tolist() == [[6, 7, 8, 9], [2, 3, -100, -100]]
    with pytest.raises(ConfigError, match=r"sequences have 4 tokens but TorchTitan's "
                                          r"training.seq_len is 8; set --training.seq_len 4"):
        to_titan(to_tensors(Batch(0, 0, {"input_ids": ids, "positions": pos})), seq_len=8)


def test_torchtitans_labels_carry_the_loss_mask() -> None:
    schema = text_schema(0, extra=(Column("loss_mask", "uint8", 0, default=1),))
    ids = np.array([[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]], dtype=np.int32)
    pos = np.array([[0, 1, 0, 1, 2], [0, 1, 2, -1, -1]], dtype=np.int32)
    mask = np.array([[1, 0, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=np.uint8)  # targets 1..4
    batch = Batch(0, 0, {"input_ids": ids, "positions": pos, "loss_mask": mask}, schema=schema)
    inputs, labels = to_titan(to_tensors(batch), seq_len=4)
    assert sorted(inputs) == ["input", "positions"]  # the mask is in the labels, not forward's
    assert labels.tolist() == [[-100, 7, 8, -100], [2, -100, -100, -100]]


def test_torchtitans_config_parsing_selects_the_datalane_dataloader(repeat_recipe,
                                                                     tmp_path) -> None:
    from torchtitan.config import ConfigManager

    config = ConfigManager().parse_args([
        "--module", "datalane.demos.torchtitan_rank", "--config", "llama3_debugmodel_datalane",
        "--dataloader.recipe", repeat_recipe, "--dataloader.digest_log", str(tmp_path),
        "--dataloader.map_processes", "2", "--training.seq_len", "128"])
    assert type(config.dataloader) is DataLaneDataLoader.Config
    assert (config.dataloader.map_processes, config.dataloader.workers) == (2, 2)
    assert (config.dataloader.recipe, config.dataloader.digest_log) == (repeat_recipe,
                                                                        str(tmp_path))
    assert config.training.seq_len == 128
    assert config.validator.enable is False


def test_each_dp_rank_reads_its_lanes_and_logs_their_digests(repeat_recipe, tmp_path) -> None:
    recipe = load_recipe(repeat_recipe)
    log = tmp_path / "digests"
    loader = build(repeat_recipe, 1, 2, digest_log=str(log))
    got = [plain(b) for b in islice(loader, 6)]  # 3 steps of rank 1 of 2
    direct = DataLaneDataset(InProcessLoader(recipe, 1, 2, LOCAL))
    want = [plain(to_titan(item, 128)) for item in islice(direct, 6)]
    assert got == want
    assert set(loader.state_dict()) == {"recipe", "lane_00004", "lane_00005", "lane_00006",
                                        "lane_00007"}
    lines = [json.loads(x) for x in (log / "dp1.jsonl").read_text().splitlines()]
    assert [(x["step"], sorted(x["lanes"])) for x in lines] == [
        (s, ["4", "5", "6", "7"]) for s in range(3)]
    assert loader.last_step is not None and loader.last_step[0] == 2
    with Loader(recipe, rank=0, world_size=1) as whole:  # the lanes of rank 0 from the engine
        for x in lines:
            step = whole.next_step()
            lanes = {**{str(k): v.hex() for k, v in step.lane_digests.items() if k < 4},
                     **x["lanes"]}
            assert global_hash(bytes.fromhex(lanes[str(i)]) for i in range(8)) == \
                step.global_hash()
    loader.close()


@pytest.mark.slow  # a child process
def test_map_processes_reach_the_in_process_loader_and_change_nothing(repeat_recipe) -> None:
    loader = build(repeat_recipe, 0, 2, map_processes=1)  # type: ignore[arg-type]
    got = [plain(b) for b in islice(loader, 4)]
    pool = loader.loader._loader._pool
    assert pool.processes and [c.pid for c in pool.children()] != []
    direct = DataLaneDataset(InProcessLoader(load_recipe(repeat_recipe), 0, 2, LOCAL))
    assert got == [plain(to_titan(item, 128)) for item in islice(direct, 4)]
    loader.close()


def test_a_dp2_state_resumes_on_dp1_at_the_next_step(repeat_recipe) -> None:
    steps = 3
    saved: dict[str, str] = {}
    for rank in range(2):  # what DCP keeps of both ranks' state dicts: the union of the keys
        loader = build(repeat_recipe, rank, 2)
        for _ in islice(loader, 2 * steps):
            pass
        saved.update(loader.state_dict())
        loader.close()
    resumed = build(repeat_recipe, 0, 1)
    assert set(resumed.state_dict()) == set(saved)  # the keys DP 1 asks DCP for
    resumed.load_state_dict(saved)
    got = [plain(b) for b in islice(resumed, 4)]
    fresh = build(repeat_recipe, 0, 1)
    want = [plain(b) for b in islice(fresh, 4 * steps + 4)][4 * steps:]
    assert got == want
    resumed.close()
    fresh.close()


def test_configuration_mistakes_name_the_field(repeat_recipe, monkeypatch) -> None:
    monkeypatch.delenv("DATALANE_SOCKET", raising=False)
    with pytest.raises(ConfigError, match=r"not a TorchTitan dataset \(dataset='c4'"):
        build(repeat_recipe, 0, 1, dataset="c4")
    with pytest.raises(ConfigError, match=r"set one of dataloader.recipe .* not both"):
        build(repeat_recipe, 0, 1, socket="/run/datalane/dl.sock")
    with pytest.raises(ConfigError, match=r"no data source: set --dataloader.recipe .* "
                                          r"--dataloader.socket / \$DATALANE_SOCKET"):
        build("", 0, 1)


@pytest.mark.slow  # a real sidecar process
def test_reads_the_pods_sidecar(repeat_recipe, sidecar) -> None:
    sc = sidecar(repeat_recipe)
    loader = DataLaneDataLoader.Config(socket=sc.socket).build(
        dp_world_size=2, dp_rank=0, tokenizer=None, seq_len=128, local_batch_size=LOCAL)
    got = [plain(b) for b in islice(loader, 4)]
    loader.close()
    local = build(repeat_recipe, 0, 2)
    assert got == [plain(b) for b in islice(local, 4)]
    local.close()


def _digest(lane: int, step: int) -> str:
    return hashlib.sha256(f"lane {lane} step {step}".encode()).hexdigest()


def test_demo_composes_lane_logs_into_step_hashes_and_flags_mismatches(tmp_path) -> None:
    for part, rank, lanes in ((0, 0, range(4)), (0, 1, range(4, 8)), (1, 0, range(8))):
        folder = tmp_path / f"digests-{part}"
        folder.mkdir(exist_ok=True)
        steps = [0, 1] if part == 0 else [2]  # the resumed job logs datalane step 2 on
        recs = [{"step": s, "lanes": {str(i): _digest(i, s) for i in lanes
                                      if not (s == 1 and i == 6)}} for s in steps]
        (folder / f"dp{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    want = {s + 1: hashlib.sha256(b"".join(bytes.fromhex(_digest(i, s))
                                           for i in range(8))).hexdigest() for s in range(3)}
    got = step_hashes(tmp_path)
    assert got == {1: want[1], 3: want[3]}  # step 2 lacks lane 6: not a whole global batch
    assert mismatches(want, [want, got], 3) == [(2, 1)]
    assert mismatches(want, [{**want, 3: want[1]}], 3) == [(3, 0)]


@pytest.mark.slow
def test_cpu_demo_resizes_a_torchtitan_job_and_keeps_every_global_batch(tmp_path) -> None:
    out, rows = run_short_demo("datalane.demos.torchtitan", tmp_path)
    reference = load_recipe(str(Path(tmp_path) / "corpus" / "titan.yaml"))
    with Loader(reference, rank=0, world_size=1) as loader:
        want = [loader.next_step().global_hash()[:16] for _ in rows]
    for row, h in zip(rows, want, strict=True):
        assert row[1:8] == [h, h, "=", h, "=", h, "="]
    assert "holds 9 dataloader entries: dataloader.lane_00000 ... dataloader.recipe" in out
    assert "MATCH: all 4 global batches identical" in out
    # the model, optimizer and LR schedule resumed too: the losses agree to float rounding
    drift = float(re.search(r"largest loss difference to DP2 (\S+)", out).group(1))
    assert drift < 1e-4, out
