"""Checkpoints that end, with a named error or the committed step, instead of waiting.

* The checkpoint store goes down (moto's S3 server stopped): ``checkpoint()`` raises a
  ``StorageError`` naming the store and the object within the sidecar's bound (30 s), where it
  used to ask again until its own 300 s ran out and end in DEADLINE_EXCEEDED.
* A rank asks again, after a sidecar restart, for a step the previous sidecar process committed
  (it was not told): the step is confirmed for it alone, where it used to wait for the pod's
  other ranks, which had gone on past that step.

Real sidecar processes on Unix sockets; a moto S3 server of the test's own, on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from datalane import StorageError
from datalane.client import SidecarLoader
from datalane.store import CheckpointStore
from tests.sidecar.test_edges import _take
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, _free_port, _wait_ready

pytestmark = pytest.mark.slow  # real sidecar processes


@pytest.fixture
def own_s3(tmp_path: Path, s3_server: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A moto S3 server this test may stop (the session's is shared); the ``s3_server``
    fixture sets the dummy credentials in the environment."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT)
    _wait_ready(proc, endpoint, log)
    yield endpoint, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_checkpoint_with_the_store_down_fails_within_the_bound_naming_it(
        sidecar, repeat_recipe, own_s3) -> None:
    import s3fs

    endpoint, moto = own_s3
    options = {"client_kwargs": {"endpoint_url": endpoint}, "key": ACCESS_KEY,
               "secret": SECRET_KEY}
    s3fs.S3FileSystem(**options).mkdir("outage")
    sc = sidecar(repeat_recipe, "--store", "s3://outage/run", "--store-options",
                 json.dumps(options))
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4,
                       transport="inline") as loader:
        it = iter(loader)
        _take(it, 4)  # 16 sequences per step: one step
        assert loader.checkpoint(timeout=120)["committed"]
        moto.kill()
        moto.wait()
        _take(it, 4)
        t0 = time.monotonic()
        with pytest.raises(StorageError, match=r"s3://outage/run/steps/0*2/pod-") as info:
            loader.checkpoint(timeout=300)
        took = time.monotonic() - t0
    assert took < 45, f"the checkpoint took {took:.0f} s with the store down"
    assert info.value.transient
    assert "DEADLINE_EXCEEDED" not in str(info.value)


def test_a_step_the_previous_sidecar_committed_is_confirmed_for_one_rank(
        sidecar, repeat_recipe, tmp_path) -> None:
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "2")
    loaders = [SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=2,
                             transport="inline") for r in (0, 1)]
    its = [iter(x) for x in loaders]
    for it in its:
        _take(it, 4)  # step 0 (4 microbatches of 2 per rank)
    out: dict[int, dict[str, object]] = {}

    def ask(r: int) -> None:
        out[r] = loaders[r].checkpoint(timeout=120)

    threads = [threading.Thread(target=ask, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert out[0]["committed"] and out[1]["committed"]
    assert CheckpointStore(store_uri).committed_steps() == [1]
    # the sidecar restarts; rank 1 went on, rank 0 asks for step 1 again (as a client does
    # when it got no answer)
    sc.kill9()
    sc.start()
    t0 = time.monotonic()
    again = loaders[0].checkpoint(step=1, timeout=90)
    assert again["step"] == 1 and again["committed"]
    assert time.monotonic() - t0 < 45
    for x in loaders:
        x.close()
