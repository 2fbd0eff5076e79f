"""Edges of the data plane: several ranks per pod, restarts at awkward moments, stale objects.

Real sidecar processes on real Unix sockets (the ``sidecar`` fixture), real stores on
``file://``. Every stream is compared with the in-process mode.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import threading
from typing import Any

import numpy as np
import pytest
import torch

from datalane import ConfigError, MismatchError, StorageError, load_recipe
from datalane.client import InProcessLoader, SidecarLoader
from datalane.client.batch import Batch
from datalane.client.torch import DataLaneDataset
from datalane.spec.hashing import global_hash
from datalane.spec.state import Checkpoint
from datalane.store import CheckpointStore
from tests.store.support import write_step

pytestmark = pytest.mark.slow  # real sidecar processes


def _copy(b: Batch) -> Batch:
    return b.copy()


def _take(it: Any, n: int) -> list[Batch]:
    return [_copy(next(it)) for _ in range(n)]


def _same(a: list[Batch], b: list[Batch]) -> None:
    assert [(x.step, x.index) for x in a] == [(y.step, y.index) for y in b]
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.input_ids, y.input_ids)
        assert np.array_equal(x.positions, y.positions)


def _reference(recipe: Any, rank: int, world: int, mb: int, n: int) -> list[Batch]:
    ref = InProcessLoader(recipe, rank, world, mb)
    try:
        return _take(iter(ref), n)
    finally:
        ref.close()


def _step_hashes(recipe: Any, until: int) -> dict[int, str]:
    """The global hash of every step before ``until`` in an uninterrupted in-process run."""
    ref = _reference(recipe, 0, 1, recipe.global_batch_size, until)  # one microbatch a step
    return {b.step: global_hash(b.lane_digests[k] for k in sorted(b.lane_digests)) for b in ref}


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _joined(t: threading.Thread, out: dict[str, Any], timeout: float = 120) -> Any:
    t.join(timeout)
    assert not t.is_alive(), "the call did not return"
    if "error" in out:
        raise out["error"]
    return out["value"]


# -- the stream never ends silently -----------------------------------------------------------

def test_sigterm_with_two_sessions_never_ends_the_trainers_data(sidecar, repeat_recipe) -> None:
    """SIGTERM while two ranks (shm and inline) stream from one sidecar: the sidecar exits 0,
    and each trainer reconnects to the restarted sidecar and gets the identical stream; its
    loop must not end as if the data had run out (it did, silently, before the fix)."""
    sc = sidecar(repeat_recipe, "--ranks-per-pod", "2")
    recipe = load_recipe(repeat_recipe)
    loaders = [SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=2,
                             transport=t, reconnect_timeout=60)
               for r, t in ((0, "shm"), (1, "inline"))]
    its = [iter(ld) for ld in loaders]
    got = [_take(it, 3) for it in its]
    assert sc.terminate() == 0
    sc.start()
    for r, it in enumerate(its):
        # what was in flight comes first, then the reconnect; the loop never just ends
        while loaders[r].reconnects == 0:
            got[r] += _take(it, 1)
            assert len(got[r]) < 5000
        got[r] += _take(it, 6)
    for r, ld in enumerate(loaders):
        ld.close()
        _same(got[r], _reference(recipe, r, 2, 2, len(got[r])))


def test_a_replaced_session_is_an_error_not_the_end_of_data(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe)
    old = SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4, transport="inline")
    it = iter(old)
    _take(it, 2)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as new:
        _take(iter(new), 1)  # rank 0 opened again: the old session is closed
        with pytest.raises(StorageError, match=r"ABORTED: session .* of rank 0 was closed"):
            for _ in range(5000):  # what was already in flight, then the error
                next(it)
    old.close()


# -- several ranks per pod --------------------------------------------------------------------

def test_four_ranks_per_pod_write_one_object_once_all_asked(sidecar, repeat_recipe,
                                                           tmp_path) -> None:
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "4", "--pod", "p0")
    recipe = load_recipe(repeat_recipe)
    loaders = [SidecarLoader(sc.socket, rank=r, world_size=4, microbatch_size=2)
               for r in range(4)]
    its = [iter(ld) for ld in loaders]
    got = [_take(it, 4) for it in its]  # steps 0 and 1 (2 microbatches per step)
    calls = [_in_thread(loaders[r].checkpoint) for r in range(3)]
    store = CheckpointStore(store_uri)
    # three of four ranks asked: nothing may be written or committed yet
    assert glob.glob(str(tmp_path / "store" / "steps" / "*" / "*.json")) == []
    assert store.latest_committed() is None
    last = loaders[3].checkpoint()
    saved = [_joined(t, out) for t, out in calls] + [last]
    assert {(s["step"], s["committed"]) for s in saved} == {(2, True)}
    assert {os.path.basename(s["object"]) for s in saved} == {"pod-p0.json"}
    assert sorted(os.listdir(tmp_path / "store" / "steps" / "000000000002")) == [
        "MANIFEST.json", "pod-p0.json"]
    manifest = store.manifest(2)
    assert sorted(manifest.lanes) == list(range(8))
    hashes = _step_hashes(recipe, 2)
    assert [h for _, h in manifest.ledger] == [hashes[0], hashes[1]]
    for r, it in enumerate(its):
        got[r] += _take(it, 2)
        loaders[r].close()
        _same(got[r], _reference(recipe, r, 4, 2, 6))


def test_resume_2x2_then_1x2_then_4x2_matches_an_uninterrupted_run(sidecar, repeat_recipe,
                                                                  tmp_path) -> None:
    """Elastic: 2 pods x 2 ranks -> 1 pod x 2 -> 4 pods x 2 through the store; every step's
    global hash equals the uninterrupted run's, and the audit is clean."""
    store_uri = str(tmp_path / "store")
    recipe = load_recipe(repeat_recipe)
    reference = _step_hashes(recipe, 8)
    seen: dict[int, dict[int, bytes]] = {}
    resume = None
    for phase, pods in enumerate((2, 1, 4)):
        world = 2 * pods
        scs = [sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "2",
                       "--pod", f"w{world}-p{p}") for p in range(pods)]
        steps = 2 if phase < 2 else 3

        def rank(r: int, scs: list = scs, world: int = world, steps: int = steps,
                 resume: int | None = resume) -> dict[str, Any]:
            ld = SidecarLoader(scs[r // 2].socket, rank=r, world_size=world,
                               microbatch_size=2, resume_step=resume, copy=False)
            done = 0
            for b in ld:
                if b.lane_digests:
                    seen.setdefault(b.step, {}).update(b.lane_digests)
                    done += 1
                    if done == steps:
                        break
            saved = ld.checkpoint()
            ld.close()
            return saved

        calls = [_in_thread(lambda r=r: rank(r)) for r in range(world)]
        saved = [_joined(t, out) for t, out in calls]
        assert any(s["committed"] for s in saved)
        for sc in scs:
            assert sc.terminate() == 0
        resume = CheckpointStore(store_uri).latest_committed()
    assert resume == 7
    got = {s: global_hash(d[k] for k in sorted(d)) for s, d in seen.items()}
    assert sorted(got) == list(range(7))
    assert {s: got[s] for s in got} == {s: reference[s] for s in got}
    report = CheckpointStore(store_uri).audit()
    assert report.ok, report.text()
    assert [s for s, _ in report.ledger] == list(range(7))
    assert [s for s, h in report.ledger if h != reference[s]] == []


def test_pod_objects_of_a_pod_that_never_commits_do_not_grow(sidecar, repeat_recipe,
                                                             tmp_path) -> None:
    """Two pods; pod p0 always writes first, so its commit attempt never completes the step.
    Its objects must still carry only the digests since the last committed step (they carried
    every step since the session opened before the fix)."""
    store_uri = str(tmp_path / "store")
    scs = [sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "1", "--pod",
                   f"p{p}") for p in range(2)]
    loaders = [SidecarLoader(scs[r].socket, rank=r, world_size=2, microbatch_size=8)
               for r in range(2)]
    its = [iter(ld) for ld in loaders]
    for step in range(1, 6):
        for it in its:
            next(it)  # one microbatch per step
        first = loaders[0].checkpoint()
        second = loaders[1].checkpoint()
        assert (first["step"], first["committed"]) == (step, False)
        assert (second["step"], second["committed"]) == (step, True)
    for ld in loaders:
        ld.close()
    for step in range(2, 6):
        for pod in ("p0", "p1"):
            obj = tmp_path / "store" / "steps" / f"{step:012d}" / f"pod-{pod}.json"
            assert sorted(map(int, json.loads(obj.read_text())["digests"])) == [step - 1]
    report = CheckpointStore(store_uri).audit()
    assert report.ok, report.text()


# -- restarts at awkward moments --------------------------------------------------------------

def test_checkpoint_right_after_a_kill9_reopens_and_commits(sidecar, repeat_recipe,
                                                            tmp_path) -> None:
    """kill -9 at a step boundary, then checkpoint() before the next microbatch: the client
    opens a session at its position and the step commits (before the fix: 'no session');
    the restarted sidecar removes the killed one's shared-memory ring."""
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "1")
    recipe = load_recipe(repeat_recipe)
    loader = SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4,
                           reconnect_timeout=60)
    it = iter(loader)
    got = _take(it, 8)  # steps 0 and 1
    folder = os.path.dirname(sc.socket)
    rings = glob.glob(os.path.join(folder, "datalane-*.shm"))
    assert len(rings) == 1
    sc.kill9()
    sc.start()
    assert glob.glob(os.path.join(folder, "datalane-*.shm")) == []
    saved = loader.checkpoint()
    assert (saved["step"], saved["committed"]) == (2, True)
    got += _take(it, 8)
    loader.close()
    _same(got, _reference(recipe, 0, 1, 4, 16))
    with SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=2,
                       resume_step=2) as resumed:
        _same(_take(iter(resumed), 4), _reference(recipe, 1, 2, 2, 12)[8:12])


def test_kill9_while_a_rank_waits_for_its_pod_never_commits_broken(sidecar, repeat_recipe,
                                                                   tmp_path) -> None:
    """Two ranks per pod; rank 0 asked for a checkpoint and waits for rank 1 when the sidecar
    is killed. Nothing is committed, no partial object is left, and once the sidecar is back
    both ranks checkpoint the step and the streams go on unchanged."""
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "2")
    recipe = load_recipe(repeat_recipe)
    loaders = [SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=4,
                             reconnect_timeout=60) for r in range(2)]
    its = [iter(ld) for ld in loaders]
    got = [_take(it, 2) for it in its]  # step 0
    t0, out0 = _in_thread(lambda: loaders[0].checkpoint(timeout=60))
    sc.kill9()
    store = CheckpointStore(store_uri)
    assert store.committed_steps() == []  # rank 1 never asked: nothing was written
    assert glob.glob(str(tmp_path / "store" / "**" / "*.json*"), recursive=True) == []
    sc.start()
    t1, out1 = _in_thread(loaders[1].checkpoint)
    t0.join(90)
    assert not t0.is_alive()
    if "error" in out0:  # the call was in flight: a transient error, the trainer retries
        assert isinstance(out0["error"], StorageError) and out0["error"].transient
        first = loaders[0].checkpoint()
    else:  # it reached the restarted sidecar, which opened a session at the position
        first = out0["value"]
    saved = [first, _joined(t1, out1)]
    assert {(s["step"], s["committed"]) for s in saved} == {(1, True)}
    assert sorted(store.load(1).lanes) == list(range(8))
    for r, it in enumerate(its):
        got[r] += _take(it, 6)
        loaders[r].close()
        _same(got[r], _reference(recipe, r, 2, 4, 8))


def test_ledger_stays_continuous_across_a_sidecar_kill9(sidecar, repeat_recipe,
                                                       tmp_path) -> None:
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "1")
    loader = SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4,
                           reconnect_timeout=60)
    it = iter(loader)
    _take(it, 8)
    assert loader.checkpoint()["committed"]  # step 2
    _take(it, 10)  # into step 4
    sc.kill9()
    sc.start()
    while loader.position.consumed or loader.position.step < 7:
        next(it)
    assert loader.checkpoint()["committed"]
    loader.close()
    store = CheckpointStore(store_uri)
    report = store.audit()
    assert report.ok, report.text()
    # the steps served before the kill (2, 3) were rebuilt by replaying from step 2: the ledger
    # of step 7 tiles 2-6 with the hashes of an uninterrupted run
    ledger = dict(store.manifest(7).ledger)
    assert sorted(ledger) == [2, 3, 4, 5, 6]
    reference = _step_hashes(load_recipe(repeat_recipe), 7)
    assert {s: ledger[s] for s in ledger} == {s: reference[s] for s in range(2, 7)}


# -- stale objects and store faults seen through the sidecar ----------------------------------

def _stale_w1_object(recipe: Any, store: CheckpointStore, alter: bool) -> None:
    """What pod w1 of a 2-pod run wrote at step 2 before the run died: lanes 4-7 (``alter``:
    with another state of lane 4, as a non-deterministic source would)."""
    half = InProcessLoader(recipe, 1, 2, 8)
    hit = iter(half)
    next(hit)
    next(hit)
    ckpt = Checkpoint.from_json(half.state_dict()["state"])
    half.close()
    lanes = dict(ckpt.lanes)
    if alter:
        lanes[4] = dataclasses.replace(lanes[4], mixture=tuple(m + 1 for m in lanes[4].mixture))
    store.write_pod(2, "w1", lanes, {}, ckpt.fingerprint, ckpt.fingerprint_doc,
                    ckpt.lanes_total)
    assert store.commit(2) is None


def test_stale_object_of_another_topology_does_not_block_the_step(sidecar, repeat_recipe,
                                                                 tmp_path) -> None:
    """A step left uncommitted by a 2-pod run (only pod-w1 wrote it) and reached again on one
    pod: the states are the same, so the step commits without a manual discard."""
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "1", "--pod", "w0")
    store = CheckpointStore(store_uri)
    _stale_w1_object(load_recipe(repeat_recipe), store, alter=False)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=16) as loader:
        it = iter(loader)
        next(it)
        next(it)
        assert loader.checkpoint()["committed"]
    assert {e.object for e in store.manifest(2).lanes.values()} == {"pod-w0.json"}
    assert sorted(store.load(2).lanes) == list(range(8))


def test_a_conflicting_stale_object_is_a_mismatch_naming_both(sidecar, repeat_recipe,
                                                             tmp_path) -> None:
    """Another state of a lane in a stale object is a MismatchError naming both objects (a
    transient UNAVAILABLE before, which a trainer would retry forever); after ``discard`` the
    step commits."""
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "1", "--pod", "w0")
    store = CheckpointStore(store_uri)
    _stale_w1_object(load_recipe(repeat_recipe), store, alter=True)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=16) as loader:
        it = iter(loader)
        next(it)
        next(it)
        with pytest.raises(MismatchError, match=r"checkpoint of step 2 failed: lane 4 of step "
                                                r"2 has two different states, in .*pod-w0\.json "
                                                r"and .*pod-w1\.json"):
            loader.checkpoint()
        store.discard(2)
        assert loader.checkpoint()["committed"]
    assert sorted(store.load(2).lanes) == list(range(8))


def test_resume_from_a_truncated_or_missing_object_names_it(sidecar, repeat_recipe,
                                                            tmp_path) -> None:
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "2", "--pod", "p0")
    loaders = [SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=8)
               for r in range(2)]
    for ld in loaders:
        next(iter(ld))
    calls = [_in_thread(ld.checkpoint) for ld in loaders]
    assert all(_joined(t, o)["committed"] for t, o in calls)
    for ld in loaders:
        ld.close()
    obj = tmp_path / "store" / "steps" / "000000000001" / "pod-p0.json"
    data = obj.read_bytes()
    obj.write_bytes(data[: len(data) // 2])
    with pytest.raises(StorageError, match=r"corrupt object .*pod-p0\.json.*truncated"):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=4, microbatch_size=4,
                                resume_step=1)))
    obj.unlink()
    with pytest.raises(StorageError, match=r"pod-p0\.json is listed in .*MANIFEST\.json but "
                                           r"does not exist"):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=4, microbatch_size=4,
                                resume_step=1)))
    # the manifest: a lane listed twice in its JSON text (the second wins when parsed)
    obj.write_bytes(data)
    mpath = tmp_path / "store" / "steps" / "000000000001" / "MANIFEST.json"
    text = mpath.read_text()
    doubled = re.sub(r'"lanes":\{"0":(\{[^}]*\})', r'"lanes":{"0":\1,"0":\1', text, count=1)
    assert doubled != text
    mpath.write_text(doubled)
    with pytest.raises(StorageError, match=r"manifest .*MANIFEST\.json does not match"):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=16,
                                resume_step=1)))
    assert CheckpointStore(store_uri).latest_committed(verify=True) is None


def test_gc_keeps_the_newest_checkpoint_that_verifies(tmp_path) -> None:
    store = CheckpointStore(str(tmp_path / "store"))
    prev = None
    for step in (10, 20, 30):
        write_step(store, step, since=prev)
        assert store.commit(step) is not None
        prev = step
    newest = sorted(glob.glob(str(tmp_path / "store" / "steps" / "000000000030" / "pod-*")))[0]
    with open(newest, "ab") as f:
        f.write(b" ")
    assert store.gc(keep=1) == [10]  # 20 is the newest usable one: it stays
    assert store.committed_steps() == [20, 30]
    assert store.latest_committed(verify=True) == 20
    assert store.gc(keep=1) == []


# -- client state ------------------------------------------------------------------------------

def test_mid_step_state_refuses_another_world_or_microbatch_size(sidecar, repeat_recipe) -> None:
    recipe = load_recipe(repeat_recipe)
    src = InProcessLoader(recipe, 0, 2, 2)
    it = iter(src)
    _take(it, 5)  # step 1, one microbatch in
    state = src.state_dict()
    assert (state["step"], state["consumed"]) == (1, 1)
    for world, mb in ((2, 4), (4, 2), (1, 2)):
        with pytest.raises(ConfigError, match=rf"inside step 1 \(1 microbatches of 2 sequences "
                                              rf"consumed at world size 2\).*not world size "
                                              rf"{world} and microbatch size {mb}"):
            InProcessLoader(recipe, 0, world, mb).load_state_dict(state)
    sc = sidecar(repeat_recipe)
    with pytest.raises(ConfigError, match="inside step 1"):
        SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=4).load_state_dict(state)
    # the same layout resumes exactly
    with SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=2) as same:
        same.load_state_dict(state)
        _same(_take(iter(same), 3), _take(it, 3))
    # a state at a step boundary resizes (W=1 holds every lane)
    whole = InProcessLoader(recipe, 0, 1, 4)
    _take(iter(whole), 8)
    boundary = whole.state_dict()
    for r in range(4):
        with SidecarLoader(sc.socket, rank=r, world_size=4, microbatch_size=2) as b:
            b.load_state_dict(boundary)
            _same(_take(iter(b), 2), _reference(recipe, r, 4, 2, 6)[4:6])


def test_torch_dataset_round_trip_mid_step_with_views_across_a_restart(sidecar, repeat_recipe,
                                                                      tmp_path) -> None:
    """copy=False over shm: save the dataset mid-step, kill -9 the sidecar, restore into a new
    dataset on the restarted sidecar: the same tensors follow."""
    sc = sidecar(repeat_recipe)
    data = DataLaneDataset(SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=2,
                                         copy=False, reconnect_timeout=60))
    it = iter(data)
    for _ in range(6):  # step 1, two of four microbatches in
        next(it)
    saved = data.state_dict()
    assert json.loads(saved["lane_00004"])["consumed"] == 2
    expected = [{k: v.clone() for k, v in next(it).items()} for _ in range(5)]
    data.loader.close()
    sc.kill9()
    sc.start()
    restored = DataLaneDataset(SidecarLoader(sc.socket, rank=1, world_size=2,
                                             microbatch_size=2, copy=False))
    restored.load_state_dict(saved)
    it2 = iter(restored)
    got = [next(it2) for _ in range(5)]
    restored.loader.close()
    for a, b in zip(expected, got, strict=True):
        for key in ("input_ids", "labels", "positions", "cu_seqlens"):
            assert torch.equal(a[key], b[key])


def test_bad_ranks_are_clear_errors_before_any_call() -> None:
    with pytest.raises(ConfigError, match=r"rank -1 is outside 0\.\.1 for world size 2"):
        SidecarLoader("/nonexistent.sock", rank=-1, world_size=2)
    with pytest.raises(ConfigError, match="world size must be a positive integer, got 0"):
        SidecarLoader("/nonexistent.sock", rank=0, world_size=0)
    with pytest.raises(ConfigError, match="microbatch size must be a positive integer, got -2"):
        SidecarLoader("/nonexistent.sock", rank=0, world_size=1, microbatch_size=-2)
