"""The operator's view of a sidecar that cannot start: the sidecar writes its fatal error to
its termination message, the kubelet puts it in the pod status, the reconcile turns it into
the ``SidecarFailed`` condition and a Warning event; plus the pod runner's ``$(VAR)``
expansion, which plays the kubelet's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from datalane_operator.inject import mutate_pod
from datalane_operator.names import SIDECAR_CONTAINER
from datalane_operator.pipeline import load_pipeline
from datalane_operator.reconcile import SidecarFailure, decide, sidecar_failure

from datalane.corpus import DemoCorpus
from datalane.spec.errors import ConfigError

from .builders import dp, job, pod
from .podrunner import expand

T0 = "2026-01-01T00:00:00Z"
PIPE = load_pipeline(dp())
MESSAGE = "sources[0].uris[0] 's3://data/web/*.parquet' matches no file"


def with_sidecar_status(name: str, status: dict[str, Any]) -> dict[str, Any]:
    p = mutate_pod(pod(name, phase="Running"), PIPE, "img:1")
    p["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    p["status"]["initContainerStatuses"] = [{"name": SIDECAR_CONTAINER, **status}]
    p["status"]["containerStatuses"] = [{"name": "pytorch", "ready": False,
                                         "state": {"waiting": {"reason": "PodInitializing"}}}]
    return p


def crashing(name: str, code: int = 2, message: str = MESSAGE,
             reason: str = "Error") -> dict[str, Any]:
    return with_sidecar_status(name, {
        "ready": False, "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff",
                              "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": code, "reason": reason,
                                     "message": message}}})


def test_what_counts_as_a_failed_sidecar() -> None:
    assert sidecar_failure(crashing("w-0")) == SidecarFailure("w-0", "exited with code 2",
                                                              MESSAGE)
    assert sidecar_failure(crashing("w-0", 137, "", "OOMKilled")) == SidecarFailure(
        "w-0", "exited with code 137 (OOMKilled)", "")
    # the kubelet could not even start it: a Secret that does not exist
    missing = with_sidecar_status("w-1", {"ready": False, "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "s3-creds" not found'}}})
    assert sidecar_failure(missing) == SidecarFailure(
        "w-1", "CreateContainerConfigError", 'secret "s3-creds" not found')
    # terminated right now (not restarted yet) counts as well
    now = with_sidecar_status("w-2", {"ready": False, "state": {"terminated": {
        "exitCode": 1, "reason": "Error", "message": "boom"}}})
    assert sidecar_failure(now) == SidecarFailure("w-2", "exited with code 1", "boom")
    # not failures: a ready sidecar whatever its past, a clean exit, one still starting
    recovered = crashing("w-3")
    recovered["status"]["initContainerStatuses"][0].update(
        ready=True, state={"running": {"startedAt": T0}})
    assert sidecar_failure(recovered) is None
    assert sidecar_failure(crashing("w-4", code=0)) is None
    starting = with_sidecar_status("w-5", {"ready": False, "state": {"running": {}}})
    assert sidecar_failure(starting) is None
    assert sidecar_failure(with_sidecar_status("w-6", {"ready": False, "state": {
        "waiting": {"reason": "PodInitializing"}}})) is None
    assert sidecar_failure(mutate_pod(pod("w-7"), PIPE, "img:1")) is None  # no status yet


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    (c,) = [c for c in status["conditions"] if c["type"] == ctype]
    return c


def test_the_sidecars_message_becomes_the_condition_and_an_event() -> None:
    pods = [crashing(f"llama-worker-{i}") for i in (3, 0, 1, 2, 4)]  # 4 and a leftover
    d = decide(PIPE, job(workers=4), pods, None, None, T0)
    expected = (f"the sidecar of pod llama-worker-0 exited with code 2: {MESSAGE} (and the "
                f"sidecars of 4 more pods: llama-worker-1, llama-worker-2, llama-worker-3 and "
                f"1 more)")
    ready, degraded = cond(d.status, "Ready"), cond(d.status, "Degraded")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False", "SidecarFailed", expected)
    assert (degraded["status"], degraded["reason"]) == ("True", "SidecarFailed")
    assert degraded["message"].startswith(expected)  # first: the likeliest root cause
    assert d.status["phase"] == "Degraded"
    warnings = [e for e in d.events if e.type == "Warning"]
    assert [(e.reason, e.message) for e in warnings] == [("SidecarFailed",
                                                          degraded["message"])]
    # fixed (the pods recreated and ready): Recovered, Ready again
    healthy = [mutate_pod(pod(f"llama-worker-{i}", phase="Running"), PIPE, "img:1")
               for i in range(4)]
    again = decide(PIPE, job(workers=4), healthy, None, d.status, T0)
    assert cond(again.status, "Ready")["reason"] == "AllPodsReady"
    assert [e.reason for e in again.events] == ["Recovered"]


def test_a_finished_job_is_not_a_failing_sidecar() -> None:
    done = job(workers=1)
    done["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    d = decide(PIPE, done, [crashing("llama-worker-0")], None, None, T0)
    assert cond(d.status, "Degraded")["status"] == "False"


def test_the_sidecar_writes_its_fatal_error_as_termination_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus: DemoCorpus) -> None:
    from datalane_sidecar.server import SidecarConfig, serve

    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({
        "lanes": 2, "global_batch_size": 4, "seq_len": 16, "seed": 1,
        "tokenizer": {"uri": corpus.tokenizer},
        "sources": [{"name": "web", "uris": [f"{tmp_path}/none/*.parquet"], "weight": 1.0}]}))
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    log = tmp_path / "termination-log"
    monkeypatch.setenv("DATALANE_TERMINATION_LOG", str(log))
    cfg = SidecarConfig(str(tmp_path / "s.sock"), str(recipe), None, {}, "pod-0", 1, 1, 2,
                        0o600, 0, "127.0.0.1")
    with pytest.raises(ConfigError) as err:
        serve(cfg)
    assert log.read_text() == str(err.value)
    assert log.read_text() == f"sources[0].uris[0] '{tmp_path}/none/*.parquet' matches no file"
    # any other error: its type, then its words, credentials redacted as in the logs
    from datalane_sidecar import server

    def boom(*_: Any) -> None:
        raise OSError(f"access denied for key {secret}")

    monkeypatch.setattr(server, "_check_socket_path", boom)
    with pytest.raises(OSError):
        serve(cfg)
    assert log.read_text() == "OSError: access denied for key <redacted>"
    # outside a pod (no variable, no /dev/termination-log) nothing is written anywhere
    monkeypatch.delenv("DATALANE_TERMINATION_LOG")
    if not os.path.exists("/dev/termination-log"):
        with pytest.raises(OSError):
            serve(cfg)
        assert not os.path.exists("/dev/termination-log")


def test_env_references_expand_as_the_kubelet_does() -> None:
    env = {"KEY": "AK", "SECRET": "s/k+1"}
    assert expand('{"key":"$(KEY)","secret":"$(SECRET)"}', env) == (
        '{"key":"AK","secret":"s/k+1"}')
    assert expand("$(MISSING) $$(KEY) $$", env) == "$(MISSING) $(KEY) $"
