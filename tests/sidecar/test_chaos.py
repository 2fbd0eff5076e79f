"""Chaos: 10 kill -9 and 5 SIGTERM of a sidecar at random points while two ranks stream and
checkpoint every few steps. The run must end with the uninterrupted run's step hashes, and
the store's ledger must audit clean from the first committed step to the last
(:func:`tests.sidecar.chaos.run_chaos`)."""

from __future__ import annotations

import pytest

from tests.sidecar.chaos import run_chaos

pytestmark = pytest.mark.slow  # real sidecar processes


def test_kill9_and_sigterm_at_random_points_change_nothing(sidecar, repeat_recipe,
                                                           tmp_path) -> None:
    run_chaos(sidecar, repeat_recipe, tmp_path, steps=64, every=4,
              faults=["kill9"] * 10 + ["sigterm"] * 5, seed=20261201)
