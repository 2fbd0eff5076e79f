"""Tensor-parallel peers read one data-parallel rank: identical bytes, one session, no
ABORTED - a real 4-process gloo job with a (dp=2, tp=2) DeviceMesh and one sidecar."""

from __future__ import annotations

import hashlib

import pytest

from datalane import load_recipe
from datalane.client import InProcessLoader
from tests.trainers.test_dcp import run_job

pytestmark = pytest.mark.slow  # torchrun jobs on gloo

MICROBATCH = 2
TAKE = 12  # three steps of a DP rank of 2 (16 / 2 / 2 = 4 microbatches per step)


def test_tp_peers_share_one_session_and_get_identical_batches(repeat_recipe, sidecar,
                                                              tmp_path) -> None:
    sc = sidecar(repeat_recipe)
    outs = run_job(4, tmp_path, "mesh", "--socket", sc.socket, "--tp", "2", "--microbatch",
                   str(MICROBATCH), "--take", str(TAKE), job="mesh_job.py")
    # global rank r = dp * 2 + tp (the mesh is row-major: tp innermost)
    assert [(o["dp"], o["reader"]) for o in outs] == [
        ([0, 2], [0, 2]), ([0, 2], [1, 2]), ([1, 2], [0, 2]), ([1, 2], [1, 2])]
    recipe = load_recipe(repeat_recipe)
    for dp in (0, 1):
        loader = InProcessLoader(recipe, dp, 2, MICROBATCH)
        it = iter(loader)
        expected = [hashlib.sha256(next(it).input_ids[:, :-1].astype("int64").tobytes())
                    .hexdigest() for _ in range(TAKE)]
        loader.close()
        assert outs[2 * dp]["hashes"] == expected
        assert outs[2 * dp + 1]["hashes"] == expected
    assert all(o["reconnects"] == 0 for o in outs)  # nobody's session was aborted
    sessions = outs[0]["stats"]["sessions"].values()
    assert sorted((s["rank"], s.get("readers")) for s in sessions) == [(0, 2), (1, 2)]
