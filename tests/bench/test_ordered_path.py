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


def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small corpus in chunks of 16 documents: a chunk for each lane."""
    load_recipe = datalane.load_recipe

    def small_chunks(spec: dict[str, Any]) -> Any:
        spec["sources"][0]["chunk_rows"] = 16
        return load_recipe(spec)

    monkeypatch.setattr(datalane, "load_recipe", small_chunks)


def test_the_replay_makes_the_real_runs_steps_and_a_changed_run_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # (the script adds bench/ to it)
    bench = _bench()
    _small_chunks(monkeypatch)
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


def test_a_run_without_the_hash_hashes_nothing_and_puts_the_digest_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``plain_run(hashed=False)`` makes its steps with a constant digest (no SHA-256 is
    computed) and leaves ``lane.window_digest`` as it found it, even when the run fails."""
    from datalane.engine import lane

    monkeypatch.setattr(sys, "path", list(sys.path))
    bench = _bench()
    _small_chunks(monkeypatch)
    bench.pt.make_corpus(tmp_path, 20_000)
    digest = lane.window_digest
    calls: list[int] = []

    def counted(*args: Any) -> bytes:
        calls.append(1)
        return digest(*args)

    monkeypatch.setattr(lane, "window_digest", counted)
    assert bench.plain_run(tmp_path, 8, 2, hashed=True) > 0
    hashed = len(calls)
    assert hashed >= 2  # (2 lanes, at least a step)
    assert bench.plain_run(tmp_path, 8, 2, hashed=False) > 0
    assert len(calls) == hashed and lane.window_digest is counted
    monkeypatch.setattr(bench.pt, "_recipe", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        bench.plain_run(tmp_path, 8, 1, hashed=False)
    assert lane.window_digest is counted


def test_thread_cpu_names_the_runs_threads_and_counts_per_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``thread_cpu`` gives the CPU per step of the ordered thread, the readers (both lanes'
    summed under one name) and the map workers, and the wall per step; a thread that spins a
    known time on the ordered thread shows in the ordered thread's share."""
    import time as clock

    from datalane import Loader

    monkeypatch.setattr(sys, "path", list(sys.path))
    bench = _bench()
    _small_chunks(monkeypatch)
    bench.pt.make_corpus(tmp_path, 100_000)
    real = Loader.next_step

    def spin(self: Any) -> Any:  # 20 ms of CPU on the ordered thread every step
        t = clock.thread_time()
        while clock.thread_time() - t < 0.02:
            pass
        return real(self)

    monkeypatch.setattr(Loader, "next_step", spin)
    per, wall = bench.thread_cpu(tmp_path, 8, 2)
    assert {"the ordered thread (this one)", "datalane-read", "datalane-map"} <= set(per)
    assert not any(name[-1].isdigit() for name in per)  # (the lanes' threads summed)
    assert per["the ordered thread (this one)"] >= 0.015  # (counted in clock ticks of 10 ms)
    assert wall >= 0.02 and all(seconds >= 0 for seconds in per.values())
