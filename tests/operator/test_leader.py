"""Leader election over a Lease: the decision, and two electors against one Lease store that
behaves like the API server (resourceVersion conflicts)."""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from typing import Any

import pytest
from datalane_operator.leader import Action, LeaderElector, LeaseConfig, Observed, next_action
from kubernetes.client.rest import ApiException

from datalane.spec.errors import ConfigError


def lease(holder: str | None, renew: str = "t1") -> dict[str, Any]:
    return {"metadata": {"resourceVersion": "1"},
            "spec": {"holderIdentity": holder, "renewTime": renew}}


def test_next_action() -> None:
    assert next_action(None, "a", None, 0.0, 15)[0] is Action.CREATE
    assert next_action(lease("a"), "a", None, 0.0, 15)[0] is Action.RENEW
    assert next_action(lease(None), "a", None, 0.0, 15)[0] is Action.TAKE  # released
    action, seen = next_action(lease("b"), "a", None, 100.0, 15)
    assert action is Action.WAIT and seen == Observed("b", "t1", 100.0)
    # expiry counts from when *we* saw the renew time change, not from its timestamp
    assert next_action(lease("b"), "a", seen, 114.9, 15)[0] is Action.WAIT
    assert next_action(lease("b"), "a", seen, 115.0, 15)[0] is Action.TAKE
    action, renewed = next_action(lease("b", "t2"), "a", seen, 114.0, 15)  # b renewed
    assert action is Action.WAIT and renewed == Observed("b", "t2", 114.0)
    assert next_action(lease("b", "t2"), "a", renewed, 128.9, 15)[0] is Action.WAIT
    assert next_action(lease("b", "t2"), "a", renewed, 129.0, 15)[0] is Action.TAKE


def test_timings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"retry period \(2 s\) < renew deadline \(15 s\) < "
                                          r"lease duration \(15 s\)"):
        LeaseConfig("l", "ns", "me", duration=15, renew_deadline=15, retry_period=2)


class FakeLeases:
    """The Lease API as the API server serves it: create once, replace with the current
    resourceVersion only (409 otherwise); ``down`` makes every call fail."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = itertools.count(1)
        self.down: set[str] = set()  # identities whose calls fail

    def _check(self, who: str) -> None:
        if who in self.down:
            raise ApiException(status=503, reason="unavailable")

    def client(self, who: str) -> Any:
        api = self

        class Api:
            def read_namespaced_lease(self, name: str, ns: str, **_: Any) -> Any:
                api._check(who)
                if api.obj is None:
                    raise ApiException(status=404, reason="not found")

                class Resp:
                    data = __import__("json").dumps(api.obj).encode()
                return Resp()

            def create_namespaced_lease(self, ns: str, body: dict[str, Any], **_: Any) -> None:
                api._check(who)
                if api.obj is not None:
                    raise ApiException(status=409, reason="exists")
                api.obj = copy.deepcopy(body)
                api.obj["metadata"]["resourceVersion"] = str(next(api.version))

            def replace_namespaced_lease(self, name: str, ns: str, body: dict[str, Any],
                                         **_: Any) -> None:
                api._check(who)
                assert api.obj is not None
                if body["metadata"]["resourceVersion"] != api.obj["metadata"]["resourceVersion"]:
                    raise ApiException(status=409, reason="conflict")
                api.obj = copy.deepcopy(body)
                api.obj["metadata"]["resourceVersion"] = str(next(api.version))
        return Api()

    @property
    def holder(self) -> str | None:
        return None if self.obj is None else self.obj["spec"].get("holderIdentity")


DURATION, DEADLINE, RETRY = 0.6, 0.4, 0.05


async def until(cond: Any, what: str, timeout: float = 5.0) -> float:
    """Wait for ``cond()``; the seconds it took (an AssertionError after ``timeout``)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not after {timeout} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


def elector(store: FakeLeases, who: str, log: list[str]) -> LeaderElector:
    cfg = LeaseConfig("dl-leader", "ns", who, DURATION, DEADLINE, RETRY)
    return LeaderElector(cfg, store.client(who), lambda: log.append(f"{who} starts"),
                         lambda: log.append(f"{who} stops"))


def test_one_leader_then_a_handover_within_the_lease_duration() -> None:
    async def scenario() -> None:
        store, log = FakeLeases(), []
        a, b = elector(store, "a", log), elector(store, "b", log)
        tasks = {e: asyncio.create_task(e.run()) for e in (a, b)}
        await asyncio.sleep(0.3)
        assert [a.leading, b.leading].count(True) == 1
        leader, follower = (a, b) if a.leading else (b, a)
        assert store.holder == leader.cfg.identity
        assert log == [f"{leader.cfg.identity} starts"]
        # the leader dies (no release): the follower waits a lease duration, then takes over
        tasks.pop(leader).cancel()
        took = await until(lambda: follower.leading, "the follower leads")
        # bounds with room for a loaded machine's scheduling, far from 0 and from 2 durations
        assert DURATION - RETRY <= took <= 1.5 * DURATION, took
        assert store.holder == follower.cfg.identity
        assert store.obj is not None and store.obj["spec"]["leaseTransitions"] == 1
        # a clean stop releases: the other takes over at once
        restarted = elector(store, leader.cfg.identity, log)
        tasks[restarted] = asyncio.create_task(restarted.run())
        await asyncio.sleep(0.2)
        assert not restarted.leading  # the Lease is held and renewed
        await follower.release()
        tasks.pop(follower).cancel()
        # at once: a few retry periods, not the lease duration it waits for a dead leader
        assert await until(lambda: restarted.leading, "the other leads") <= DURATION / 2
        for t in tasks.values():
            t.cancel()

    asyncio.run(scenario())


def test_a_released_elector_does_not_take_the_lease_back() -> None:
    """release() is for shutdown: a round that runs after it (the loop not yet cancelled)
    must not see the Lease it just freed and take it again, which would leave the other
    replica waiting a whole lease duration."""
    async def scenario() -> None:
        store, log = FakeLeases(), []
        a = elector(store, "a", log)
        await a.step()
        assert a.leading and store.holder == "a"
        await a.release()
        assert store.holder is None and not a.leading
        await a.step()
        assert store.holder is None and not a.leading
        assert log == ["a starts", "a stops"]
        await asyncio.wait_for(a.run(), 1.0)  # the loop ends instead of retrying

    asyncio.run(scenario())


def test_release_frees_the_lease_a_round_in_flight_just_renewed() -> None:
    """The interleaving a loaded machine hits: a round read the Lease and its renewal is in
    flight when release() reads it; the renewal lands first, so a release written with the
    version it read is refused (409) and the Lease stays held: the other replica then waits a
    whole lease duration (the handover test saw 0.63 s for 0.15 at a load average of 13).
    release() waits for the round in flight, then frees the Lease it holds now."""
    import threading

    async def scenario() -> None:
        store, log = FakeLeases(), []
        a = elector(store, "a", log)
        await a.step()
        assert a.leading and store.holder == "a"
        api = store.client("a")
        read, replace = api.read_namespaced_lease, api.replace_namespaced_lease
        release_read = threading.Event()
        renewing = threading.Event()

        class Api:
            def read_namespaced_lease(self, *args: Any, **kw: Any) -> Any:
                out = read(*args, **kw)
                if a._released:  # release()'s read
                    release_read.set()
                return out

            def replace_namespaced_lease(self, name: str, ns: str, body: dict[str, Any],
                                         **kw: Any) -> None:
                if body["spec"]["holderIdentity"] == "a":  # the round's renewal
                    renewing.set()
                    release_read.wait(1.0)  # lands after release() read, if it reads first
                replace(name, ns, body, **kw)

        a.api = Api()
        round_ = asyncio.create_task(a.step())
        while not renewing.is_set():
            await asyncio.sleep(0.005)
        await a.release()
        await round_
        assert store.holder is None and not a.leading
        assert log == ["a starts", "a stops"]

    asyncio.run(scenario())


def test_a_leader_that_cannot_renew_stops_before_anyone_takes_over() -> None:
    async def scenario() -> None:
        store, log = FakeLeases(), []
        a = elector(store, "a", log)
        task = asyncio.create_task(a.run())
        await asyncio.sleep(0.1)
        assert a.leading
        store.down.add("a")  # the API server unreachable from a
        took = await until(lambda: not a.leading, "a stops leading")
        assert DEADLINE - 2 * RETRY <= took <= DEADLINE + 2 * RETRY, took
        assert took < DURATION  # stopped before another replica may take the Lease
        assert log == ["a starts", "a stops"]
        store.down.clear()
        await until(lambda: a.leading, "a leads again")  # its own Lease, renewed again
        task.cancel()

    asyncio.run(scenario())


def test_two_electors_racing_for_a_released_lease_get_one_leader() -> None:
    async def scenario() -> None:
        store, log = FakeLeases(), []
        store.obj = {"metadata": {"resourceVersion": "0"}, "spec": {"holderIdentity": None}}
        electors = [elector(store, w, log) for w in "abcd"]
        await asyncio.gather(*(e.step() for e in electors))
        assert [e.leading for e in electors].count(True) == 1
        assert store.holder == next(e.cfg.identity for e in electors if e.leading)

    asyncio.run(scenario())


def slow_taker(store: FakeLeases) -> tuple[Any, Any]:
    """A released Lease in ``store``, and a client for "a" whose writes the API server
    answers after 0.5 s; with the Event set once a write started."""
    import threading

    store.obj = {"metadata": {"resourceVersion": "0"}, "spec": {"holderIdentity": None}}
    api = store.client("a")
    writing = threading.Event()

    class SlowApi:
        read_namespaced_lease = api.read_namespaced_lease

        def replace_namespaced_lease(self, *args: Any, **kw: Any) -> None:
            writing.set()
            time.sleep(0.5)
            api.replace_namespaced_lease(*args, **kw)
    return SlowApi(), writing


def test_an_operator_stopping_mid_round_leaves_the_lease_free() -> None:
    """Runtime.stop() while the elector's round is taking the Lease (a released one): the
    write runs in a worker thread, which cancelling the round cannot stop. The release must
    wait for it and free the Lease it then holds; otherwise the stopped replica holds the
    Lease and the other waits a whole lease duration."""
    from datalane_operator.runtime import OperatorConfig, Runtime

    async def scenario() -> None:
        store = FakeLeases()
        api, writing = slow_taker(store)
        cfg = LeaseConfig("dl-leader", "ns", "a", DURATION, DEADLINE, RETRY)
        rt = Runtime(config=OperatorConfig(lease=cfg, storage_interval=60.0))
        rt.start({}, lambda: api)
        await until(writing.is_set, "the round writes")
        await rt.stop()
        assert store.holder is None  # released once the take landed
        await asyncio.sleep(0.6)  # nothing still in flight lands afterwards
        assert store.holder is None and not rt.leading
        assert rt.elector is not None and not rt.elector.leading

    asyncio.run(scenario())


def test_a_release_after_the_loop_was_cancelled_waits_for_the_write_in_flight() -> None:
    """The elector on its own: its loop cancelled mid-write (as a task group's shutdown
    would), then release(): the write still lands, and the release frees it afterwards."""
    async def scenario() -> None:
        store = FakeLeases()
        api, writing = slow_taker(store)
        a = LeaderElector(LeaseConfig("dl-leader", "ns", "a", DURATION, DEADLINE, RETRY), api,
                          lambda: None, lambda: None)
        task = asyncio.create_task(a.run())
        await until(writing.is_set, "the round writes")
        task.cancel()
        await a.release()
        assert store.holder is None and not a.leading
        await asyncio.sleep(0.6)
        assert store.holder is None and not a.leading

    asyncio.run(scenario())
