"""Leader election over a ``coordination.k8s.io/v1`` Lease: which operator replica acts.

The operator runs two replicas. Both serve the admission webhooks (the Service spreads the
API server's calls, so a pod creation never waits for one replica); only the **leader**
reconciles (status, events, the recipe ConfigMap) and looks at checkpoint stores (listing and
*deleting* old checkpoints, which two replicas must never do at once). The leader is whoever
holds the Lease ``<release>-datalane-leader`` in the operator's namespace, as client-go's
``leaderelection`` does it:

* the holder renews ``spec.renewTime`` every ``retry_period``; a holder that has not renewed
  for ``renew_deadline`` stops acting (before anyone else may take over);
* another replica takes the Lease once it has seen no renewal for ``duration`` seconds of its
  **own** clock (it times the last change it observed, so clock skew between nodes does not
  matter), or at once when the holder released it;
* writes carry the ``resourceVersion`` they read: of two replicas taking an expired Lease at
  once, the API server accepts one (409 for the other);
* a leader that stops (SIGTERM: a rolling update, a drain) releases the Lease, so the other
  replica takes over within one ``retry_period`` instead of ``duration``.

Why a Lease and not kopf's peering: kopf peering pauses *every* watch of a lower-priority
operator, indexes included, so a paused replica would answer admission from stale indexes;
two replicas of one Deployment also have equal priorities, which kopf treats as a conflict
it only logs. A Lease needs no extra CRD and is what ``kubectl get lease`` shows.

:func:`next_action` is the pure decision; :class:`LeaderElector` applies it (the
``kubernetes`` client in worker threads) and calls ``on_start``/``on_stop`` on transitions.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Action", "LeaderElector", "LeaseConfig", "Observed", "next_action"]

log = logging.getLogger("datalane.operator")
_RELEASE_TRIES = 3  # a release that meets a conflict reads the Lease again, this many times


@dataclass(frozen=True)
class LeaseConfig:
    """Which Lease, who we are, and the timings (client-go's defaults: 15 s, 10 s, 2 s)."""

    name: str
    namespace: str
    identity: str
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        from datalane.spec.errors import ConfigError

        if not (0 < self.retry_period < self.renew_deadline < self.duration):
            raise ConfigError(
                f"leader election needs 0 < retry period ({self.retry_period:g} s) < renew "
                f"deadline ({self.renew_deadline:g} s) < lease duration ({self.duration:g} s)")
        if not self.name or not self.namespace or not self.identity:
            raise ConfigError("leader election needs a Lease name, its namespace and an "
                              "identity (the pod's name)")


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet: create it, holding it
    RENEW = "renew"    # we hold it: renew
    TAKE = "take"      # released, or not renewed for a lease duration: take it over
    WAIT = "wait"      # someone else holds it and renews it


@dataclass(frozen=True)
class Observed:
    """The holder and renew time we last saw change, and when (our monotonic clock)."""

    holder: str
    renew_time: str
    at: float


def next_action(lease: Mapping[str, Any] | None, identity: str, seen: Observed | None,
                now: float, duration: float) -> tuple[Action, Observed | None]:
    """What to do with ``lease`` (the object, or None if absent), and what we have now seen.

    Expiry is measured from ``seen.at``, the moment *we* saw the holder's renew time last
    change, never from the timestamps written by another node's clock.
    """
    if lease is None:
        return Action.CREATE, None
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    renew = str(spec.get("renewTime") or "")
    if seen is None or (seen.holder, seen.renew_time) != (holder, renew):
        seen = Observed(holder, renew, now)
    if holder == identity:
        return Action.RENEW, seen
    if not holder:
        return Action.TAKE, seen
    if now - seen.at >= duration:
        return Action.TAKE, seen
    return Action.WAIT, seen


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Hold the Lease while this replica lives; ``leading`` says whether it does now."""

    def __init__(self, cfg: LeaseConfig, api: Any, on_start: Callable[[], None],
                 on_stop: Callable[[], None]) -> None:
        self.cfg = cfg
        self.api = api  # kubernetes.client.CoordinationV1Api
        self.on_start, self.on_stop = on_start, on_stop
        self.leading = False
        self.transitions = 0  # how many times this replica became the leader
        self._seen: Observed | None = None
        self._renewed = 0.0  # monotonic time of our last successful renewal
        self._released = False  # release() was called: never lead again
        self._round = asyncio.Lock()  # one round or release at a time

    # -- API calls, off the event loop ----------------------------------------------------
    async def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        kw.setdefault("_request_timeout", max(1.0, self.cfg.retry_period))
        return await asyncio.to_thread(fn, *args, **kw)

    async def _read(self) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]

        try:
            resp = await self._call(self.api.read_namespaced_lease, self.cfg.name,
                                    self.cfg.namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def _spec(self, lease: Mapping[str, Any] | None, taking: bool) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        now = _micro_now()
        spec.update(holderIdentity=self.cfg.identity, renewTime=now,
                    leaseDurationSeconds=max(1, round(self.cfg.duration)))
        if taking or not spec.get("acquireTime"):
            spec["acquireTime"] = now
            if lease is not None:
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        return spec

    async def _write(self, action: Action, lease: dict[str, Any] | None) -> bool:
        """Create, renew or take the Lease; False if another replica won a race (409)."""
        from kubernetes.client.rest import ApiException

        try:
            if action is Action.CREATE:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                        "spec": self._spec(None, True) | {"leaseTransitions": 0}}
                await self._call(self.api.create_namespaced_lease, self.cfg.namespace, body)
            else:
                assert lease is not None  # RENEW and TAKE come with the Lease they read
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace,
                                     "resourceVersion": lease["metadata"]["resourceVersion"]},
                        "spec": self._spec(lease, action is Action.TAKE)}
                await self._call(self.api.replace_namespaced_lease, self.cfg.name,
                                 self.cfg.namespace, body)
        except ApiException as e:
            if e.status in (409, 422):  # someone else wrote first
                return False
            raise
        return True

    # -- the loop -------------------------------------------------------------------------
    async def step(self) -> None:
        """One round: read, decide, write; then start or stop leading as it turned out.

        The round runs as a task of its own, shielded: cancelling :meth:`run` (an operator
        stopping) cannot stop a write already in a worker thread, so the round keeps the lock
        until that write has landed, and a :meth:`release` after it frees what it wrote."""
        await asyncio.shield(asyncio.ensure_future(self._locked_step()))

    async def _locked_step(self) -> None:
        async with self._round:
            await self._step()

    async def _step(self) -> None:
        if self._released:
            return
        now = time.monotonic()
        ok = False
        try:
            lease = await self._read()
            action, self._seen = next_action(lease, self.cfg.identity, self._seen, now,
                                             self.cfg.duration)
            if action is not Action.WAIT:
                ok = await self._write(action, lease)
                if ok and action is not Action.RENEW:
                    log.info("leader election: %s now holds Lease %s/%s (%s)",
                             self.cfg.identity, self.cfg.namespace, self.cfg.name,
                             action.value)
            elif self.leading:
                log.warning("leader election: Lease %s/%s is held by %s", self.cfg.namespace,
                            self.cfg.name, self._seen.holder if self._seen else "?")
        except Exception as e:
            log.warning("leader election: cannot read or write Lease %s/%s: %s",
                        self.cfg.namespace, self.cfg.name, e)
        if ok and self._released:  # released while this round's write was in flight
            return
        if ok:
            self._renewed = time.monotonic()
            if not self.leading:
                self.leading = True
                self.transitions += 1
                self.on_start()
            return
        if not self.leading:
            return
        taken = self._seen is not None and self._seen.holder not in ("", self.cfg.identity)
        if taken or time.monotonic() - self._renewed >= self.cfg.renew_deadline:
            self.leading = False
            log.warning("leader election: %s stops leading (Lease %s/%s not renewed)",
                        self.cfg.identity, self.cfg.namespace, self.cfg.name)
            self.on_stop()

    async def run(self) -> None:
        while not self._released:
            await self.step()
            await asyncio.sleep(self.cfg.retry_period)

    async def release(self) -> None:
        """Give the Lease up (on shutdown), so that the other replica takes over at once; this
        elector never leads again. A round in flight finishes first (its write would land
        after the release's read, and the release, written with the version it read, would be
        refused), and a release that still meets a conflict reads the Lease again."""
        from kubernetes.client.rest import ApiException

        self._released = True
        async with self._round:
            if self.leading:
                self.leading = False
                self.on_stop()
            try:
                for _ in range(_RELEASE_TRIES):
                    lease = await self._read()
                    if lease is None or (lease.get("spec") or {}).get("holderIdentity") != (
                            self.cfg.identity):
                        return
                    spec = dict(lease.get("spec") or {})
                    spec.update(holderIdentity=None, leaseDurationSeconds=1,
                                renewTime=_micro_now())
                    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace,
                                         "resourceVersion": lease["metadata"]["resourceVersion"]},
                            "spec": spec}
                    try:
                        await self._call(self.api.replace_namespaced_lease, self.cfg.name,
                                         self.cfg.namespace, body)
                    except ApiException as e:
                        if e.status == 409:  # written since the read: read it again
                            continue
                        raise
                    log.info("leader election: %s released Lease %s/%s", self.cfg.identity,
                             self.cfg.namespace, self.cfg.name)
                    return
                raise RuntimeError(f"{_RELEASE_TRIES} writes met a conflict")
            except Exception as e:
                log.warning("leader election: cannot release Lease %s/%s: %s",
                            self.cfg.namespace, self.cfg.name, e)
