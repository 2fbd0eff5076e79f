"""A session whose rank worker died must never be attached to again.

``_worker_lost`` closes the sessions it finds in ``service.sessions``; a session that an Open
registers just after that listing (the worker died between its ``claim`` answering and the
registration) stays there with a dead worker. Every later Open of the rank then finds it in
``_attach`` (same world size, microbatch size, readers), calls into the dead worker, gets
WorkerLost (UNAVAILABLE) and the client retries forever: the rank never streams again. The
race is narrow; the state it leaves is built here directly: a RemoteSession of a dead worker
registered for rank 0.
"""

from __future__ import annotations

from typing import Any

from datalane_sidecar.metrics import Metrics
from datalane_sidecar.remote import RemoteSession, WorkerLost
from datalane_sidecar.service import DataLaneService

from datalane import load_recipe
from datalane.client import SidecarLoader
from datalane.engine.plan import Plan
from datalane.spec.evals import TRAIN
from datalane.spec.knobs import Knobs
from tests.sidecar.inproc import serve_in_process
from tests.sidecar.test_edges import _reference, _same


class _DeadWorker:
    lost = "the rank worker process 0 (pid 4242) was killed by signal 9; reconnect"

    def call(self, *args: Any) -> Any:
        raise WorkerLost(self.lost)

    def tell(self, *args: Any) -> None:
        return None


def test_an_open_replaces_a_session_whose_rank_worker_died(repeat_recipe, tmp_path) -> None:
    recipe = load_recipe(repeat_recipe)
    plan = Plan.build(recipe)
    service = DataLaneService(plan, Knobs(workers=1), 8, None, "pod", 1, str(tmp_path),
                              Metrics())
    dead = RemoteSession(_DeadWorker(), "deadbeefdeadbeef", plan, service.stream_texts[TRAIN],  # type: ignore[arg-type]
                         TRAIN, 0, 2, 2, 1, 0, None, None,
                         {"first_step": 0, "per_step": 4, "lanes": (0, 4)})
    service.sessions[dead.id] = dead
    with serve_in_process(service, tmp_path) as sock, SidecarLoader(
            sock, rank=0, world_size=2, microbatch_size=2, transport="inline",
            open_timeout=20) as loader:
        it = iter(loader)
        got = [next(it).copy() for _ in range(4)]
    _same(got, _reference(recipe, 0, 2, 2, 4))
