"""A sidecar's map stages in child processes (``--map-processes``, datalane/engine/mapprocs.py):
the streams stay byte-identical, in the server process and in rank workers, and a map process
killed with kill -9 mid-stream is replaced without the trainer noticing (no reconnect).

Real sidecar processes on real Unix sockets (the ``sidecar`` fixture).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from datalane import load_recipe
from datalane.client import SidecarLoader
from tests.sidecar.test_columns import chat_recipe  # noqa: F401  (the fixture)
from tests.sidecar.test_edges import _reference, _same
from tests.sidecar.test_rank_processes import _stats, two_ranks

pytestmark = pytest.mark.slow  # real sidecar processes


def _map_processes(root: int) -> list[int]:
    """The map processes among ``root``'s descendants."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
    out = []
    for pid in parents:
        p = pid
        while p in parents and p != root:
            p = parents[p]
        if p == root and pid != root:
            try:
                cmd = (Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                continue
            if b"datalane.engine.mapprocs" in cmd:
                out.append(pid)
    return sorted(out)


def test_a_chat_recipe_in_map_processes_streams_every_column_unchanged(
        sidecar, chat_recipe) -> None:  # noqa: F811
    sc = sidecar(chat_recipe, "--map-processes", "2")
    recipe = load_recipe(chat_recipe)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=2) as loader:
        it = iter(loader)
        got = [next(it).copy() for _ in range(16)]
    want = _reference(recipe, 0, 1, 2, 16)
    for a, b in zip(got, want, strict=True):
        assert (a.step, a.index, a.lane_digests) == (b.step, b.index, b.lane_digests)
        assert list(a.columns) == ["input_ids", "positions", "loss_mask"]
        for name in b.columns:
            assert (a.columns[name] == b.columns[name]).all(), name
    assert sc.proc is not None
    found = _map_processes(sc.proc.pid)
    assert 1 <= len(found) <= 2
    # the Stats call names them, with their memory (a child holds an interpreter, jinja2 and
    # the tokenizer: tens of MiB) and no child lost
    listed = _stats(sc.socket)["map_processes"]
    assert sorted(m["pid"] for m in listed) == found
    assert all(m["rss_bytes"] > 20 << 20 and (m["started"], m["lost"]) == (1, 0)
               for m in listed)


def test_a_map_process_killed_mid_stream_is_replaced_and_no_trainer_notices(
        sidecar, repeat_recipe) -> None:
    """Rank workers each with one map process: rank 0's is killed while both ranks read; the
    task is run again in a fresh one, and neither stream breaks or changes."""
    sc = sidecar(repeat_recipe, "--ranks-per-pod", "2", "--rank-processes", "2",
                 "--map-processes", "1")
    assert sc.proc is not None
    recipe = load_recipe(repeat_recipe)
    n = 160  # 40 steps of 4 microbatches: past what the rings and the prefetch hold ahead
    loaders, its = two_ranks(sc.socket)
    got: dict[int, list[Any]] = {0: [], 1: []}
    for r in (0, 1):
        got[r] += [next(its[r]).copy() for _ in range(6)]
    before = _map_processes(sc.proc.pid)
    assert len(before) == 2  # one in each rank worker
    os.kill(before[0], signal.SIGKILL)
    for r in (0, 1):
        got[r] += [next(its[r]).copy() for _ in range(n - len(got[r]))]
    reconnects = [loader.reconnects for loader in loaders]
    for loader in loaders:
        loader.close()
    for r in (0, 1):
        _same(got[r], _reference(recipe, r, 2, 2, n))
    assert reconnects == [0, 0]
    deadline = time.monotonic() + 30
    while before[0] in _map_processes(sc.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    after = _map_processes(sc.proc.pid)
    assert before[0] not in after and before[1] in after and len(after) == 2
    assert sc.proc.poll() is None
    # each rank worker's Stats entry lists its map process: the replaced one counts a loss
    workers = _stats(sc.socket)["rank_workers"]
    listed = {m["pid"]: m for w in workers.values() for m in w["map_processes"]}
    assert sorted(listed) == after
    assert sorted((m["started"], m["lost"]) for m in listed.values()) == [(1, 0), (2, 1)]
