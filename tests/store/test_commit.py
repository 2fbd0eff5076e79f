"""When a step commits: only complete, consistent steps; idempotent and race-safe."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest

from datalane.spec.errors import ConfigError, MismatchError
from datalane.store import CheckpointStore, Manifest

from .conftest import Backend
from .support import FINGERPRINT, FP_DOC, LANES, commit_steps, lane_state, write_pod, write_step


def test_missing_pod_is_not_committed(backend: Backend) -> None:
    store = backend.store()
    assert store.commit(10) is None  # nothing written at all
    write_step(store, 10, pods=4, skip=(2,))
    assert store.commit(10) is None
    assert "MANIFEST.json" not in backend.names(10)
    assert store.committed_steps() == []
    write_pod(store, 10, 2, 4, None)
    assert store.commit(10) is not None
    assert store.committed_steps() == [10]


def test_a_stale_object_with_the_same_states_is_harmless(backend: Backend) -> None:
    """A 4-pod run wrote lanes 2-3 of step 10 as pod 9 and died before the commit; the run
    resumed on 2 pods reaches step 10 again: the states are the same, the step commits."""
    store = backend.store()
    store.write_pod(10, 9, {2: lane_state(2, 10), 3: lane_state(3, 10)}, {}, FINGERPRINT,
                    FP_DOC, LANES)
    write_step(store, 10, pods=2)
    manifest = store.commit(10)
    assert manifest is not None
    assert {lane: e.object for lane, e in manifest.lanes.items() if lane in (2, 3)} == {
        2: "pod-0.json", 3: "pod-0.json"}  # the first object by name
    assert sorted(manifest.objects) == ["pod-0.json", "pod-1.json", "pod-9.json"]
    assert store.load(10).lanes == {lane: lane_state(lane, 10) for lane in range(LANES)}
    assert store.audit().ok


def test_two_different_states_of_a_lane_are_an_error(backend: Backend) -> None:
    store = backend.store()
    write_step(store, 10, pods=2)
    # An object holding other states of lanes 2-3 at step 10 (those of step 12).
    store.write_pod(10, 9, {2: lane_state(2, 12), 3: lane_state(3, 12)}, {}, FINGERPRINT,
                    FP_DOC, LANES)
    with pytest.raises(MismatchError, match="lane 2 of step 10 has two different states") as err:
        store.commit(10)
    assert f"{store.uri}/steps/000000000010/pod-0.json" in str(err.value)
    assert f"{store.uri}/steps/000000000010/pod-9.json" in str(err.value)
    assert "MANIFEST.json" not in backend.names(10)
    # The way out: discard the uncommitted step and write it again.
    store.discard(10)
    assert backend.names(10) == []
    write_step(store, 10, pods=2)
    assert store.commit(10) is not None
    with pytest.raises(ConfigError, match="is committed"):
        store.discard(10)


def test_different_states_are_an_error_even_when_incomplete(local: Backend) -> None:
    store = local.store()
    write_pod(store, 3, 0, 4, None)
    store.write_pod(3, 7, {1: lane_state(1, 4)}, {}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(MismatchError, match="lane 1 of step 3 has two different states"):
        store.commit(3)


def test_pods_must_agree_on_recipe(local: Backend) -> None:
    store = local.store()
    write_pod(store, 3, 0, 2, None)
    write_pod(store, 3, 1, 2, None, fingerprint="0" * 64)
    with pytest.raises(MismatchError, match="step 3 mixes recipes") as err:
        store.commit(3)
    assert "pod-1.json" in str(err.value)
    assert "MANIFEST.json" not in local.names(3)


def test_pods_must_agree_on_lane_count(local: Backend) -> None:
    store = local.store()
    write_pod(store, 3, 0, 2, None)
    store.write_pod(3, 1, {4: lane_state(4, 3)}, {}, FINGERPRINT, FP_DOC, 16)
    with pytest.raises(MismatchError, match="mixes lane counts"):
        store.commit(3)


def test_conflicting_digests_are_an_error(local: Backend) -> None:
    store = local.store()
    write_pod(store, 3, 0, 2, None)
    store.write_pod(3, 1, {lane: lane_state(lane, 3) for lane in range(4, 8)},
                    {1: {0: b"\1" * 32}}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(MismatchError, match="step 1 lane 0 has two window digests"):
        store.commit(3)


def test_latest_committed_ignores_partial_newer_step(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [10, 20])
    write_step(store, 30, skip=(0,))
    assert store.commit(30) is None
    assert store.latest_committed() == 20
    assert store.latest_committed(verify=True) == 20
    assert store.committed_steps(verify=True) == [10, 20]
    # Zero-padding keeps numeric order across digit counts.
    commit_steps(store, [100])
    assert store.committed_steps() == [10, 20, 100]
    assert store.latest_committed() == 100


def test_incomplete_ledger_steps_are_left_out(local: Backend) -> None:
    store = local.store()
    # pod 1 has digests only since step 2 (restarted mid-interval); steps 0-1 lack lanes 4-7.
    write_pod(store, 5, 0, 2, None)
    write_pod(store, 5, 1, 2, 2)
    manifest = store.commit(5)
    assert manifest is not None
    assert [s for s, _ in manifest.ledger] == [2, 3, 4]
    report = store.audit()
    assert report.ok  # the first checkpoint's ledger may start after step 0


def _race(make: list[CheckpointStore], step: int) -> list[Manifest | None]:
    barrier = threading.Barrier(len(make))
    results: list[Manifest | None] = [None] * len(make)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = make[i].commit(step)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(make))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_racing_commits_write_identical_manifests(backend: Backend) -> None:
    setup = backend.store()
    commit_steps(setup, [4])
    write_step(setup, 8, pods=4, since=4)
    racers = [backend.store() for _ in range(6)]
    results = _race(racers, 8)
    assert all(r is not None for r in results)
    assert len({r.encode() for r in results if r is not None}) == 1
    stored = backend.read(8, "MANIFEST.json")
    assert results[0] is not None and stored == results[0].encode()
    assert setup.load(8).lanes == {lane: lane_state(lane, 8) for lane in range(LANES)}
    assert [n for n in backend.names(8) if ".tmp-" in n] == []


def _commit_in_process(uri: str, options: dict[str, Any], step: int, barrier: Any,
                       out: Any) -> None:
    store = CheckpointStore(uri, options)
    barrier.wait()  # every process imported and ready: commit at the same moment
    manifest = store.commit(step)
    out.put(None if manifest is None else manifest.encode())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_racing_commits_across_processes(kind: str, request: pytest.FixtureRequest) -> None:
    backend: Backend = request.getfixturevalue(kind)
    setup = backend.store()
    commit_steps(setup, [4])
    write_step(setup, 8, pods=4, since=4)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_commit_in_process,
                         args=(backend.uri, backend.options, 8, barrier, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert None not in results and len(set(results)) == 1
    assert backend.read(8, "MANIFEST.json") == results[0]
    assert setup.audit().ok


def test_every_pod_committing_after_its_write(backend: Backend) -> None:
    """The sidecar protocol: each pod writes, then tries to commit; the last one completes."""
    stores = [backend.store() for _ in range(4)]
    outcomes = []
    for pod, store in enumerate(stores):
        write_pod(store, 12, pod, 4, None)
        outcomes.append(store.commit(12))
    assert outcomes[:3] == [None, None, None]
    assert outcomes[3] is not None
    assert all(s.commit(12) == outcomes[3] for s in stores)


def test_out_of_order_commit(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10])
    write_step(store, 20, since=10, skip=(1,))
    assert store.commit(20) is None
    write_step(store, 30, since=10)  # the pods kept digests since the last committed step
    assert store.commit(30) is not None
    write_pod(store, 20, 1, 2, 10)
    late = store.commit(20)
    assert late is not None and late.previous_step == 10
    report = store.audit()
    assert report.ok, report.text()
    assert any("out of order" in n for e in report.entries for n in e.notes)
