"""The sidecar tier: real sidecar processes, real Unix sockets, real trainers' clients.

Every stream is compared with the in-process mode, which must yield the identical bytes.
"""

from __future__ import annotations

import json
import os
import re
import socket as socketlib
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

import grpc
import numpy as np
import pytest

from datalane import ConfigError, MismatchError, StorageError, load_recipe
from datalane.client import InProcessLoader, SidecarLoader
from datalane.engine.plan import Plan
from datalane.spec.integrity import check_seal
from datalane.spec.schema import text_schema
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg

pytestmark = pytest.mark.slow  # real sidecar processes


def _take(loader, n: int) -> list:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def _acked(loader: SidecarLoader) -> list[int] | None:
    """The position the sidecar last heard from ``loader``'s session."""
    sessions = loader.stats()["sessions"]
    return next((s["acked"] for s in sessions.values() if s["rank"] == loader.rank), None)


def _same(a: list, b: list) -> None:
    assert [(x.step, x.index) for x in a] == [(y.step, y.index) for y in b]
    for x, y in zip(a, b, strict=True):
        assert x.schema == y.schema and list(x.columns) == list(y.columns)
        for name in x.columns:
            assert x.columns[name].dtype == y.columns[name].dtype
            assert np.array_equal(x.columns[name], y.columns[name])


@pytest.mark.parametrize("transport,copy", [("shm", True), ("shm", False), ("inline", True)])
def test_concurrent_ranks_get_the_in_process_stream(sidecar, repeat_recipe, transport,
                                                   copy) -> None:
    sc = sidecar(repeat_recipe)
    recipe = load_recipe(repeat_recipe)
    results: dict[int, list] = {}

    def rank(r: int) -> None:
        with SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=2,
                           transport=transport, copy=copy) as loader:
            got = []
            for b in loader:  # copy the views: with copy=False they live until the next one
                got.append(b.copy())
                if len(got) == 24:
                    break
            results[r] = got

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in (0, 1):
        _same(results[r], _take(InProcessLoader(recipe, r, 2, 2), 24))


def test_a_session_reopens_with_another_rank_and_world(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe)
    recipe = load_recipe(repeat_recipe)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as a:
        first = _take(a, 12)  # steps 0..2 of the whole batch
        state = a.state_dict()
    assert (state["step"], state["consumed"]) == (3, 0)
    # the elastic restart: 4 ranks now, from the same position, same sidecar process
    for r in range(4):
        with SidecarLoader(sc.socket, rank=r, world_size=4, microbatch_size=2) as b:
            b.load_state_dict(state)
            got = _take(b, 4)
        ref = InProcessLoader(recipe, r, 4, 2)
        ref.load_state_dict(state)
        _same(got, _take(ref, 4))
        assert got[0].step == 3
    _same(first, _take(InProcessLoader(recipe, 0, 1, 4), 12))


def test_kill9_mid_stream_then_restart_the_stream_is_identical(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe)
    recipe = load_recipe(repeat_recipe)
    loader = SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=2,
                           reconnect_timeout=60)
    got = []
    restart = threading.Timer(1.0, sc.start)
    for batch in loader:
        got.append(batch)
        if len(got) == 7:  # in the middle of a step (4 microbatches each)
            sc.kill9()
            restart.start()
        if len(got) == 20:
            break
    loader.close()
    # the restart returns once it sees the sidecar serving, which the loader may have seen
    # first: waited for here, not killed under it by the fixture's teardown (which failed the
    # next test with the timer thread's error)
    restart.join(120)
    assert loader.reconnects >= 1
    _same(got, _take(InProcessLoader(recipe, 1, 2, 2), 20))


def test_sigterm_persists_resume_points_and_exits_zero(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe)
    loader = SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    # the client acknowledges its position once per step (after step 0 here); wait until the
    # sidecar has it, so the resume point below is a fact and not a race with SIGTERM
    deadline = time.monotonic() + 30
    while _acked(loader) != [1, 0]:
        assert time.monotonic() < deadline, f"acked {_acked(loader)}"
        time.sleep(0.05)
    assert sc.terminate() == 0
    with open(os.path.join(os.path.dirname(sc.socket), "resume-rank-0.json")) as f:
        point = json.load(f)
    # sealed: the file verifies, and one changed number does not
    assert point["format"] == "datalane.resume-point/v1"
    assert check_seal(point, "the resume point", required=True)
    with pytest.raises(MismatchError, match="fails its integrity check"):
        check_seal({**point, "skip_microbatches": point["skip_microbatches"] + 1}, "it")
    assert point["world_size"] == 2
    # 5 microbatches handed out (2 steps of 4 and 1): the sidecar knows the client's last
    # acknowledged position, which never runs ahead of the trainer
    acked = point["state"]["step"] * 4 + point["skip_microbatches"]
    assert acked == 4
    assert point["delivered_through"][0] * 4 + point["delivered_through"][1] + 1 >= 5
    assert not os.path.exists(sc.socket)
    logs = [json.loads(line) for line in sc.log.read_text().splitlines() if line.startswith("{")]
    assert any(rec["msg"] == "resume point saved" for rec in logs)


def test_socket_file_modes(sidecar, repeat_recipe) -> None:
    default = sidecar(repeat_recipe)
    assert stat.S_IMODE(os.stat(default.socket).st_mode) == 0o600
    shared = sidecar(repeat_recipe, "--socket-mode", "0660")
    assert stat.S_IMODE(os.stat(shared.socket).st_mode) == 0o660


def test_unwritable_socket_path_is_a_clear_error(repeat_recipe, tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "datalane_sidecar", "serve", "--socket",
                           str(tmp_path / "missing" / "x.sock"), "--recipe", repeat_recipe],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 2
    assert f"the folder {tmp_path / 'missing'} does not exist" in proc.stderr
    # a folder nobody may create sockets in (even root): /proc
    proc = subprocess.run([sys.executable, "-m", "datalane_sidecar", "serve", "--socket",
                           "/proc/datalane-test.sock", "--recipe", repeat_recipe],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 2
    assert ("cannot listen on unix socket /proc/datalane-test.sock" in proc.stderr
            or "the folder /proc is not writable" in proc.stderr), proc.stderr


def test_probe_fails_without_a_sidecar(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "datalane_sidecar", "probe", "--socket",
                           str(tmp_path / "none.sock"), "--timeout", "0.5"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 1
    assert "not serving" in proc.stderr


def test_bad_requests_get_clear_errors(sidecar, repeat_recipe, write_recipe) -> None:
    sc = sidecar(repeat_recipe)
    with pytest.raises(ConfigError, match=r"8 lanes cannot be split over 9 ranks \(a rank owns "
                                          r"at least one lane\); use a world size of 1 to 8"):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=9, microbatch_size=1)))
    with pytest.raises(ConfigError, match=r"microbatch size 3 does not divide the local batch "
                                          r"of 8 sequences \(B=16, L=8, W=2\); use one of "
                                          r"\[1, 2, 4, 8\]"):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=3)))
    with pytest.raises(ConfigError, match="resume from_step needs a checkpoint store"):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=2,
                                resume_step=40)))
    other = InProcessLoader(load_recipe(write_recipe(seed=99)), 0, 2, 2)
    _take(other, 4)
    foreign = SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=2)
    foreign.load_state_dict(other.state_dict())
    with pytest.raises(MismatchError, match=r"recipe\.seed: saved 99, now 5"):
        next(iter(foreign))


def test_protocol_versions_must_match(sidecar, repeat_recipe, monkeypatch) -> None:
    sc = sidecar(repeat_recipe)
    import datalane.client.sidecar as client_mod

    monkeypatch.setattr(client_mod, "PROTOCOL_VERSION", 99)
    with pytest.raises(MismatchError, match=r"client speaks datalane wire protocol 99, the "
                                            r"sidecar speaks protocol 2: upgrade the sidecar"):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=1)))


def _raw_open(socket: str, request: pb.OpenRequest) -> pb.OpenReply:
    with grpc.insecure_channel(f"unix://{os.path.abspath(socket)}") as channel:
        reply: pb.OpenReply = pbg.DataLaneStub(channel).Open(request, timeout=60)
        return reply


def test_a_protocol_1_client_is_refused_naming_both_versions(sidecar, repeat_recipe) -> None:
    """What a trainer with datalane of protocol 1 (input_ids/positions only) sees: its
    OpenRequest, built by hand (the message is unchanged), is refused before any session."""
    sc = sidecar(repeat_recipe)
    v1 = pb.OpenRequest(protocol_version=1, rank=0, world_size=1, microbatch_size=2,
                        from_start=True, transport=pb.TRANSPORT_SHM)
    with pytest.raises(grpc.RpcError) as e:
        _raw_open(sc.socket, v1)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details() == (
        "the trainer's client speaks datalane wire protocol 1, the sidecar speaks protocol 2: "
        "upgrade the trainer's datalane package to the sidecar's release (or run a sidecar "
        "image of the trainer's release)")
    with grpc.insecure_channel(f"unix://{os.path.abspath(sc.socket)}") as channel:
        stats = json.loads(pbg.DataLaneStub(channel).Stats(pb.StatsRequest(), timeout=10).json)
    assert stats["sessions"] == {}  # nothing was opened for it


def test_open_and_health_announce_the_schema_and_layout(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe)
    pad = Plan.build(load_recipe(repeat_recipe)).tokenizer.pad_id
    for transport in (pb.TRANSPORT_INLINE, pb.TRANSPORT_SHM):
        reply = _raw_open(sc.socket, pb.OpenRequest(
            protocol_version=2, rank=0, world_size=2, microbatch_size=1, from_start=True,
            transport=transport))
        assert reply.protocol_version == 2
        assert json.loads(reply.schema_json) == [
            {"name": "input_ids", "dtype": "int32", "pad": pad, "fill": "document",
             "default": 0, "per_token": True},
            {"name": "positions", "dtype": "int32", "pad": -1, "fill": "position",
             "default": 0, "per_token": True}]
        # one sequence of 129 tokens: 516 bytes of input_ids, positions at the next multiple
        # of 8 (520), 1040 bytes a slot
        assert [(f.name, f.dtype, f.offset, f.nbytes, list(f.shape)) for f in reply.layout] == [
            ("input_ids", "int32", 0, 516, [1, 129]), ("positions", "int32", 520, 516, [1, 129])]
        assert reply.slot_bytes == 1040
        if transport == pb.TRANSPORT_SHM:
            assert reply.shm_bytes % 1040 == 0 and reply.shm_bytes // 1040 >= 8
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=2) as loader:
        assert loader.schema == text_schema(pad)  # from Health, before any session


def _with_metrics(sidecar: Any, recipe: str) -> tuple[Any, str]:
    """A sidecar exporting metrics on a free loopback port, and its /metrics URL."""
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sc = sidecar(recipe, "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
    return sc, f"http://127.0.0.1:{port}/metrics"


def test_prometheus_metrics(sidecar, repeat_recipe) -> None:
    sc, url = _with_metrics(sidecar, repeat_recipe)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as loader:
        _take(loader, 8)
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    assert "datalane_tokens_total" in text
    sent = re.search(r"^datalane_microbatches_total (\S+)$", text, re.M)
    # the 8 microbatches taken, and what the client had read ahead of them
    assert sent is not None and float(sent.group(1)) >= 8, text
    assert "datalane_queue_depth" in text
    assert "datalane_trainer_wait_seconds" in text


def test_prometheus_metrics_show_the_realized_mixture(sidecar, repeat_recipe) -> None:
    sc, url = _with_metrics(sidecar, repeat_recipe)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as loader:
        _take(loader, 8)
        text = urllib.request.urlopen(url, timeout=10).read().decode()

    def gauge(name: str) -> dict[str, float]:
        return {m[1]: float(m[2]) for m in re.finditer(
            rf'^{name}{{source="(\w+)"}} ([0-9.e+-]+)$', text, re.M)}

    assert gauge("datalane_source_weight") == {"web": 0.7, "code": 0.3}
    tokens, share = gauge("datalane_source_tokens"), gauge("datalane_source_share")
    assert set(tokens) == {"web", "code"} and all(v > 0 for v in tokens.values())
    total = tokens["web"] + tokens["code"]
    assert share == pytest.approx({k: v / total for k, v in tokens.items()})


def test_client_needs_a_socket(monkeypatch) -> None:
    monkeypatch.delenv("DATALANE_SOCKET", raising=False)
    with pytest.raises(ConfigError, match=r"no sidecar socket"):
        SidecarLoader(rank=0, world_size=1)
    with pytest.raises(StorageError, match="did not answer"):
        next(iter(SidecarLoader("/nonexistent/dl.sock", rank=0, world_size=1,
                                open_timeout=1)))


def test_sidecar_demo_with_an_s3_store_matches_and_audits(s3_bucket, tmp_path) -> None:
    """2 pods x 2 ranks -> 1 pod -> 4 pods through sidecars, checkpoints on moto's S3."""
    uri = s3_bucket.uri
    env = {**os.environ, "DATALANE_STORE_OPTIONS": json.dumps(s3_bucket.storage_options)}
    proc = subprocess.run([sys.executable, "-m", "datalane.cli", "demo", "--sidecars",
                           "--steps", "1", "--dir", str(tmp_path), "--store", f"{uri}/demo"],
                          capture_output=True, text=True, check=False, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.strip().splitlines()[-1] == "MATCH"
    assert "3 committed checkpoints (steps 1, 2, 3)" in out
    audit = subprocess.run([sys.executable, "-m", "datalane.cli", "audit", f"{uri}/demo"],
                           capture_output=True, text=True, check=False, timeout=300, env=env)
    assert audit.returncode == 0, audit.stderr
    assert "hash chain intact" in audit.stdout


def test_store_errors_reach_the_trainer_naming_the_step_and_object(sidecar, repeat_recipe,
                                                                   tmp_path) -> None:
    store = tmp_path / "store"
    sc = sidecar(repeat_recipe, "--store", str(store), "--ranks-per-pod", "1")
    with pytest.raises(ConfigError, match=r"step 40 has no committed checkpoint in .*; "
                                          r"committed steps: none"):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4,
                                resume_step=40)))
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as loader:
        _take(loader, 8)  # steps 0 and 1
        saved = loader.checkpoint()
    assert saved["committed"] and saved["step"] == 2
    # a committed step restores; then corrupt its object: the error names it
    with SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=4,
                       resume_step=2) as loader:
        assert next(iter(loader)).step == 2
    obj = next(store.glob("steps/*2/pod-*.json"))
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 1
    obj.write_bytes(bytes(data))
    with pytest.raises(StorageError, match=re.escape(obj.name)):
        next(iter(SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4,
                                resume_step=2)))
