"""kopf handlers: thin adapters from cluster events to the pure functions.

* **Admission** (served by kopf's :class:`kopf.WebhookServer` on the paths of
  :mod:`datalane_operator.names`): validate DataPipelines, inject the sidecar into pods of a
  pipeline's workload, guard PyTorchJob updates and ``pytorchjobs/scale``. Lookups come from
  in-memory kopf indexes of DataPipelines and PyTorchJobs (no API call on the hot path);
  an index miss for a training pod falls back to one live list, so a pod created in the
  moment a pipeline appears is not missed.
* **Reconcile**, on the leader only (:mod:`datalane_operator.leader`; every replica serves
  admission): DataPipeline events whose generation is new to this leader (the recipe
  ConfigMap, then a reconcile), PyTorchJob and pod events (a reconcile of the pipeline that
  references them), and a periodic look at every checkpoint store (listing, garbage
  collection). Reconciles of one pipeline are coalesced: at most one runs and one waits,
  however many events arrive. Status is rebuilt from the world every time
  (:func:`~datalane_operator.reconcile.decide`), so an operator restart or a new leader
  converges. Only kopf's stateless event handlers and indexes are used, never its changing
  handlers (``on.create``/``on.update``), which keep progress in annotations that two
  replicas would both write. No finalizer: the recipe ConfigMap is owned by the pipeline and
  goes with it; checkpoints are the user's data and stay.

The process-wide :data:`RUNTIME` is configured by ``datalane-operator run`` before kopf
starts.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import datetime as dt
import logging
import statistics
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from datalane.spec.errors import ConfigError
from datalane_operator.admission import Verdict, review_pipeline, review_scale, review_workload
from datalane_operator.amend import Progress
from datalane_operator.inject import mutate_pod
from datalane_operator.kube import Kube, status_patch
from datalane_operator.leader import LeaderElector, LeaseConfig
from datalane_operator.names import (
    GROUP,
    JOB_NAME_LABEL,
    NAMESPACE_OPT_IN_LABEL,
    NAMESPACE_OPT_IN_VALUE,
    PLURAL,
    PYTORCHJOB_GROUP,
    PYTORCHJOB_PLURAL,
    PYTORCHJOB_VERSION,
    VERSION,
    WEBHOOK_INJECT,
    WEBHOOK_REFUSE_NAMESPACE,
    WEBHOOK_VALIDATE_PIPELINE,
    WEBHOOK_VALIDATE_SCALE,
    WEBHOOK_VALIDATE_WORKLOAD,
)
from datalane_operator.pipeline import Parallelism, Pipeline, load_pipeline, parallelism_of
from datalane_operator.policy import Policy
from datalane_operator.reconcile import decide, decide_invalid
from datalane_operator.storage import (
    DEFAULT_PROTOCOLS,
    Listing,
    StoreView,
    ledger_key_of,
    operator_store_options,
)
from datalane_operator.workload import topology_of

__all__ = ["RUNTIME", "OperatorConfig", "Runtime", "TimedWebhookServer", "timed"]

log = logging.getLogger("datalane.operator")
Key = tuple[str, str]
_ADMISSION_STORE_TIMEOUT = 8.0  # the webhook's own timeout is 10 s


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

    def watches(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces


@dataclass
class Runtime:
    config: OperatorConfig = field(default_factory=OperatorConfig)
    kube: Kube | None = None
    listings: dict[Key, Listing] = field(default_factory=dict)
    running: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    again: set[Key] = field(default_factory=set)
    looking: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    collected: dict[Key, list[int]] = field(default_factory=dict)  # gc not yet reported
    storage_errors: dict[Key, Listing] = field(default_factory=dict)
    admission_ms: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=10000))
    reconcile_ms: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=10000))
    background: list[asyncio.Task[None]] = field(default_factory=list)
    elector: LeaderElector | None = None
    leading: bool = True  # without leader election this process always leads
    generations: dict[Key, int] = field(default_factory=dict)  # handled, as the leader
    recipes: dict[Key, tuple[str, str]] = field(default_factory=dict)  # ConfigMap written
    pipelines: Any = None  # kopf's index of DataPipelines, for a new leader's first round
    reconciles: int = 0

    def k(self) -> Kube:
        if self.kube is None:
            self.kube = Kube()
        return self.kube

    # -- coalesced reconciles, storage looks on the side ---------------------------------
    def kick(self, key: Key) -> None:
        """Reconcile ``key`` soon (at most one running and one waiting per pipeline)."""
        if not self.leading:
            return
        if key in self.running:
            self.again.add(key)
            return
        self.again.add(key)
        self.running[key] = asyncio.get_running_loop().create_task(self._loop(key))

    async def _loop(self, key: Key) -> None:
        try:
            while key in self.again:
                self.again.discard(key)
                t0 = time.perf_counter()
                try:
                    self.reconciles += 1
                    await reconcile(self, key)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("reconcile of %s/%s failed; the next event or storage look "
                                  "retries", *key)
                self.reconcile_ms.append((time.perf_counter() - t0) * 1000)
        finally:
            self.running.pop(key, None)

    def look(self, key: Key) -> None:
        """List (and garbage-collect) the checkpoint store of ``key`` in the background, then
        reconcile. A slow store never delays a reconcile: those use the last look."""
        if key in self.looking or not self.leading:
            return
        self.looking[key] = asyncio.get_running_loop().create_task(self._look(key))

    async def _look(self, key: Key) -> None:
        try:
            body = await self.k().get_pipeline(*key)
            if body is None:
                self.forget(key)
                return
            try:
                pipeline = load_pipeline(body)
            except ConfigError:
                return  # reconcile reports InvalidSpec
            listing = await look_at_store(self, pipeline)
            if listing.ok:
                self.listings[key] = Listing(listing.uri, listing.committed)
                self.collected.setdefault(key, []).extend(listing.deleted)
                self.storage_errors.pop(key, None)
            else:
                self.storage_errors[key] = listing
            self.kick(key)
        except Exception:
            log.exception("storage look of %s/%s failed", *key)
        finally:
            self.looking.pop(key, None)

    def forget(self, key: Key) -> None:
        for table in (self.listings, self.collected, self.storage_errors, self.generations,
                      self.recipes):
            table.pop(key, None)

    # -- leadership -----------------------------------------------------------------------
    def start_leading(self) -> None:
        """Became the leader: rebuild every pipeline's status and look at every store (the
        previous leader's work in flight is redone; all of it is idempotent)."""
        self.leading = True
        self.generations.clear()
        self.recipes.clear()
        for (namespace, _job), store in list((self.pipelines or {}).items()):
            for found in store:
                key = (namespace, str(found["metadata"]["name"]))
                self.generations[key] = int(found["metadata"].get("generation") or 0)
                self.kick(key)
                self.look(key)

    def stop_leading(self) -> None:
        """No longer the leader: stop reconciling and looking at stores at once."""
        self.leading = False
        for task in [*self.running.values(), *self.looking.values()]:
            task.cancel()
        self.again.clear()


RUNTIME = Runtime()


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _percentiles(values: collections.deque[float], recent: int = 200) -> dict[str, Any]:
    """Latency summary of all kept samples and of the ``recent`` newest ones."""
    def summary(xs: list[float]) -> dict[str, float]:
        if len(xs) < 2:
            return {"count": len(xs)}
        q = statistics.quantiles(xs, n=100, method="inclusive")
        return {"count": len(xs), "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2),
                "max_ms": round(max(xs), 2)}

    out: dict[str, Any] = summary(list(values))
    out["count"] = len(values)
    out["recent"] = summary(list(values)[-recent:])
    return out


# ----------------------------------------------------------------------------- the server


def timed(fn: Any) -> Any:
    """Wrap kopf's webhook function: time every review, fill in the object's namespace.

    The API server puts the request's namespace in ``request.namespace``; an object created
    without one in its manifest arrives without ``metadata.namespace``, and kopf hands the
    handlers only the object.
    """
    async def review(request: Any, *, webhook: str | None = None,
                     headers: dict[str, str] | None = None,
                     sslpeer: dict[str, Any] | None = None) -> Any:
        t0 = time.perf_counter()
        try:
            payload = request.get("request") or {}
            ns = payload.get("namespace")
            for key in ("object", "oldObject"):
                obj = payload.get(key)
                if ns and isinstance(obj, dict):
                    meta = obj.setdefault("metadata", {})
                    if not meta.get("namespace"):
                        meta["namespace"] = ns
            return await fn(request, webhook=webhook, headers=headers, sslpeer=sslpeer)
        finally:
            RUNTIME.admission_ms.append((time.perf_counter() - t0) * 1000)

    return review


class TimedWebhookServer(kopf.WebhookServer):
    """kopf's webhook server with :func:`timed` reviews."""

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for client_config in super().__call__(timed(fn)):
            yield client_config


# ----------------------------------------------------------------------------- indexes


@kopf.index(GROUP, VERSION, PLURAL, id="pipelines")
def index_pipelines(body: kopf.Body, namespace: str | None, spec: kopf.Spec,
                    **_: Any) -> dict[Key, dict[str, Any]]:
    """DataPipelines by (namespace, workload name)."""
    workload = (spec.get("workload") or {}).get("name", "")
    return {(namespace or "", workload): {"apiVersion": body.get("apiVersion"),
                                    "kind": body.get("kind"),
                                    "metadata": dict(body.get("metadata") or {}),
                                    "spec": dict(spec)}}


@kopf.index(PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL, id="jobs")
def index_jobs(name: str, namespace: str | None, spec: kopf.Spec,
               **_: Any) -> dict[Key, Any]:
    """PyTorchJob specs by (namespace, name)."""
    return {(namespace or "", name): {"metadata": {"name": name, "namespace": namespace},
                                "spec": dict(spec)}}


def _first(index: kopf.Index[Key, Any], key: Key) -> Any:
    try:
        return next(iter(index[key]), None)
    except KeyError:
        return None


def _parallelism(found: Mapping[str, Any]) -> Parallelism:
    """The ``spec.parallelism`` of an indexed DataPipeline; an invalid one (stored while the
    webhook was off) refuses the change, since the data-parallel world cannot be known."""
    try:
        return parallelism_of(found.get("spec") or {})
    except ConfigError as e:
        raise kopf.AdmissionError(f"DataPipeline {found['metadata'].get('name')} is invalid, "
                                  f"so the world size cannot be checked: {e}", code=422) from None


def _deny(verdict: Verdict, warnings: list[str]) -> None:
    warnings.extend(verdict.warnings)
    if not verdict.allowed:
        raise kopf.AdmissionError(verdict.message, code=422)


async def _pipeline_for(namespace: str, job: str, pipelines: kopf.Index[Key, Any],
                        ) -> dict[str, Any] | None:
    """The DataPipeline referencing ``job``: from the index, else from one live list."""
    found: dict[str, Any] | None = _first(pipelines, (namespace, job))
    if found is not None:
        return found
    for item in await RUNTIME.k().list_pipelines(namespace):
        if ((item.get("spec") or {}).get("workload") or {}).get("name") == job:
            return item
    return None


# ----------------------------------------------------------------------------- admission


@kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_VALIDATE_PIPELINE,
                  operations=["CREATE", "UPDATE"])
async def validate_pipeline(body: kopf.Body, warnings: list[str], **kw: Any) -> None:
    pipelines: kopf.Index[Key, Any] = kw["pipelines"]
    jobs: kopf.Index[Key, Any] = kw["jobs"]
    old = kw.get("old")
    namespace = body.metadata.namespace or ""
    if not RUNTIME.config.watches(namespace):
        return  # not this operator's namespace (the chart's namespaceSelector keeps it away)
    new = dict(body)
    workload = ((new.get("spec") or {}).get("workload") or {}).get("name", "")
    others = [(str(v["metadata"].get("name")), workload)
              for v in pipelines.get((namespace, workload), [])]
    job = _first(jobs, (namespace, workload))
    progress = None
    if old and (old.get("spec") or {}).get("recipe") != (new.get("spec") or {}).get("recipe"):
        progress = await store_progress(RUNTIME, dict(old))  # the store, never the status
    _deny(review_pipeline(new, dict(old) if old else None, others=others, workload=job,
                          policy=RUNTIME.config.policy,
                          protocols=RUNTIME.config.sidecar_protocols, progress=progress),
          warnings)


@kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_REFUSE_NAMESPACE, operations=["CREATE"])
async def refuse_namespace(body: kopf.Body, **_: Any) -> None:
    """Called only for namespaces *without* the opt-in label (the chart's namespaceSelector
    says so): a DataPipeline there would get no sidecars, since the pod webhook does not fire
    in such a namespace. Only CREATE: updates of a pipeline whose namespace lost the label
    later are not wedged (its status reports the pods without a sidecar)."""
    namespace = body.metadata.namespace or ""
    if not RUNTIME.config.watches(namespace):
        return
    job = ((body.get("spec") or {}).get("workload") or {}).get("name")
    raise kopf.AdmissionError(
        f"namespace {namespace!r} is not opted in to datalane: the sidecar webhook fires only "
        f"in namespaces labelled {NAMESPACE_OPT_IN_LABEL}={NAMESPACE_OPT_IN_VALUE}, so the "
        f"pods of spec.workload.name {job!r} would get no sidecar; label it first: kubectl "
        f"label namespace {namespace} {NAMESPACE_OPT_IN_LABEL}={NAMESPACE_OPT_IN_VALUE}",
        code=403)


@kopf.on.mutate("", "v1", "pods", id=WEBHOOK_INJECT, operations=["CREATE"])
async def inject_sidecar(body: kopf.Body, patch: kopf.Patch, warnings: list[str],
                         **kw: Any) -> None:
    pipelines: kopf.Index[Key, Any] = kw["pipelines"]
    labels = body.metadata.labels
    job = labels.get(JOB_NAME_LABEL)
    if not job:
        return  # not a training pod: untouched
    namespace = body.metadata.namespace or ""
    if not RUNTIME.config.watches(namespace):
        return
    found = await _pipeline_for(namespace, job, pipelines)
    if found is None:
        return
    try:
        pipeline = load_pipeline(found)
    except ConfigError as e:
        warnings.append(f"DataPipeline {found['metadata'].get('name')} is invalid, no sidecar "
                        f"injected: {e}")
        return
    try:  # a predicate stored while the webhook was off never reaches a sidecar
        RUNTIME.config.policy.check_predicates(pipeline.recipe)
        wanted = mutate_pod(dict(body), pipeline, RUNTIME.config.sidecar_image,
                            RUNTIME.config.policy.predicate_modules)
    except ConfigError as e:
        raise kopf.AdmissionError(str(e), code=422) from None
    patch.fns.append(_become(wanted))


def _become(wanted: Mapping[str, Any]) -> Callable[[Any], None]:
    def apply(body: Any) -> None:
        for key in ("metadata", "spec"):
            body[key] = wanted[key]
    return apply


@kopf.on.validate(PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL,
                  id=WEBHOOK_VALIDATE_WORKLOAD, operations=["CREATE", "UPDATE"])
async def validate_workload(body: kopf.Body, warnings: list[str], **kw: Any) -> None:
    pipelines: kopf.Index[Key, Any] = kw["pipelines"]
    old = kw.get("old")
    namespace, name = body.metadata.namespace or "", body.metadata.name or ""
    found = await _pipeline_for(namespace, name, pipelines)
    if found is None:
        return
    spec = found.get("spec") or {}
    container = (spec.get("workload") or {}).get("container", "pytorch")
    if old is not None:
        before = topology_of(dict(old), container).ranks
        if before == topology_of(dict(body), container).ranks:
            return  # the world size did not change: never wedge a job's other updates
    _deny(review_workload(dict(body), int(spec.get("lanes", 0)), found["metadata"]["name"],
                          container, _parallelism(found)), warnings)


@kopf.on.validate(PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL,
                  subresource="scale", id=WEBHOOK_VALIDATE_SCALE, operations=["UPDATE"])
async def validate_scale(body: kopf.Body, warnings: list[str], **kw: Any) -> None:
    pipelines: kopf.Index[Key, Any] = kw["pipelines"]
    jobs: kopf.Index[Key, Any] = kw["jobs"]
    namespace, name = body.metadata.namespace or "", body.metadata.name or ""
    found = await _pipeline_for(namespace, name, pipelines)
    if found is None:
        return
    job = _first(jobs, (namespace, name)) or await RUNTIME.k().get_job(namespace, name)
    if job is None:
        return
    spec = found.get("spec") or {}
    container = (spec.get("workload") or {}).get("container", "pytorch")
    _deny(review_scale(dict(body), job, int(spec.get("lanes", 0)), found["metadata"]["name"],
                       container, _parallelism(found)), warnings)


# ----------------------------------------------------------------------------- reconcile


@kopf.on.event(GROUP, VERSION, PLURAL, id="pipeline-event")
async def pipeline_event(type: str, name: str, namespace: str | None, meta: kopf.Meta,
                         **_: Any) -> None:
    """A DataPipeline was listed (a start), created or changed: reconcile it (which writes
    its recipe ConfigMap) and look at its store, once per generation; status-only changes
    (the operator's own patches) and deletions need neither."""
    key = (namespace or "", name)
    if type == "DELETED":
        RUNTIME.forget(key)
        return
    generation = int(meta.get("generation") or 0)
    if not RUNTIME.leading or RUNTIME.generations.get(key) == generation:
        return
    RUNTIME.generations[key] = generation
    RUNTIME.kick(key)
    RUNTIME.look(key)


@kopf.on.event(PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL, id="job-event")
async def job_event(name: str, namespace: str | None, **kw: Any) -> None:
    if not RUNTIME.leading:
        return
    pipelines: kopf.Index[Key, Any] = kw["pipelines"]
    ns = namespace or ""
    for found in pipelines.get((ns, name), []):
        RUNTIME.kick((ns, found["metadata"]["name"]))


@kopf.on.event("", "v1", "pods", id="pod-event", labels={JOB_NAME_LABEL: kopf.PRESENT})
async def pod_event(labels: Mapping[str, str], namespace: str | None, **kw: Any) -> None:
    if not RUNTIME.leading:
        return
    pipelines: kopf.Index[Key, Any] = kw["pipelines"]
    ns, job = namespace or "", labels.get(JOB_NAME_LABEL, "")
    for found in pipelines.get((ns, job), []):
        RUNTIME.kick((ns, found["metadata"]["name"]))


async def _store_view(rt: Runtime, pipeline: Pipeline) -> StoreView | str:
    """The pipeline's store, with the credentials of its own namespace's Secret, or the
    operator's identity only where the cluster policy allows it; otherwise why not."""
    ckpt = pipeline.spec.checkpoint
    try:
        access = rt.config.policy.store_access(pipeline.namespace, ckpt)
    except ConfigError as e:
        return str(e)
    secret = None
    if access.secret is not None:
        secret = await rt.k().read_secret(pipeline.namespace, access.secret)
        if secret is None:
            return (f"Secret {access.secret!r} (spec.checkpoint.secretRef) does not exist in "
                    f"namespace {pipeline.namespace!r}")
    try:
        options = operator_store_options(ckpt, secret)
    except ConfigError as e:
        return str(e)
    return StoreView(ckpt.uri, options, ledger_key=ledger_key_of(secret))


async def look_at_store(rt: Runtime, pipeline: Pipeline) -> Listing:
    """List and garbage-collect the pipeline's store (:func:`_store_view`); a store the
    operator may not act on is not touched (``Listing.denied``)."""
    ckpt = pipeline.spec.checkpoint
    view = await _store_view(rt, pipeline)
    if isinstance(view, str):
        return Listing(ckpt.uri, error=view, denied=True)

    def look() -> Listing:
        return view.look(ckpt.keep)

    try:
        return await asyncio.wait_for(asyncio.to_thread(look), rt.config.storage_timeout)
    except TimeoutError:
        return Listing(ckpt.uri, error=f"no answer within {rt.config.storage_timeout:.0f} s")


async def store_progress(rt: Runtime, body: Mapping[str, Any]) -> Progress:
    """The run's progress for the admission of a recipe edit: the newest step committed in
    the store of the stored pipeline ``body`` (the one the run writes), read now - never its
    status, which a user may patch. An error says why the store cannot be read."""
    spec = body.get("spec") or {}
    uri = str((spec.get("checkpoint") or {}).get("uri", ""))
    try:
        pipeline = load_pipeline(body)
    except ConfigError as e:
        return Progress(uri, error=f"the stored DataPipeline does not load: {e}")
    view = await _store_view(rt, pipeline)
    if isinstance(view, str):
        return Progress(uri, error=view)
    timeout = min(rt.config.storage_timeout, _ADMISSION_STORE_TIMEOUT)
    try:
        step, error = await asyncio.wait_for(asyncio.to_thread(view.newest), timeout)
    except TimeoutError:
        return Progress(uri, error=f"no answer within {timeout:.0f} s")
    return Progress(uri, step, error or None)


async def reconcile(rt: Runtime, key: Key) -> None:
    namespace, name = key
    kube = rt.k()
    body = await kube.get_pipeline(namespace, name)
    if body is None:
        rt.forget(key)
        return
    previous = body.get("status") or {}
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    collected: list[int] = []
    try:
        pipeline = load_pipeline(body)
    except ConfigError as e:
        decision = decide_invalid(name, generation, str(e), previous, _now())
    else:
        written = (pipeline.uid, pipeline.recipe_json())
        if rt.recipes.get(key) != written:  # errors: the next event or storage look retries
            await kube.ensure_recipe_configmap(pipeline)
            rt.recipes[key] = written
        listing = rt.storage_errors.get(key) or rt.listings.get(key)
        collected = rt.collected.pop(key, [])
        if listing is not None and collected:
            listing = Listing(listing.uri, listing.committed, collected)
        job = await kube.get_job(namespace, pipeline.spec.workload.name)
        pods = await kube.list_job_pods(namespace, pipeline.spec.workload.name) if job else []
        decision = decide(pipeline, job, pods, listing, previous, _now())
    try:
        if decision.changed(previous):
            await kube.patch_status(namespace, name, status_patch(previous, decision.status))
    except Exception:
        if collected:  # report them with the next reconcile
            rt.collected.setdefault(key, [])[:0] = collected
        raise
    for event in decision.events:
        try:
            await kube.post_event(body, event)
        except Exception as e:  # an event is not worth a failed reconcile
            log.warning("cannot post event %s on %s/%s: %s", event.reason, namespace, name, e)


# ----------------------------------------------------------------------------- lifecycle


async def _storage_loop(rt: Runtime, pipelines: kopf.Index[Key, Any]) -> None:
    while True:
        await asyncio.sleep(rt.config.storage_interval)
        if not rt.leading:
            continue
        for (namespace, _job), store in list(pipelines.items()):
            for found in store:
                rt.look((namespace, found["metadata"]["name"]))


async def _ca_loop(rt: Runtime) -> None:
    while True:
        try:
            pem = Path(rt.config.ca_file).read_bytes()
            done = await rt.k().patch_ca_bundle(rt.config.webhook_configuration, pem)
            if done:
                log.info("caBundle set in %s", ", ".join(done))
        except Exception as e:
            log.warning("cannot set the caBundle of %s: %s", rt.config.webhook_configuration, e)
        await asyncio.sleep(rt.config.ca_interval)


class RefusalsAreInfo(logging.Filter):
    """kopf logs every refused admission (``AdmissionError``) at ERROR, as a handler that
    "failed permanently"; a refusal is the webhook working, so it is logged at INFO."""

    WEBHOOKS = (WEBHOOK_VALIDATE_PIPELINE, WEBHOOK_INJECT, WEBHOOK_VALIDATE_WORKLOAD,
                WEBHOOK_VALIDATE_SCALE, WEBHOOK_REFUSE_NAMESPACE)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR:
            msg = record.getMessage()
            if any(msg.startswith(f"Webhook {w!r} failed permanently: ") for w in self.WEBHOOKS):
                record.msg, record.args = f"refused: {msg.split(': ', 1)[1]}", ()
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{GROUP}/finalizer"  # never added: no handler needs it
    settings.posting.level = logging.WARNING  # our own events say what happened
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, RefusalsAreInfo) for f in objects.filters):
        objects.addFilter(RefusalsAreInfo())
    # Watches end server-side after a bounded time and are re-established; a stream that
    # goes silent (no event, no bookmark) is dropped after inactivity_timeout.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.watching.inactivity_timeout = 70
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    settings.admission.managed = None  # the Helm chart owns the webhook configurations
    cfg = RUNTIME.config
    settings.admission.server = TimedWebhookServer(
        addr=cfg.webhook_addr, port=cfg.webhook_port, host=cfg.webhook_host,
        certfile=cfg.tls_cert, pkeyfile=cfg.tls_key, cafile=cfg.ca_file or None)
    if RUNTIME.config.webhook_configuration and RUNTIME.config.ca_file:
        RUNTIME.background.append(asyncio.get_running_loop().create_task(_ca_loop(RUNTIME)))


@kopf.on.startup(id="storage-loop")
async def start_storage_loop(**kw: Any) -> None:
    RUNTIME.pipelines = kw["pipelines"]
    loop = asyncio.get_running_loop()
    RUNTIME.background.append(loop.create_task(_storage_loop(RUNTIME, kw["pipelines"])))
    lease = RUNTIME.config.lease
    if lease is not None:
        from kubernetes import client  # type: ignore[import-untyped]

        RUNTIME.leading = False
        RUNTIME.elector = LeaderElector(
            lease, client.CoordinationV1Api(RUNTIME.k().api), RUNTIME.start_leading,
            RUNTIME.stop_leading)
        RUNTIME.background.append(loop.create_task(RUNTIME.elector.run()))


@kopf.on.cleanup()
async def stop_background(**_: Any) -> None:
    for task in RUNTIME.background:
        task.cancel()
    if RUNTIME.elector is not None:  # hand over at once rather than after a lease duration
        await RUNTIME.elector.release()


@kopf.on.probe(id="admission")
def probe_admission(**_: Any) -> dict[str, Any]:
    return _percentiles(RUNTIME.admission_ms)


@kopf.on.probe(id="reconcile")
def probe_reconcile(**_: Any) -> dict[str, Any]:
    return _percentiles(RUNTIME.reconcile_ms)


@kopf.on.probe(id="leader")
def probe_leader(**_: Any) -> dict[str, Any]:
    elector = RUNTIME.elector
    return {"leading": RUNTIME.leading, "reconciles": RUNTIME.reconciles,
            "identity": elector.cfg.identity if elector else None,
            "transitions": elector.transitions if elector else 0}


def ca_bundle(path: str) -> str:
    """base64 of a PEM file, as a webhook configuration's ``caBundle`` wants it."""
    return base64.b64encode(Path(path).read_bytes()).decode()
