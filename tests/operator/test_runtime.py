"""The handlers' runtime: coalesced reconciles, status patches, the namespace fill-in."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from datalane_operator import handlers
from datalane_operator.kube import status_patch
from datalane_operator.runtime import Runtime
from datalane_operator.stats import timed


def test_status_patch_nulls_what_went_away() -> None:
    old = {"phase": "Running", "worldSize": 4, "lanesPerRank": 2}
    new = {"phase": "Degraded", "worldSize": 3}
    assert status_patch(old, new) == {"lanesPerRank": None, "phase": "Degraded", "worldSize": 3}
    assert status_patch(None, new) == new


def test_reconciles_of_one_pipeline_are_coalesced() -> None:
    calls: list[tuple[str, str]] = []
    gate = asyncio.Event()

    async def fake(rt: Any, key: tuple[str, str]) -> None:
        calls.append(key)
        await gate.wait()

    async def scenario() -> None:
        rt = Runtime(reconcile=fake)
        a, b = ("ml", "a"), ("ml", "b")
        for _ in range(100):  # kicks before the reconcile starts: one reconcile
            rt.kick(a)
        rt.kick(b)
        await asyncio.sleep(0.01)
        assert calls == [a, b]
        for _ in range(500):  # an event storm while it runs: one more afterwards
            rt.kick(a)
        await asyncio.sleep(0.01)
        assert calls == [a, b]
        gate.set()
        while rt.reconciles.running:
            await asyncio.sleep(0.01)
        assert calls == [a, b, a]
        assert len(rt.reconcile_latency) == 3

    asyncio.run(scenario())


def test_a_failing_reconcile_does_not_stop_the_next() -> None:
    calls = []

    async def boom(rt: Any, key: tuple[str, str]) -> None:
        calls.append(key)
        raise RuntimeError("API server unavailable")

    async def scenario() -> None:
        rt = Runtime(reconcile=boom)
        rt.kick(("ml", "a"))
        await asyncio.sleep(0.01)
        rt.kick(("ml", "a"))
        await asyncio.sleep(0.01)
        assert calls == [("ml", "a")] * 2 and not rt.reconciles.running

    asyncio.run(scenario())


def test_reviews_are_timed_and_get_the_request_namespace() -> None:
    seen: list[dict[str, Any]] = []

    async def kopf_fn(request: Any, **kw: Any) -> Any:
        seen.append(request)
        return {"response": {"allowed": True}}

    ticks = iter([10.0, 10.004])  # a fake clock: the review takes 4 ms
    rt = Runtime(clock=lambda: next(ticks))
    review = timed(kopf_fn, rt.clock, rt.reviewed)
    request = {"request": {"namespace": "ml", "object": {"metadata": {"name": "p"}},
                           "oldObject": {"metadata": {"namespace": "ml", "name": "p"}}}}
    out = asyncio.run(review(request, webhook="inject-sidecar"))
    assert out == {"response": {"allowed": True}}
    assert seen[0]["request"]["object"]["metadata"]["namespace"] == "ml"
    assert list(rt.admission.ms) == pytest.approx([4.0])


def test_scale_webhook_applies_the_pipelines_parallelism() -> None:
    """The handler hands the indexed pipeline's spec.parallelism to the scale guard."""
    from .builders import dp, job, scale

    key = ("ml", "llama")
    pipelines = {key: [dp(parallelism={"tensor": 2})]}
    jobs = {key: [job(workers=2, nproc="2")]}

    def review(replicas: int, index: dict[Any, Any]) -> str:
        try:
            asyncio.run(handlers.validate_scale(body=kopf.Body(scale(replicas)), warnings=[],
                                                pipelines=index, jobs=jobs,
                                                memo=kopf.Memo(runtime=Runtime())))
        except kopf.AdmissionError as e:
            return str(e)
        return "allowed"

    assert review(9, pipelines) == ("8 lanes cannot be split over 9 workers (world size 18: 9 "
                                    "pods x 2 ranks, TP 2 -> DP 9); use 1 to 8 workers "
                                    "(DataPipeline pretrain)")
    assert review(8, pipelines) == "allowed"  # DP 8 (16 ranks would be more than 8 lanes)
    assert review(3, pipelines) == "allowed"  # DP 3: ranks of 2, 3 and 3 lanes
    broken = {key: [dp(parallelism={"tensor": 0})]}
    assert review(8, broken).startswith("DataPipeline pretrain is invalid, so the world size "
                                        "cannot be checked: spec.parallelism.tensor 0")


def test_only_the_leader_reconciles_and_a_new_leader_redoes_everything() -> None:
    """A follower ignores every event and the storage timer; a replica that becomes the
    leader reconciles and looks at every indexed pipeline; one that stops leading cancels
    its work in flight."""
    calls: list[tuple[str, tuple[str, str]]] = []
    gate = asyncio.Event()

    async def fake_reconcile(rt: Any, key: tuple[str, str]) -> None:
        calls.append(("reconcile", key))
        await gate.wait()

    async def fake_look(rt: Any, key: tuple[str, str]) -> None:
        calls.append(("look", key))

    async def scenario() -> None:
        rt = Runtime(leading=False, reconcile=fake_reconcile, look_at=fake_look)
        memo = kopf.Memo(runtime=rt)
        rt.pipelines = {("ml", "llama"): [{"metadata": {"name": "pretrain", "generation": 3}}]}
        meta = kopf.Meta({"metadata": {"generation": 3}})
        await handlers.pipeline_event(type=None, name="pretrain", namespace="ml", meta=meta,
                                      memo=memo)
        await handlers.job_event(name="llama", namespace="ml", pipelines=rt.pipelines,
                                 memo=memo)
        rt.kick(("ml", "pretrain"))  # e.g. from a storage look that was in flight
        rt.look(("ml", "pretrain"))
        await asyncio.sleep(0.01)
        assert calls == [] and not rt.reconciles.running  # a follower does nothing
        rt.start_leading()
        await asyncio.sleep(0.01)
        key = ("ml", "pretrain")
        assert sorted(calls) == [("look", key), ("reconcile", key)]
        # the same generation again (a status patch, a label): nothing new
        await handlers.pipeline_event(type="MODIFIED", name="pretrain", namespace="ml",
                                      meta=meta, memo=memo)
        assert rt.reconciles.waiting == set()
        # a new generation: reconcile (queued behind the running one) and look
        await handlers.pipeline_event(type="MODIFIED", name="pretrain", namespace="ml",
                                      meta=kopf.Meta({"metadata": {"generation": 4}}),
                                      memo=memo)
        await asyncio.sleep(0.01)
        assert rt.reconciles.waiting == {key} and calls.count(("look", key)) == 2
        running = rt.reconciles.running[key]
        rt.stop_leading()
        await asyncio.sleep(0.01)
        assert running.cancelled() and not rt.reconciles.running and not rt.reconciles.waiting
        gate.set()

    asyncio.run(scenario())


def test_a_pipeline_outside_opted_in_namespaces_is_refused_naming_the_label() -> None:
    from .builders import dp

    with pytest.raises(kopf.AdmissionError) as err:
        asyncio.run(handlers.refuse_namespace(body=kopf.Body(dp(namespace="team-b")),
                                              memo=kopf.Memo(runtime=Runtime())))
    assert str(err.value) == (
        "namespace 'team-b' is not opted in to datalane: the sidecar webhook fires only in "
        "namespaces labelled datalane.io/inject=enabled, so the pods of spec.workload.name "
        "'llama' would get no sidecar; label it first: kubectl label namespace team-b "
        "datalane.io/inject=enabled")


def test_handlers_take_the_runtime_from_kopfs_memo() -> None:
    """No module-global runtime: each handler uses the Runtime of the memo it is given (kopf
    hands a resource's handlers a shallow copy of the operator's memo: the same Runtime), and
    a memo without one is refused, naming how the operator is meant to start."""
    import copy

    from .builders import dp

    assert not hasattr(handlers, "RUNTIME")
    rt = Runtime()
    assert handlers.runtime_of(copy.copy(kopf.Memo(runtime=rt))) is rt
    with pytest.raises(RuntimeError, match="memo holds no datalane Runtime: start the operator "
                                           "with `datalane-operator run`"):
        asyncio.run(handlers.refuse_namespace(body=kopf.Body(dp(namespace="team-b")),
                                              memo=kopf.Memo()))
    watching = Runtime()
    watching.config.namespaces = ("team-a",)  # team-b is not this operator's: no refusal
    asyncio.run(handlers.refuse_namespace(body=kopf.Body(dp(namespace="team-b")),
                                          memo=kopf.Memo(runtime=watching)))


def test_refusals_are_logged_at_info_and_other_errors_stay() -> None:
    import logging

    from datalane_operator.logfilter import RefusalsAreInfo

    def record(msg: str, *args: Any) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, msg, args, None)

    refused = record("Webhook %r failed permanently: %s", "inject-sidecar",
                     "spec.recipe.filters.predicate 'x:y' is not allowed")
    assert RefusalsAreInfo().filter(refused)
    assert (refused.levelno, refused.levelname, refused.getMessage()) == (
        logging.INFO, "INFO", "refused: spec.recipe.filters.predicate 'x:y' is not allowed")
    for other in (record("Webhook %r failed permanently: %s", "made-up", "boom"),
                  record("Handler 'pipeline-event' failed with an exception.")):
        assert RefusalsAreInfo().filter(other) and other.levelno == logging.ERROR


def test_a_leader_elected_again_does_not_reconcile_on_its_previous_terms_listing() -> None:
    """A replica that led, lost the Lease and leads again must not decide on the store
    listing it kept from its previous term (the store moved on under the other leader): its
    first reconciles run before its first look, and with an old listing they set
    lastCommittedStep backwards and plan_roll sees a 'fresh' old checkpoint (restart now)
    where the real newest one may be past the phase (CheckpointPastPhase: leave the pods)."""
    from datalane_operator.storage import Listing

    seen: list[Any] = []
    never = asyncio.Event()

    async def fake_reconcile(rt: Any, key: tuple[str, str]) -> None:
        seen.append(rt.storage_errors.get(key) or rt.listings.get(key))

    async def slow_look(rt: Any, key: tuple[str, str]) -> None:
        await never.wait()  # the new term's look has not answered yet

    async def scenario() -> None:
        key = ("ml", "pretrain")
        rt = Runtime(leading=True, reconcile=fake_reconcile, look_at=slow_look)
        rt.pipelines = {("ml", "llama"): [{"metadata": {"name": "pretrain", "generation": 3}}]}
        rt.listings[key] = Listing("s3://b/run", [100, 200])  # what its first term saw
        rt.stop_leading()
        rt.start_leading()  # an hour later: the store holds steps up to 900 by now
        await asyncio.sleep(0.01)
        assert seen == [None], f"reconciled on the previous term's listing {seen}"
        rt.stop_leading()

    asyncio.run(scenario())
