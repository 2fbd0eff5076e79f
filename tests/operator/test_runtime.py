"""The handlers' runtime: coalesced reconciles, status patches, the namespace fill-in."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from datalane_operator import handlers
from datalane_operator.kube import status_patch


def test_status_patch_nulls_what_went_away() -> None:
    old = {"phase": "Running", "worldSize": 4, "lanesPerRank": 2}
    new = {"phase": "Degraded", "worldSize": 3}
    assert status_patch(old, new) == {"lanesPerRank": None, "phase": "Degraded", "worldSize": 3}
    assert status_patch(None, new) == new


def test_reconciles_of_one_pipeline_are_coalesced(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    gate = asyncio.Event()

    async def fake(rt: Any, key: tuple[str, str]) -> None:
        calls.append(key)
        await gate.wait()

    monkeypatch.setattr(handlers, "reconcile", fake)

    async def scenario() -> None:
        rt = handlers.Runtime()
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
        while rt.running:
            await asyncio.sleep(0.01)
        assert calls == [a, b, a]
        assert len(rt.reconcile_ms) == 3

    asyncio.run(scenario())


def test_a_failing_reconcile_does_not_stop_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    async def boom(rt: Any, key: tuple[str, str]) -> None:
        calls.append(key)
        raise RuntimeError("API server unavailable")

    monkeypatch.setattr(handlers, "reconcile", boom)

    async def scenario() -> None:
        rt = handlers.Runtime()
        rt.kick(("ml", "a"))
        await asyncio.sleep(0.01)
        rt.kick(("ml", "a"))
        await asyncio.sleep(0.01)
        assert calls == [("ml", "a")] * 2 and not rt.running

    asyncio.run(scenario())


def test_reviews_are_timed_and_get_the_request_namespace() -> None:
    seen: list[dict[str, Any]] = []

    async def kopf_fn(request: Any, **kw: Any) -> Any:
        seen.append(request)
        return {"response": {"allowed": True}}

    review = handlers.timed(kopf_fn)
    before = len(handlers.RUNTIME.admission_ms)
    request = {"request": {"namespace": "ml", "object": {"metadata": {"name": "p"}},
                           "oldObject": {"metadata": {"namespace": "ml", "name": "p"}}}}
    out = asyncio.run(review(request, webhook="inject-sidecar"))
    assert out == {"response": {"allowed": True}}
    assert seen[0]["request"]["object"]["metadata"]["namespace"] == "ml"
    assert len(handlers.RUNTIME.admission_ms) == before + 1


def test_scale_webhook_applies_the_pipelines_parallelism() -> None:
    """The handler hands the indexed pipeline's spec.parallelism to the scale guard."""
    import kopf

    from .builders import dp, job, scale

    key = ("ml", "llama")
    pipelines = {key: [dp(parallelism={"tensor": 2})]}
    jobs = {key: [job(workers=2, nproc="2")]}

    def review(replicas: int, index: dict[Any, Any]) -> str:
        try:
            asyncio.run(handlers.validate_scale(body=kopf.Body(scale(replicas)), warnings=[],
                                                pipelines=index, jobs=jobs))
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


def test_only_the_leader_reconciles_and_a_new_leader_redoes_everything(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower ignores every event and the storage timer; a replica that becomes the
    leader reconciles and looks at every indexed pipeline; one that stops leading cancels
    its work in flight."""
    import kopf

    calls: list[tuple[str, tuple[str, str]]] = []
    gate = asyncio.Event()

    async def fake_reconcile(rt: Any, key: tuple[str, str]) -> None:
        calls.append(("reconcile", key))
        await gate.wait()

    async def fake_look(self: Any, key: tuple[str, str]) -> None:
        calls.append(("look", key))
        self.looking.pop(key, None)

    monkeypatch.setattr(handlers, "reconcile", fake_reconcile)
    monkeypatch.setattr(handlers.Runtime, "_look", fake_look)

    async def scenario() -> None:
        rt = handlers.Runtime(leading=False)
        monkeypatch.setattr(handlers, "RUNTIME", rt)
        rt.pipelines = {("ml", "llama"): [{"metadata": {"name": "pretrain", "generation": 3}}]}
        meta = kopf.Meta({"metadata": {"generation": 3}})
        await handlers.pipeline_event(type=None, name="pretrain", namespace="ml", meta=meta)
        await handlers.job_event(name="llama", namespace="ml", pipelines=rt.pipelines)
        rt.kick(("ml", "pretrain"))  # e.g. from a storage look that was in flight
        rt.look(("ml", "pretrain"))
        await asyncio.sleep(0.01)
        assert calls == [] and not rt.running  # a follower does nothing
        rt.start_leading()
        await asyncio.sleep(0.01)
        key = ("ml", "pretrain")
        assert sorted(calls) == [("look", key), ("reconcile", key)]
        # the same generation again (a status patch, a label): nothing new
        await handlers.pipeline_event(type="MODIFIED", name="pretrain", namespace="ml",
                                      meta=meta)
        assert rt.again == set()
        # a new generation: reconcile (queued behind the running one) and look
        await handlers.pipeline_event(type="MODIFIED", name="pretrain", namespace="ml",
                                      meta=kopf.Meta({"metadata": {"generation": 4}}))
        await asyncio.sleep(0.01)
        assert rt.again == {key} and calls.count(("look", key)) == 2
        running = rt.running[key]
        rt.stop_leading()
        await asyncio.sleep(0.01)
        assert running.cancelled() and not rt.running and not rt.again
        gate.set()

    asyncio.run(scenario())


def test_a_pipeline_outside_opted_in_namespaces_is_refused_naming_the_label() -> None:
    import kopf

    from .builders import dp

    with pytest.raises(kopf.AdmissionError) as err:
        asyncio.run(handlers.refuse_namespace(body=kopf.Body(dp(namespace="team-b"))))
    assert str(err.value) == (
        "namespace 'team-b' is not opted in to datalane: the sidecar webhook fires only in "
        "namespaces labelled datalane.io/inject=enabled, so the pods of spec.workload.name "
        "'llama' would get no sidecar; label it first: kubectl label namespace team-b "
        "datalane.io/inject=enabled")
