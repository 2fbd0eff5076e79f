"""bench/ordered_path.py: the replay of the ordered thread's work is the same work as the real
run (its steps hash the same), and a replay that strays is caught."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

import datalane
from tests.support import paths


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("ordered_path",
                                                  paths.REPO / "bench" / "ordered_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_replay_makes_the_real_runs_steps_and_a_changed_run_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # (the script adds bench/ to it)
    bench = _bench()
    load_recipe = datalane.load_recipe

    def small_chunks(spec: dict[str, Any]) -> Any:  # a small corpus: a chunk for each lane
        spec["sources"][0]["chunk_rows"] = 16
        return load_recipe(spec)

    monkeypatch.setattr(datalane, "load_recipe", small_chunks)
    bench.pt.make_corpus(tmp_path, 60_000)
    digests, runs, cpu, wall = bench.real_run(tmp_path, 8)
    # 60,000+ tokens in steps of 8 x 2,049 (16,392): at least 4 steps, every one with both
    # lanes' digests
    assert len(digests) >= 4 and all(sorted(d) == [0, 1] for d in digests)
    assert sum(len(r) for r in runs) >= 4 and 0 < cpu < wall
    wall, hashing = bench.replay(tmp_path, 8, runs, digests)
    assert 0 < hashing < wall
    first = runs[0][0]
    first.columns[0][0] += 1  # one token of the first run changed: another step 0
    with pytest.raises(AssertionError, match="other steps than the real run"):
        bench.replay(tmp_path, 8, runs, digests)
