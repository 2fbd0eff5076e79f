"""Pod mutation: native sidecar, volumes, trainer env, idempotency, pods left alone."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from datalane_operator.inject import is_injected, mutate_pod, pipeline_for_pod, ranks_per_pod
from datalane_operator.pipeline import load_pipeline

from datalane.spec.errors import ConfigError

from .builders import dp, pod

DEFAULT_IMAGE = "registry.example/datalane-sidecar:default"


def inject(p: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return mutate_pod(p, load_pipeline(dp(**spec)), DEFAULT_IMAGE)


def sidecar_of(p: dict[str, Any]) -> dict[str, Any]:
    (side,) = [c for c in p["spec"]["initContainers"] if c["name"] == "datalane-sidecar"]
    return side


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_native_sidecar_with_startup_probe_on_the_socket() -> None:
    original = pod(nproc="2", gpus=2)
    before = copy.deepcopy(original)
    out = inject(original)
    assert original == before  # the input is not changed
    side = sidecar_of(out)
    assert side["restartPolicy"] == "Always"
    assert side["image"] == "registry.example/datalane-sidecar:0.1.0"
    assert side["command"] == ["datalane-sidecar", "serve"]
    sock = "/var/run/datalane/datalane.sock"
    assert side["startupProbe"]["exec"]["command"] == [
        "datalane-sidecar", "probe", "--socket", sock, "--timeout", "2"]
    assert side["startupProbe"]["periodSeconds"] * side["startupProbe"]["failureThreshold"] >= 600
    assert side["livenessProbe"]["exec"]["command"][:2] == ["datalane-sidecar", "probe"]
    env = env_of(side)
    assert env["DATALANE_SOCKET"] == sock
    assert env["DATALANE_RECIPE"] == "/etc/datalane/recipe/recipe.json"
    assert env["DATALANE_STORE"] == "s3://ckpt/run-1"
    assert json.loads(env["DATALANE_STORE_OPTIONS"]) == {
        "client_kwargs": {"endpoint_url": "http://minio.storage:9000"}}
    assert env["DATALANE_POD"] == {"fieldRef": {"apiVersion": "v1",
                                                "fieldPath": "metadata.name"}}
    assert env["DATALANE_RANKS_PER_POD"] == "2"
    assert env["DATALANE_PIPELINE"] == "pretrain"
    assert side["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"},
                                 "limits": {"memory": "8Gi"}}
    sc = side["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["name"]: m for m in side["volumeMounts"]}
    assert mounts["datalane-socket"]["mountPath"] == "/var/run/datalane"
    assert mounts["datalane-recipe"]["readOnly"] is True
    assert mounts["datalane-tmp"]["mountPath"] == "/tmp"


def test_volumes_and_trainer_environment() -> None:
    out = inject(pod())
    vols = {v["name"]: v for v in out["spec"]["volumes"]}
    assert vols["data"] == {"name": "data", "emptyDir": {}}  # the pod's own volume stays
    assert vols["datalane-socket"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert vols["datalane-recipe"]["configMap"] == {
        "name": "pretrain-recipe", "items": [{"key": "recipe.json", "path": "recipe.json"}]}
    trainer, agent = out["spec"]["containers"]
    assert env_of(trainer) == {"PET_NPROC_PER_NODE": "1", "PET_NNODES": "4",
                               "DATALANE_SOCKET": "/var/run/datalane/datalane.sock",
                               "DATALANE_PIPELINE": "pretrain"}
    assert {"name": "datalane-socket", "mountPath": "/var/run/datalane"} in trainer[
        "volumeMounts"]
    assert {"name": "data", "mountPath": "/data"} in trainer["volumeMounts"]
    assert agent == {"name": "metrics-agent", "image": "agent:2"}  # other containers untouched
    assert out["metadata"]["labels"]["datalane.io/pipeline"] == "pretrain"
    assert out["metadata"]["labels"]["training.kubeflow.org/job-name"] == "llama"
    assert out["metadata"]["annotations"]["datalane.io/injected"] == (
        "registry.example/datalane-sidecar:0.1.0")


def test_credentials_only_by_secret_reference() -> None:
    out = inject(pod())
    side = sidecar_of(out)
    assert side["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    text = json.dumps(out)
    for word in ("AWS_SECRET", "AWS_ACCESS", "password", "token"):
        assert word not in text
    body = dp()
    del body["spec"]["checkpoint"]["secretRef"]
    assert "envFrom" not in sidecar_of(mutate_pod(pod(), load_pipeline(body), DEFAULT_IMAGE))


def test_idempotent_including_user_init_containers_and_env() -> None:
    user_init = [{"name": "fetch-weights", "image": "busybox:1.36"},
                 {"name": "mesh-proxy", "image": "proxy:1", "restartPolicy": "Always"}]
    p = pod(init=copy.deepcopy(user_init))
    p["spec"]["containers"][0]["env"].append({"name": "DATALANE_SOCKET", "value": "/wrong"})
    once = inject(p)
    twice = mutate_pod(once, load_pipeline(dp()), DEFAULT_IMAGE)
    assert twice == once
    names = [c["name"] for c in once["spec"]["initContainers"]]
    assert names == ["fetch-weights", "mesh-proxy", "datalane-sidecar"]
    assert env_of(once["spec"]["containers"][0])["DATALANE_SOCKET"] == (
        "/var/run/datalane/datalane.sock")
    assert [v["name"] for v in twice["spec"]["volumes"]].count("datalane-socket") == 1


def test_default_image_custom_socket_dir_metrics_and_container() -> None:
    body = dp(sidecar={"socketDir": "/run/dl", "metricsPort": 9400, "socketMode": "0660",
                       "imagePullPolicy": "IfNotPresent"})
    body["spec"]["workload"]["container"] = "trainer"
    p = pod()
    p["spec"]["containers"][0]["name"] = "trainer"
    out = mutate_pod(p, load_pipeline(body), DEFAULT_IMAGE)
    side = sidecar_of(out)
    assert side["image"] == DEFAULT_IMAGE and side["imagePullPolicy"] == "IfNotPresent"
    assert side["ports"] == [{"name": "dl-metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert env_of(side)["DATALANE_SOCKET_MODE"] == "0660"
    assert env_of(out["spec"]["containers"][0])["DATALANE_SOCKET"] == "/run/dl/datalane.sock"
    assert "resources" not in side  # none in the spec: none on the sidecar


def test_missing_trainer_container_or_image_is_an_error() -> None:
    p = pod()
    p["spec"]["containers"][0]["name"] = "main"
    with pytest.raises(ConfigError, match=r"has no container 'pytorch' \(spec.workload.container "
                                          r"of DataPipeline pretrain\); its containers: 'main'"):
        inject(p)
    body = dp(sidecar={})
    with pytest.raises(ConfigError, match="no default sidecar image"):
        mutate_pod(pod(), load_pipeline(body), "")


def test_only_the_workloads_pods_belong_to_the_pipeline() -> None:
    pipelines = [load_pipeline(dp("a", workload="other")), load_pipeline(dp("b"))]
    assert pipeline_for_pod(pod(), pipelines).name == "b"  # type: ignore[union-attr]
    assert pipeline_for_pod(pod(job_name=None), pipelines) is None
    assert pipeline_for_pod(pod(job_name="unrelated"), pipelines) is None
    assert pipeline_for_pod(pod(namespace="elsewhere"), pipelines) is None
    assert not is_injected(pod()) and is_injected(inject(pod()))


def test_ranks_per_pod_from_the_training_operator_env() -> None:
    trainer = pod(nproc="auto", gpus=8)["spec"]["containers"][0]
    assert ranks_per_pod(trainer) == 8
    trainer = pod(nproc="4")["spec"]["containers"][0]
    assert ranks_per_pod(trainer) == 4


def test_the_sidecar_cli_understands_the_injected_container(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The env and the probe command are what datalane-sidecar actually reads."""
    from datalane_sidecar import cli

    side = sidecar_of(inject(pod(nproc="2")))
    for e in side["env"]:
        monkeypatch.setenv(e["name"], e.get("value", "llama-worker-0"))
    args = cli._parser().parse_args(side["command"][1:])
    assert args.socket == "/var/run/datalane/datalane.sock"
    assert args.recipe == "/etc/datalane/recipe/recipe.json"
    assert args.store == "s3://ckpt/run-1"
    assert json.loads(args.store_options)["client_kwargs"]["endpoint_url"]
    assert (args.pod, args.ranks_per_pod, args.workers, args.prefetch) == (
        "llama-worker-0", 2, 2, 8)
    assert (args.socket_mode, args.metrics_port) == ("0600", 0)
    probe = cli._parser().parse_args(side["startupProbe"]["exec"]["command"][1:])
    assert probe.command == "probe" and probe.socket == args.socket
