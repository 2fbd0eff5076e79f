"""The client against a sidecar that restarts, drains, breaks or cannot serve.

Real sidecar processes on Unix sockets; every stream is compared with the in-process mode.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import grpc
import pytest

from datalane import StorageError, load_recipe
from datalane.client import SidecarLoader
from datalane.client.sidecar import _retryable
from datalane.wire import NO_SESSION_KEY
from tests.sidecar.inproc import serve_in_process
from tests.sidecar.test_edges import _reference, _same, _take

pytestmark = pytest.mark.slow  # real sidecar processes


def test_a_graceful_sigterm_restart_is_ridden_through_like_a_kill9(sidecar,
                                                                   repeat_recipe) -> None:
    """The trainer keeps reading while a real sidecar process drains and restarts (the
    drain window itself is held open deterministically in the next test)."""
    sc = sidecar(repeat_recipe)
    recipe = load_recipe(repeat_recipe)
    loader = SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=2,
                           reconnect_timeout=60)
    it = iter(loader)
    got = _take(it, 3)
    out: dict[str, Any] = {}

    def read() -> None:
        try:
            while loader.reconnects < 1:  # through the drain and the restart
                got.extend(_take(it, 1))
            got.extend(_take(it, 4))
        except BaseException as e:
            out["error"] = e

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)
    assert sc.terminate() == 0
    sc.start()
    reader.join(120)
    loader.close()
    assert "error" not in out, out.get("error")
    _same(got, _reference(recipe, 0, 2, 2, len(got)))


def test_a_trainer_that_never_closes_its_loader_exits(sidecar, repeat_recipe,
                                                      tmp_path) -> None:
    """Exit must never hang, closed or not (it hung in gRPC's call cancel at interpreter
    exit with the shared-memory transport, 9 of 50 runs)."""
    sc = sidecar(repeat_recipe)
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(f"""
        from datalane.client import SidecarLoader
        loader = SidecarLoader({sc.socket!r}, rank=0, world_size=1, microbatch_size=4)
        it = iter(loader)
        for _ in range(3):
            next(it)
        print("read", flush=True)
    """))
    for attempt in range(8):
        try:
            run = subprocess.run([sys.executable, str(script)], capture_output=True,
                                 text=True, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run {attempt}: the trainer did not exit within 60 s")
        assert run.returncode == 0 and run.stdout == "read\n", run.stderr[-2000:]


def test_checkpoint_rides_through_a_restart_during_the_call(sidecar, repeat_recipe,
                                                            tmp_path) -> None:
    """kill -9 while checkpoint() waits for the pod's other rank ('Stream removed'): the call
    waits for the sidecar, opens the session again and the step commits."""
    store = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store, "--ranks-per-pod", "2")
    recipe = load_recipe(repeat_recipe)
    loaders = [SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=2,
                             reconnect_timeout=60) for r in (0, 1)]
    its = [iter(ld) for ld in loaders]
    got = [_take(it, 8) for it in its]  # steps 0 and 1 (4 microbatches a step)
    out: dict[str, Any] = {}

    def first() -> None:
        try:
            out["saved"] = loaders[0].checkpoint(timeout=120)
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=first)
    t.start()
    time.sleep(1.0)  # rank 0's call is in flight, waiting for rank 1
    sc.kill9()
    sc.start()
    second = loaders[1].checkpoint(timeout=120)
    t.join(120)
    assert "error" not in out, out.get("error")
    assert (out["saved"]["step"], out["saved"]["committed"]) == (2, True)
    assert (second["step"], second["committed"]) == (2, True)
    for r in (0, 1):
        got[r] += _take(its[r], 4)
        loaders[r].close()
        _same(got[r], _reference(recipe, r, 2, 2, 12))


def test_a_failed_checkpoint_reopens_nothing(sidecar, repeat_recipe, tmp_path) -> None:
    """A storage error is the caller's to see; it used to share NOT_FOUND with 'no session'
    and re-open the data stream's session."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    sc = sidecar(repeat_recipe, "--store", str(blocker / "store"), "--ranks-per-pod", "1")
    recipe = load_recipe(repeat_recipe)
    loader = SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4)
    it = iter(loader)
    got = _take(it, 4)
    session = loader._session
    with pytest.raises(StorageError, match="checkpoint of step 1 failed"):
        loader.checkpoint(timeout=30)
    got += _take(it, 4)
    assert (loader.reconnects, loader._session) == (0, session)
    assert list(loader.stats()["sessions"]) == [session]
    loader.close()
    _same(got, _reference(recipe, 0, 1, 4, 8))


def test_a_sidecar_that_answers_but_cannot_serve_fails_within_the_bound(
        sidecar, repeat_recipe, tmp_path) -> None:
    """resume_step against a store that keeps failing: the client gives up after
    open_timeout, naming the bound and the last error (it retried for ever before)."""
    sc = sidecar(repeat_recipe, "--store", "s3://bucket/ckpt", "--ranks-per-pod", "1",
                 env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x",
                      "AWS_SECRET_ACCESS_KEY": "y", "AWS_MAX_ATTEMPTS": "1"})
    loader = SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4,
                           resume_step=2, open_timeout=8)
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=r"did not serve rank 0 of 1 within "
                                           r"open_timeout=8 s; last error: "):
        next(iter(loader))
    assert time.monotonic() - t0 < 60
    loader.close()


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, meta: tuple = ()) -> None:
        self._code, self._details, self._meta = code, details, meta

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._meta


@pytest.mark.parametrize(("error", "retry"), [
    (_Failed(grpc.StatusCode.UNAVAILABLE, "Socket closed"), True),
    (_Failed(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down"), True),
    (_Failed(grpc.StatusCode.CANCELLED, "Cancelled"), True),
    (_Failed(grpc.StatusCode.UNKNOWN, "Stream removed"), True),
    (_Failed(grpc.StatusCode.NOT_FOUND, "no session 'ab'", ((NO_SESSION_KEY, "1"),)), True),
    # the cause does not pass by itself: a retry would loop for ever
    (_Failed(grpc.StatusCode.UNKNOWN, "Exception iterating responses: list index out of "
                                      "range"), False),
    (_Failed(grpc.StatusCode.UNKNOWN, "Exception calling application: boom"), False),
    (_Failed(grpc.StatusCode.NOT_FOUND, "the object s3://b/k does not exist"), False),
    (_Failed(grpc.StatusCode.INTERNAL, "checkpoint of step 3 failed"), False),
    (_Failed(grpc.StatusCode.ABORTED, "session ab of rank 0 was closed"), False),
], ids=lambda v: v._details[:24] if isinstance(v, _Failed) else str(v))
def test_retries_are_decided_by_cause(error, retry) -> None:
    assert _retryable(error) is retry




def test_a_draining_sidecar_is_waited_for_not_a_mismatch(repeat_recipe, tmp_path) -> None:
    """Open against a sidecar that is draining (kubelet's SIGTERM): the client waits for it
    to serve again. It got 'MismatchError: the sidecar is shutting down' and crashed the
    trainer. The servicer runs in-process on a real gRPC server so the drain can be held."""

    from datalane_sidecar.metrics import Metrics
    from datalane_sidecar.service import DataLaneService

    from datalane.engine.plan import Plan
    from datalane.spec.knobs import Knobs

    recipe = load_recipe(repeat_recipe)
    service = DataLaneService(Plan.build(recipe), Knobs(workers=1), 8, None, "pod", 1,
                              str(tmp_path), Metrics())
    with serve_in_process(service, tmp_path) as sock:
        service.serving = False  # draining: the socket answers, the sidecar does not serve
        loader = SidecarLoader(sock, rank=0, world_size=2, microbatch_size=2,
                               transport="inline", open_timeout=60)
        out: dict[str, Any] = {}

        def read() -> None:
            try:
                it = iter(loader)
                out["got"] = _take(it, 4)
            except BaseException as e:
                out["error"] = e

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(1.0)
        assert reader.is_alive(), out  # still waiting, not failed
        service.serving = True  # "the restarted sidecar"
        reader.join(60)
        assert "error" not in out, out.get("error")
        assert loader.reconnects >= 1
        _same(out["got"], _reference(recipe, 0, 2, 2, 4))
        loader.close()
