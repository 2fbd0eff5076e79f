"""The operator's runtime: what ``datalane-operator run`` was told, and the state the kopf
handlers share.

``datalane-operator run`` (:mod:`datalane_operator.cli`) builds one :class:`Runtime` and hands
it to kopf as the operator's memo (``kopf.run(memo=kopf.Memo(runtime=rt))``); every handler in
:mod:`datalane_operator.handlers` takes it from its ``memo`` (kopf gives each resource a
shallow copy of the operator's memo, so all of them hold this one object). There is no
module-global runtime: a test builds its own, with a fake kube client, clock, loop, reconcile
or store look.

The runtime holds the leader's per-pipeline tables (the last store listing, checkpoints
collected but not yet reported, the generations and recipes already handled, since when each
old recipe ConfigMap has been unreferenced), runs reconciles
through a :class:`~datalane_operator.coalescer.Coalescer` (at most one running and one waiting
per pipeline) and store looks on the side (at most one in flight per pipeline), and switches
all of that on and off with leadership (:mod:`datalane_operator.leader`). The store looks run
on a bounded pool of their own (``store_calls``, :class:`datalane.store.calls.StoreCalls`),
never on asyncio's default executor, where the kube client's calls and the Lease's renewal
run: a store that hangs holds those few threads, not the ones the operator's API calls need.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from datalane.store.calls import StoreCalls
from datalane_operator import reconciler
from datalane_operator.coalescer import Coalescer
from datalane_operator.kube import Kube
from datalane_operator.leader import LeaderElector, LeaseConfig
from datalane_operator.metrics import Metrics, Outcome, Verdict, start_server
from datalane_operator.policy import Policy
from datalane_operator.recipemap import RECIPE_GRACE_S
from datalane_operator.stats import Latencies
from datalane_operator.storage import DEFAULT_PROTOCOLS, Listing

__all__ = ["Key", "OperatorConfig", "Runtime"]

log = logging.getLogger("datalane.operator")
Key = tuple[str, str]  # (namespace, DataPipeline name)
Work = Callable[["Runtime", Key], Awaitable[None]]


@dataclass
class OperatorConfig:
    """What ``datalane-operator run`` was told."""

    sidecar_image: str = ""
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_host: str | None = None
    tls_cert: str = ""
    tls_key: str = ""
    storage_interval: float = 30.0
    storage_timeout: float = 120.0
    webhook_configuration: str = ""  # patch the caBundle of these configurations
    ca_file: str = ""
    ca_interval: float = 300.0
    namespaces: tuple[str, ...] = ()  # watched namespaces; () is all
    policy: Policy = field(default_factory=Policy)  # the administrator's rules
    sidecar_protocols: tuple[str, ...] = DEFAULT_PROTOCOLS  # what the sidecar image reads
    lease: LeaseConfig | None = None  # leader election; None: this process always leads
    metrics_endpoint: str = ""  # serve Prometheus metrics at this http://HOST:PORT/PATH; "": none
    recipe_grace: float = RECIPE_GRACE_S  # an unreferenced old recipe ConfigMap's wait

    def watches(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces


@dataclass
class Runtime:
    """The operator's shared state; see the module docstring.

    ``clock`` (monotonic seconds) times reviews and reconciles, ``wallclock`` (epoch seconds)
    stamps status conditions; ``loop`` runs the background tasks (None: the running loop).
    ``reconcile`` and ``look_at`` are the work on one pipeline (:mod:`~datalane_operator.
    reconciler`), replaceable in tests.
    """

    config: OperatorConfig = field(default_factory=OperatorConfig)
    kube: Kube | None = None
    clock: Callable[[], float] = time.perf_counter
    wallclock: Callable[[], float] = time.time
    loop: asyncio.AbstractEventLoop | None = None
    reconcile: Work = reconciler.reconcile
    look_at: Work = reconciler.look
    leading: bool = True  # without leader election this process always leads
    listings: dict[Key, Listing] = field(default_factory=dict)
    collected: dict[Key, list[int]] = field(default_factory=dict)  # gc not yet reported
    storage_errors: dict[Key, Listing] = field(default_factory=dict)
    generations: dict[Key, int] = field(default_factory=dict)  # handled, as the leader
    recipes: dict[Key, tuple[str, str]] = field(default_factory=dict)  # ConfigMap written
    unreferenced: dict[Key, dict[str, float]] = field(default_factory=dict)  # name -> since
    written: dict[Key, float] = field(default_factory=dict)  # (ns, recipe ConfigMap) -> seen
    looking: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    admission: Latencies = field(default_factory=Latencies)
    reconcile_latency: Latencies = field(default_factory=Latencies)
    metrics: Metrics = field(default_factory=Metrics)
    metrics_server: Any = None  # aiohttp's runner, while serving
    background: list[asyncio.Task[None]] = field(default_factory=list)
    elector: LeaderElector | None = None
    pipelines: Any = None  # kopf's index of DataPipelines, for a new leader's first round
    reconciles: Coalescer[Key] = field(init=False)
    store_calls: StoreCalls = field(init=False)  # the store looks' threads (reconciler.py)

    def __post_init__(self) -> None:
        self.reconciles = Coalescer(self._reconcile, clock=self.clock,
                                    on_done=self._reconciled, loop=self.loop)
        self.store_calls = StoreCalls("of a DataPipeline", self.config.storage_timeout,
                                      name="datalane-operator-store")

    def k(self) -> Kube:
        if self.kube is None:
            self.kube = Kube()
        return self.kube

    def coordination_api(self) -> Any:
        """The CoordinationV1Api of :meth:`k`'s client (the leader election's Leases)."""
        from kubernetes import client  # type: ignore[import-untyped]

        return client.CoordinationV1Api(self.k().api)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return (self.loop or asyncio.get_running_loop()).create_task(coro)

    def reviewed(self, webhook: str, seconds: float, verdict: Verdict) -> None:
        """An admission review was answered (:class:`~datalane_operator.webhooks.
        TimedWebhookServer`)."""
        self.admission.add(seconds)
        self.metrics.reviewed(webhook, verdict, seconds)

    # -- coalesced reconciles, storage looks on the side ---------------------------------
    def kick(self, key: Key) -> None:
        """Reconcile ``key`` soon (at most one running and one waiting per pipeline)."""
        if self.leading:
            self.reconciles.kick(key)

    async def _reconcile(self, key: Key) -> None:
        await self.reconcile(self, key)

    def _reconciled(self, key: Key, seconds: float, error: BaseException | None) -> None:
        if error is not None:
            log.error("reconcile of %s/%s failed; the next event or storage look retries",
                      *key, exc_info=error)
        self.reconcile_latency.add(seconds)
        self.metrics.reconciled(Outcome.OK if error is None else Outcome.ERROR, seconds)

    def look(self, key: Key) -> None:
        """List (and garbage-collect) the checkpoint store of ``key`` in the background, then
        reconcile. A slow store never delays a reconcile: those use the last look."""
        if key in self.looking or not self.leading:
            return
        self.looking[key] = self.spawn(self._look(key))

    async def _look(self, key: Key) -> None:
        try:
            await self.look_at(self, key)
        except Exception:
            log.exception("storage look of %s/%s failed", *key)
        finally:
            self.looking.pop(key, None)

    def forget(self, key: Key) -> None:
        for table in (self.listings, self.collected, self.storage_errors, self.generations,
                      self.recipes, self.unreferenced):
            table.pop(key, None)

    # -- events ---------------------------------------------------------------------------
    def pipeline_changed(self, key: Key, type: str | None, generation: int) -> None:
        """A DataPipeline was listed (a start), created, changed or deleted: reconcile it
        (which writes its recipe ConfigMap) and look at its store, once per generation;
        status-only changes (the operator's own patches) and deletions need neither."""
        if type == "DELETED":
            self.forget(key)
            return
        if not self.leading or self.generations.get(key) == generation:
            return
        self.generations[key] = generation
        self.kick(key)
        self.look(key)

    def workload_changed(self, namespace: str, job: str, pipelines: Any) -> None:
        """A job (of any kind) or one of its trainer pods changed: reconcile the pipelines naming
        it."""
        if not self.leading:
            return
        for found in pipelines.get((namespace, job), []):
            self.kick((namespace, found["metadata"]["name"]))

    # -- leadership -----------------------------------------------------------------------
    def start_leading(self) -> None:
        """Became the leader: rebuild every pipeline's status and look at every store (the
        previous leader's work in flight is redone; all of it is idempotent)."""
        self.leading = True
        self.generations.clear()
        self.recipes.clear()
        self.unreferenced.clear()  # the grace starts again: this term has seen no pod yet
        # what a previous term saw of the stores is stale (another leader ran meanwhile): the
        # reconciles before this term's first look use the status, as a fresh leader's do
        self.listings.clear()
        self.storage_errors.clear()
        for (namespace, _job), store in list((self.pipelines or {}).items()):
            for found in store:
                key = (namespace, str(found["metadata"]["name"]))
                self.generations[key] = int(found["metadata"].get("generation") or 0)
                self.kick(key)
                self.look(key)

    def stop_leading(self) -> None:
        """No longer the leader: stop reconciling and looking at stores at once."""
        self.leading = False
        for task in list(self.looking.values()):
            task.cancel()
        self.reconciles.cancel_all()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, pipelines: Any, elector_api: Callable[[], Any]) -> None:
        """Start the storage loop and, with a Lease configured, leader election (then this
        process follows until it holds the Lease). ``elector_api()``: the CoordinationV1Api."""
        from datalane_operator.loops import storage_loop

        self.pipelines = pipelines
        self.background.append(self.spawn(storage_loop(self, pipelines)))
        lease = self.config.lease
        if lease is not None:
            self.leading = False
            self.elector = LeaderElector(lease, elector_api(), self.start_leading,
                                         self.stop_leading)
            self.background.append(self.spawn(self.elector.run()))

    async def serve_metrics(self) -> None:
        """Serve :attr:`metrics` at ``config.metrics_endpoint``, if set (:mod:`~datalane_operator.
        metrics`)."""
        if self.config.metrics_endpoint and self.metrics_server is None:
            self.metrics_server = await start_server(
                self.config.metrics_endpoint, lambda: self.metrics.render(self.leading))

    async def stop(self) -> None:
        """Release the Lease first (it waits for the elector's round in flight, whose write
        would otherwise land after the release: this replica would hold the Lease and the
        other wait a whole lease duration), then cancel the background tasks."""
        if self.elector is not None:  # hand over at once rather than after a lease duration
            await self.elector.release()
        for task in self.background:
            task.cancel()
        if self.metrics_server is not None:
            await self.metrics_server.cleanup()
            self.metrics_server = None

    def leader_probe(self) -> dict[str, Any]:
        elector = self.elector
        return {"leading": self.leading, "reconciles": self.reconciles.started,
                "identity": elector.cfg.identity if elector else None,
                "transitions": elector.transitions if elector else 0}


def runtime_of(memo: Any) -> Runtime:
    """The operator's runtime, from kopf's ``memo`` (the operator's or a resource's copy)."""
    rt = memo.get("runtime") if isinstance(memo, Mapping) else None
    if not isinstance(rt, Runtime):
        raise RuntimeError("kopf's memo holds no datalane Runtime: start the operator with "
                           "`datalane-operator run` (kopf.run(memo=kopf.Memo(runtime=...)))")
    return rt
