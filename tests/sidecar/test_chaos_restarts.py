"""Chaos timed to hit checkpoints: the trainers checkpoint at every step, so the
sidecar is stopped inside a checkpoint as often as not - SIGTERM only (kubelet's drain and
restart on every eviction), and SIGTERM and SIGKILL mixed - and some faults wait for rank 0
to be inside ``checkpoint()``. The stream stays byte-identical to an uninterrupted run (every
microbatch and every step's global hash), and the ledger audits clean
(:func:`tests.sidecar.chaos.run_chaos`). With rank worker processes (``--rank-processes``) a
worker killed with kill -9 is one more fault of the same kind: the trainer rides through; so is
a map process (``--map-processes``) killed with kill -9, which the sidecar replaces."""

from __future__ import annotations

import pytest

from tests.sidecar.chaos import run_chaos

pytestmark = pytest.mark.slow  # real sidecar processes


def test_sigterm_drains_with_a_checkpoint_every_step_change_nothing(sidecar, repeat_recipe,
                                                                    tmp_path) -> None:
    run_chaos(sidecar, repeat_recipe, tmp_path, steps=48, every=1,
              faults=["sigterm"] * 3 + ["sigterm-in-checkpoint"] * 3, seed=2312, within=28)


def test_kill9_and_sigterm_with_a_checkpoint_every_step_change_nothing(sidecar, repeat_recipe,
                                                                       tmp_path) -> None:
    run_chaos(sidecar, repeat_recipe, tmp_path, steps=64, every=1,
              faults=["kill9", "sigterm", "kill9-in-checkpoint", "sigterm-in-checkpoint"] * 2,
              seed=2313, within=32)


def test_rank_workers_killed_with_kill9_among_sidecar_faults_change_nothing(
        sidecar, repeat_recipe, tmp_path) -> None:
    run_chaos(sidecar, repeat_recipe, tmp_path, steps=48, every=1,
              faults=["kill9-worker", "kill9-worker-in-checkpoint"] * 2
              + ["kill9", "sigterm-in-checkpoint"], seed=2314, within=28,
              flags=("--rank-processes", "2"))


def test_map_processes_killed_with_kill9_among_sidecar_faults_change_nothing(
        sidecar, repeat_recipe, tmp_path) -> None:
    run_chaos(sidecar, repeat_recipe, tmp_path, steps=48, every=1,
              faults=["kill9-map", "kill9-map-in-checkpoint"] * 2
              + ["kill9-worker", "kill9", "sigterm-in-checkpoint", "kill9-map"], seed=2315,
              within=28, flags=("--rank-processes", "2", "--map-processes", "1"))
