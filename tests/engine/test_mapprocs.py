"""Map tasks in child processes (``knobs.map_processes``, datalane/engine/mapprocs.py): the
same results as on a thread, the stage sent once per child, a killed child replaced, a task
that kills a fresh child too failing with its records named, errors raised as their own type,
children gone with their pool and with their parent.

Real child processes (a fresh interpreter each), real tokenizer.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.engine.formats import FORMATS
from datalane.engine.mapprocs import MapProcess, MapProcessError
from datalane.engine.mapstage import MapResult, MapStage, Record
from datalane.engine.pool import TaskPool
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Filters
from tests.engine.test_mapstage import JSONL, handle, line, text_stage  # noqa: F401
from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # child processes

RECORDS: list[Record] = [
    (0, 0, line("hello world")),
    (0, 10, b'{"text": "unterminated'),
    (0, 20, line("")),
    (1, 3, "a Parquet value"),
    (0, 30, line("hey")),
]


def _same(a: MapResult, b: MapResult) -> None:
    assert list(a.columns) == list(b.columns)
    for name in a.columns:
        assert a.columns[name].dtype == b.columns[name].dtype
        assert np.array_equal(a.columns[name], b.columns[name]), name
    assert np.array_equal(a.offsets, b.offsets)
    assert (a.status, a.detail, a.bounds, a.set_aside) == (b.status, b.detail, b.bounds,
                                                           b.set_aside)


def _alive(pid: int) -> bool:
    """Running (a zombie, ended but not reaped, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _gone(pid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """A module of ``body`` on the import path (before any child starts: a child gets the
    parent's path when it starts)."""
    name = f"dl_mp_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.fixture
def child() -> Any:
    mp = MapProcess()
    yield mp
    mp.close()


def test_a_child_returns_what_the_stage_returns_here(handle: TokenizerHandle,  # noqa: F811
                                                      child: MapProcess) -> None:
    stage = text_stage("text", Filters(min_chars=4), handle)
    want = stage.run(RECORDS, JSONL)
    got = child.run(stage, RECORDS, JSONL)
    _same(got, want)
    assert want.status == [None, "malformed_json", "empty_text", None, "min_chars"]
    assert child.pid is not None and child.pid != os.getpid() and _alive(child.pid)
    # the same child answers the next task; a lane is passed through
    _same(child.run(stage, RECORDS[:2], JSONL, lane=3), stage.run(RECORDS[:2], JSONL, 3))
    assert child.started == 1


def test_the_stage_goes_once_per_child_and_a_dead_stage_is_dropped_there(
        handle: TokenizerHandle, child: MapProcess) -> None:  # noqa: F811
    sent: list[tuple[Any, ...]] = []
    a = text_stage("text", Filters(), handle)
    child.run(a, RECORDS[:1], JSONL)  # started: now watch what goes over the socket
    assert child._conn is not None
    real = child._conn.send_bytes

    def spy(data: bytes) -> None:
        sent.append(pickle.loads(data))
        real(data)

    child._conn.send_bytes = spy  # type: ignore[method-assign]
    child.run(a, RECORDS[:1], JSONL)
    b = text_stage("text", Filters(min_chars=100), handle)
    child.run(b, RECORDS[:1], JSONL)
    child.run(b, RECORDS[:1], JSONL)
    key_a = next(iter(child._sent))
    del a
    gc.collect()
    got = child.run(b, RECORDS[:1], JSONL)
    # (key, stage shipped, keys dropped, ...): a's second task ships nothing, b's first
    # ships b, b's second nothing, and the task after a is gone drops a there
    assert [(m[1] is not None, m[2]) for m in sent] == [(False, []), (True, []), (False, []),
                                                        (False, [key_a])]
    assert got.status == ["min_chars"] and key_a not in child._sent


def test_a_child_killed_between_tasks_is_replaced_and_the_task_sent_again(
        handle: TokenizerHandle, child: MapProcess,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    stage = text_stage("text", Filters(), handle)
    child.run(stage, RECORDS, JSONL)
    first = child.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert _gone(first)
    with caplog.at_level("WARNING", logger="datalane.engine"):
        _same(child.run(stage, RECORDS, JSONL), stage.run(RECORDS, JSONL))
    assert child.started == 2 and child.pid not in (None, first) and child.lost == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"map process {first} died (signal 9) running 5 records of file(s) [0, 1] (file 0 "
        f"position 0 to file 0 position 30): a fresh one runs the task again"]


def test_a_child_killed_mid_task_is_replaced_and_the_task_run_again(
        handle: TokenizerHandle, child: MapProcess, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    mark = tmp_path / "started"
    module = _module(tmp_path, monkeypatch, f"""
        import os, time
        def keep(text):
            if text == "slow" and not os.path.exists({str(mark)!r}):
                open({str(mark)!r}, "w").close()
                time.sleep(60)
            return True
    """)
    stage = text_stage("text", Filters(predicate=f"{module}:keep"), handle)
    records: list[Record] = [(0, 0, line("before")), (0, 1, line("slow")), (0, 2, line("after"))]
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(got=child.run(stage, records, JSONL)))
    t.start()
    deadline = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mark.exists()
    victim = child.pid
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    _same(out["got"], stage.run(records, JSONL))  # the mark exists: no sleep here
    assert child.started == 2 and child.pid != victim


def test_a_task_that_kills_a_fresh_child_too_fails_naming_its_records(
        handle: TokenizerHandle, child: MapProcess, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(tmp_path, monkeypatch, """
        import os, signal
        def keep(text):
            if text == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            return True
    """)
    stage = text_stage("text", Filters(predicate=f"{module}:keep"), handle)
    records: list[Record] = [(2, 5, line("fine")), (2, 7, line("crash")), (3, 1, line("x"))]
    with pytest.raises(MapProcessError) as info:
        child.run(stage, records, JSONL + [FORMATS["jsonl"]] * 2)
    assert str(info.value) == (
        "the map process died (signal 9) running 3 records of file(s) [2, 3] (file 2 "
        "position 5 to file 3 position 1), in a fresh process too: a decoder or renderer "
        "crashes on these records")
    assert child.started == 2
    # the next task gets a fresh child
    _same(child.run(stage, RECORDS[:1], JSONL), stage.run(RECORDS[:1], JSONL))
    assert child.started == 3


def test_errors_raised_in_the_child_are_raised_here_as_their_own_type(
        handle: TokenizerHandle, child: MapProcess, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(tmp_path, monkeypatch, """
        from datalane.engine.mapstage import MapStage

        class Odd(Exception):
            def __init__(self, a, b):
                super().__init__(f"odd {a} {b}")

        class Boom(MapStage):
            def run(self, records, formats, lane=0):
                if records[0][2] == "odd":
                    raise Odd(1, 2)
                raise ValueError(f"bad value {records[0][1]} in lane {lane}")
    """)
    boom = __import__(module).Boom(
        "text", Filters(), text_stage("text", Filters(), handle).kind)
    with pytest.raises(ValueError, match=r"^bad value 42 in lane 5$"):
        child.run(boom, [(0, 42, "x")], JSONL, lane=5)
    pid = child.pid
    with pytest.raises(MapProcessError, match=r"^Odd: odd 1 2 \(raised in a map process\)$"):
        child.run(boom, [(0, 1, "odd")], JSONL)
    assert child.pid == pid and child.started == 1  # an error is not a death


def test_a_child_that_cannot_start_is_an_error_of_its_own(
        handle: TokenizerHandle, child: MapProcess,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane.engine import mapprocs

    monkeypatch.setattr(mapprocs, "_CHILD", "import sys; sys.exit(3)")
    with pytest.raises(MapProcessError, match=r"^a map process could not start: it ended "
                                              r"\(exit status 3\) before it was ready"):
        child.run(text_stage("text", Filters(), handle), RECORDS, JSONL)
    assert child.pid is None and child.started == 1


def test_a_child_ignores_sigint_and_sigterm_its_parent_decides(
        handle: TokenizerHandle, child: MapProcess) -> None:  # noqa: F811
    """A Ctrl-C reaches the whole process group: the parent stops, and closes the socket."""
    stage = text_stage("text", Filters(), handle)
    child.run(stage, RECORDS, JSONL)
    pid = child.pid
    assert pid is not None
    os.kill(pid, signal.SIGINT)
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.3)
    _same(child.run(stage, RECORDS, JSONL), stage.run(RECORDS, JSONL))
    assert (child.pid, child.started) == (pid, 1)
    child.close()
    assert _gone(pid)


def test_a_stage_that_does_not_pickle_is_named(child: MapProcess) -> None:
    class Local(MapStage):  # a class defined in a function does not pickle
        pass

    stage = Local.__new__(Local)
    with pytest.raises(MapProcessError, match=r"^a map task of 1 records of file\(s\) \[0\] "
                                              r"\(file 0 position 9 to file 0 position 9\) "
                                              r"cannot be sent to a map process: "):
        child.run(stage, [(0, 9, b"{}")], JSONL)


def test_a_pool_of_processes_runs_map_tasks_in_its_children_and_ends_them(
        handle: TokenizerHandle) -> None:  # noqa: F811
    stage = text_stage("text", Filters(), handle)
    pool = TaskPool.of(Knobs(workers=7, map_processes=2))
    assert (pool.processes, pool.workers) == (True, 2)
    futures = [pool.submit_map(0, stage, RECORDS, JSONL, lane) for lane in range(6)]
    for lane, f in enumerate(futures):
        _same(f.result(timeout=120), stage.run(RECORDS, JSONL, lane))
    pids = [c.pid for c in pool.children()]
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids
    assert all(p is not None and _alive(p) for p in pids)
    pool.shutdown(wait=True)
    assert all(p is not None and _gone(p) for p in pids)
    threads = TaskPool.of(Knobs(workers=3))
    assert (threads.processes, threads.workers) == (False, 3)
    _same(threads.submit_map(0, stage, RECORDS, JSONL, 1).result(timeout=60),
          stage.run(RECORDS, JSONL, 1))
    assert threads.children() == []
    threads.shutdown()


def test_a_child_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys
        from datalane.engine.formats import FORMATS
        from datalane.engine.mapprocs import MapProcess
        from datalane.engine.mapstage import MapStage
        from datalane.engine.documents.text import TextKind
        from datalane.engine.tokenize import TokenizerHandle
        from datalane.corpus import tokenizer_path
        from datalane.spec.recipe import Filters, TokenizerSpec
        handle = TokenizerHandle.load(TokenizerSpec(uri=tokenizer_path()))
        stage = MapStage("text", Filters(), TextKind(handle, "text"))
        mp = MapProcess()
        mp.run(stage, [(0, 0, b'{"text": "hi"}')], [FORMATS["jsonl"]])
        print(mp.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(proc.stdout.split()[0])
    assert _gone(pid), f"map process {pid} outlived its parent"


def test_a_loader_in_map_processes_streams_what_one_on_threads_does(corpus) -> None:
    """Both packers, a mixture of JSONL and Parquet: the same microbatches, byte for byte."""
    from datalane.engine.loader import Loader
    from datalane.spec.recipe import load_recipe
    from tests.conftest import base_recipe_dict

    for packing in ("wrap", "bestfit"):
        recipe = load_recipe(base_recipe_dict(corpus, packing={"algorithm": packing}))
        got = {}
        for knobs in (Knobs(workers=2), Knobs(map_processes=2, task_docs=16)):
            with Loader(recipe, 1, 2, knobs) as loader:
                got[knobs.map_processes] = [
                    {k: v.copy() for k, v in mb.columns.items()}
                    for _, mb in zip(range(12), loader.microbatches(2), strict=False)]
        assert len(got[0]) == 12
        for a, b in zip(got[0], got[2], strict=True):
            assert list(a) == list(b)
            assert all(np.array_equal(a[k], b[k]) for k in a)



def test_a_vision_recipe_in_map_processes_streams_every_column_unchanged(
        tmp_path: Path) -> None:
    """Image-caption pairs: the decoded patches travel back with each map result (its
    ``attached``); every column of every step, the per-image ones included, and the window
    digests are the threads' ones."""
    from datalane.engine.loader import Loader
    from tests.support.vision import vision_recipe, write_three

    path, _ = write_three(tmp_path / "pairs.tar")
    recipe = vision_recipe([str(path)], 255, global_batch_size=2, lanes=2,
                           sources=[{"name": "pairs", "uris": [str(path)], "vision": {},
                                     "epochs": 2, "chunk_rows": 1}])
    got = {}
    for knobs in (Knobs(workers=2), Knobs(map_processes=2, task_docs=1)):
        with Loader(recipe, 0, 1, knobs) as loader:
            steps = []
            for step in loader:
                steps.append((step.lane_digests, {k: v.copy() for k, v in step.columns.items()}))
                if step.ended:
                    break
        got[knobs.map_processes] = steps
    assert len(got[0]) >= 3 and "image_seq" in got[0][0][1]
    assert sum(len(cols["image_seq"]) for _, cols in got[0]) == 6  # 3 images, 2 epochs
    for (da, a), (db, b) in zip(got[0], got[2], strict=True):
        assert da == db and list(a) == list(b)
        assert all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)
