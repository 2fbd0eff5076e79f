"""The VLM demo (``make demo-vlm``, datalane/demos/vlm.py): a tiny Qwen3.5 trained on CPU
through TorchTitan's dataloader in its VLM mode, on DP 2 and DP 1 and resized 2 -> 1 and
1 -> 2 through a torch.distributed.checkpoint checkpoint; every global batch hash is datalane's
own stream's and the losses agree to float rounding."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from datalane import Loader, load_recipe
from tests.support.demos import run_short_demo

pytest.importorskip("torchtitan")

pytestmark = pytest.mark.slow  # about 2 minutes on the 2-core machine: 6 ranks, 4 jobs


def test_the_vlm_demo_resizes_a_job_and_keeps_every_global_batch(tmp_path: Path) -> None:
    out, rows = run_short_demo("datalane.demos.vlm", tmp_path)
    with Loader(load_recipe(str(tmp_path / "corpus" / "vlm.json")), rank=0,
                world_size=1) as loader:
        steps = [loader.next_step() for _ in rows]
    for row, step in zip(rows, steps, strict=True):
        h = step.global_hash()[:16]
        assert row[1:10] == [h, h, "=", h, "=", h, "=", h, "="]
        # the batches carried images: every step's sequences hold placeholder runs
        assert len(step.columns["image_grid_thw"]) > 0
    # the model and AdamW resumed too: each leg's loss is DP2's to float rounding, and the
    # resumed legs' step 3 is not a fresh model's step 1
    losses = [[float(x) for x in r[10:14]] for r in rows]
    for loss in losses:
        assert max(abs(x - loss[0]) for x in loss) <= 1e-4 * loss[0], loss
    assert abs(losses[2][2] - losses[0][0]) > 1e-3
    drift = re.search(r"largest relative loss difference to DP2: (.*) \(tolerance", out)
    assert drift is not None, out
    assert "MATCH: all 4 global batches identical in DP2, DP1, DP2>DP1 and DP1>DP2" in out
    # the checkpoint holds one dataloader entry per lane (+ the recipe), loaded on either DP
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    meta = FileSystemReader(str(tmp_path / "ckpt-dp2")).read_metadata()
    keys = sorted(k for k in meta.state_dict_metadata if k.startswith("dataloader."))
    assert keys == [*(f"dataloader.lane_{i:05d}" for i in range(8)), "dataloader.recipe"]
    assert json.loads((tmp_path / "corpus" / "vlm.json").read_text())["lanes"] == 8
