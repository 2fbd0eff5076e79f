"""The leader's work on one pipeline: a reconcile, a look at its checkpoint store, and the
admission's read of a run's progress.

* :func:`reconcile`: gather the world (the pipeline, its PyTorchJob and pods, the last store
  listing), let :func:`~datalane_operator.reconcile.decide` say what the status is, patch it
  and post the events; write the current recipe's ConfigMap once per (uid, recipe), always
  before the decision restarts pods serving an older recipe (:mod:`~datalane_operator.
  rollout`), so the recreated pods find it (the pod webhook writes it too, before it admits a
  pod that mounts it); then collect the recipe ConfigMaps no pod mounts any more
  (:func:`~datalane_operator.recipemap.collect`).
* :func:`look`: list and garbage-collect the pipeline's store (:func:`look_at_store`), keep the
  listing for the next reconcile, then kick one.
* :func:`store_progress`: the newest committed step, for the recipe-edit guard.

The runtime (:class:`~datalane_operator.runtime.Runtime`) runs the first two, coalesced and
on the leader only; the webhook handlers call the third. The store's calls run on the
runtime's ``store_calls`` (a bounded pool of their own, not asyncio's default executor, which
the kube client's calls and the Lease's renewal use), each awaited at most
``storage_timeout``; one that times out and is still queued is dropped.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from datalane.spec.errors import ConfigError
from datalane_operator.amend import Progress
from datalane_operator.kinds import kind_named
from datalane_operator.kube import (
    ConfigMapsForbidden,
    PodDeleteForbidden,
    SecretForbidden,
    status_patch,
)
from datalane_operator.metrics import StoreKind, StoreOutcome
from datalane_operator.names import LABEL_PIPELINE
from datalane_operator.pipeline import Pipeline, load_pipeline
from datalane_operator.recipemap import collect, configmap_body, configmap_name
from datalane_operator.reconcile import Decision, decide, decide_invalid
from datalane_operator.storage import Listing, StoreView, ledger_key_of, operator_store_options

if TYPE_CHECKING:
    from datalane_operator.runtime import Key, Runtime

__all__ = ["collect_recipes", "look", "look_at_store", "reconcile", "store_progress"]

log = logging.getLogger("datalane.operator")
_ADMISSION_STORE_TIMEOUT = 8.0  # the webhook's own timeout is 10 s


def _stamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        try:
            secret = await rt.k().read_secret(pipeline.namespace, access.secret)
        except SecretForbidden as e:
            return str(e)
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
        rt.metrics.stored(StoreKind.LOOK, StoreOutcome.DENIED)
        return Listing(ckpt.uri, error=view, denied=True)

    def listing() -> Listing:
        return view.look(ckpt.keep)

    outcome = StoreOutcome.ERROR
    try:
        found = await asyncio.wait_for(asyncio.wrap_future(rt.store_calls.submit(listing)),
                                       rt.config.storage_timeout)
        outcome = StoreOutcome.OK if found.ok else StoreOutcome.ERROR
        return found
    except TimeoutError:
        outcome = StoreOutcome.TIMEOUT
        return Listing(ckpt.uri, error=f"no answer within {rt.config.storage_timeout:.0f} s")
    finally:
        rt.metrics.stored(StoreKind.LOOK, outcome)


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
        rt.metrics.stored(StoreKind.PROGRESS, StoreOutcome.DENIED)
        return Progress(uri, error=view)
    timeout = min(rt.config.storage_timeout, _ADMISSION_STORE_TIMEOUT)
    outcome = StoreOutcome.ERROR
    try:
        step, error = await asyncio.wait_for(
            asyncio.wrap_future(rt.store_calls.submit(view.newest)), timeout)
        outcome = StoreOutcome.ERROR if error else StoreOutcome.OK
    except TimeoutError:
        outcome = StoreOutcome.TIMEOUT
        return Progress(uri, error=f"no answer within {timeout:.0f} s")
    finally:
        rt.metrics.stored(StoreKind.PROGRESS, outcome)
    return Progress(uri, step, error or None)


async def look(rt: Runtime, key: Key) -> None:
    """Look at the store of pipeline ``key`` and keep what was seen, then reconcile."""
    body = await rt.k().get_pipeline(*key)
    if body is None:
        rt.forget(key)
        return
    try:
        pipeline = load_pipeline(body)
    except ConfigError:
        return  # reconcile reports InvalidSpec
    listing = await look_at_store(rt, pipeline)
    if listing.ok:
        rt.listings[key] = Listing(listing.uri, listing.committed)
        rt.collected.setdefault(key, []).extend(listing.deleted)
        rt.storage_errors.pop(key, None)
    else:
        rt.storage_errors[key] = listing
    rt.kick(key)


async def _restart(rt: Runtime, namespace: str, pods: list[dict[str, Any]],
                   decision: Decision) -> Decision:
    """Delete the pods the decision names (before the status says so: a failed delete fails
    the reconcile, and the next one decides again); where RBAC refuses, the decision says so
    instead."""
    uids = {str(p["metadata"]["name"]): str(p["metadata"].get("uid", "")) for p in pods}
    try:
        for name in decision.restart:
            log.info("restarting pod %s/%s: it serves an older recipe", namespace, name)
            await rt.k().delete_pod(namespace, name, uids.get(name, ""))
    except PodDeleteForbidden as e:
        return decision.restart_refused(str(e))
    return decision


async def collect_recipes(rt: Runtime, key: Key, pipeline: Pipeline,
                          pods: list[dict[str, Any]] | None) -> None:
    """Delete the pipeline's recipe ConfigMaps that no pod of its workload mounts and that
    are not the current recipe's, once they have stayed so for the grace period
    (:func:`~datalane_operator.recipemap.collect`); ``pods``: the workload's pods, None when
    not listed (no job): listed here only if there is an old ConfigMap to decide on. Never
    fails a reconcile: what is left is collected by the next one, or goes with the
    pipeline."""
    namespace = key[0]
    current = configmap_name(pipeline)
    try:
        found = await rt.k().list_configmaps(namespace, f"{LABEL_PIPELINE}={pipeline.name}")
        if pods is None and any(cm["metadata"]["name"] != current for cm in found):
            pods = await rt.k().list_job_pods(namespace, pipeline.spec.workload.name)
        plan = collect(found, pods or [], pipeline.name, current,
                       rt.unreferenced.get(key, {}), rt.clock(), rt.config.recipe_grace)
        rt.unreferenced[key] = plan.unreferenced
        for name, uid in plan.delete:
            await rt.k().delete_configmap(namespace, name, uid)
    except ConfigMapsForbidden as e:
        if key not in rt.unreferenced:  # once per leader term
            log.warning("%s", e)
        rt.unreferenced[key] = {}
    except Exception:
        log.exception("collecting the recipe ConfigMaps of %s/%s failed; the next reconcile "
                      "retries", *key)


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
    pipeline: Pipeline | None = None
    pods: list[dict[str, Any]] | None = None
    try:
        pipeline = load_pipeline(body)
    except ConfigError as e:
        decision = decide_invalid(name, generation, str(e), previous, _stamp(rt.wallclock()))
    else:
        written = (pipeline.uid, pipeline.recipe_json())
        if rt.recipes.get(key) != written:  # errors: the next event or storage look retries
            await kube.ensure_recipe_configmap(configmap_body(pipeline))
            rt.recipes[key] = written
        listing = rt.storage_errors.get(key) or rt.listings.get(key)
        collected = rt.collected.pop(key, [])
        if listing is not None and collected:
            listing = Listing(listing.uri, listing.committed, collected)
        kind = kind_named(pipeline.spec.workload.kind)
        job = await kube.get_job(namespace, pipeline.spec.workload.name, kind)
        pods = await kube.list_job_pods(namespace, pipeline.spec.workload.name,
                                        kind) if job else None
        decision = decide(pipeline, job, pods or [], listing, previous, _stamp(rt.wallclock()))
        decision = await _restart(rt, namespace, pods or [], decision)
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
    if pipeline is not None:
        await collect_recipes(rt, key, pipeline, pods)
