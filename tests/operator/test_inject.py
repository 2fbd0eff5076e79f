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
    # the ConfigMap of exactly the recipe the pod is stamped with (sha256 of the canonical
    # recipe, 16 hex digits: the stamp's digest)
    stamp = json.loads(out["metadata"]["annotations"]["datalane.io/recipe"])
    assert stamp["digest"] == "66693d1a8e29c782"
    assert vols["datalane-recipe"]["configMap"] == {
        "name": "pretrain-recipe-66693d1a8e29c782",
        "items": [{"key": "recipe.json", "path": "recipe.json"}]}
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
    # metrics on the pod IP (downward API), never on every interface
    (addr,) = [e for e in side["env"] if e["name"] == "DATALANE_METRICS_ADDR"]
    assert addr["valueFrom"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
    assert env_of(side)["DATALANE_SOCKET_MODE"] == "0660"
    assert "DATALANE_METRICS_ADDR" not in {e["name"] for e in sidecar_of(inject(pod()))["env"]}
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


# ---- parallelism: DP ranks per pod for the sidecar, DP size and readers for the trainer ----


def test_tensor_parallel_pod_serves_one_dp_rank_to_two_readers() -> None:
    # 4 pods (PET_NNODES) x 2 ranks, TP 2: DP 4; each pod holds 1 DP rank read by 2 TP peers
    out = inject(pod(nproc="2", gpus=2), parallelism={"tensor": 2})
    assert env_of(sidecar_of(out))["DATALANE_RANKS_PER_POD"] == "1"
    trainer = env_of(out["spec"]["containers"][0])
    assert (trainer["DATALANE_DP_SIZE"], trainer["DATALANE_DP_READERS"]) == ("4", "2")
    # pure data parallelism: no DP env, the client keeps $RANK and $WORLD_SIZE
    plain = env_of(inject(pod(nproc="2", gpus=2))["spec"]["containers"][0])
    assert "DATALANE_DP_SIZE" not in plain and "DATALANE_DP_READERS" not in plain


def test_tp_cp_pp_pod() -> None:
    # 2 pods x 8 ranks, TP 2 x CP 2 x PP 2: 16 ranks / 8 = DP 2; a pod: 8 / 4 = 2 DP ranks
    out = inject(pod(nproc="8", gpus=8, nnodes="2"),
                 parallelism={"tensor": 2, "context": 2, "pipeline": 2})
    assert env_of(sidecar_of(out))["DATALANE_RANKS_PER_POD"] == "2"
    trainer = env_of(out["spec"]["containers"][0])
    assert (trainer["DATALANE_DP_SIZE"], trainer["DATALANE_DP_READERS"]) == ("2", "4")


def test_the_trainer_layout_gives_tp_peers_one_dp_rank() -> None:
    """dp_rank = (RANK // readers) % dp_size with the injected env, for every rank of the job:
    TP x CP peers (consecutive ranks) share a DP rank and a pod; each pod's sidecar serves
    exactly DATALANE_RANKS_PER_POD distinct DP ranks; every stage sees every DP rank."""
    nodes, nproc, par = 2, 8, {"tensor": 2, "context": 2, "pipeline": 2}
    served: dict[int, set[int]] = {}
    for node in range(nodes):
        out = inject(pod(f"llama-worker-{node}", nproc=str(nproc), gpus=8, nnodes=str(nodes)),
                     parallelism=par)
        env = env_of(out["spec"]["containers"][0])
        size, readers = int(env["DATALANE_DP_SIZE"]), int(env["DATALANE_DP_READERS"])
        ranks = [node * nproc + local for local in range(nproc)]
        dp_ranks = [(r // readers) % size for r in ranks]
        served[node] = set(dp_ranks)
        assert len(served[node]) == int(env_of(sidecar_of(out))["DATALANE_RANKS_PER_POD"])
        for i in range(nproc):  # the TP x CP peers of a group: the same DP rank
            assert dp_ranks[i] == dp_ranks[i - i % readers]
    # rank r = (pp * DP + dp) * 4 + cp * 2 + tp: pod 0 is stage 0, pod 1 stage 1
    assert served == {0: {0, 1}, 1: {0, 1}}


def test_elastic_node_range_injects_only_the_readers() -> None:
    out = inject(pod(nproc="2", gpus=2, nnodes="1:4"), parallelism={"tensor": 2})
    trainer = env_of(out["spec"]["containers"][0])
    assert trainer["DATALANE_DP_READERS"] == "2" and "DATALANE_DP_SIZE" not in trainer


def test_pods_that_split_a_tp_group_or_a_model_replica_are_refused() -> None:
    with pytest.raises(ConfigError) as e:
        inject(pod(nproc="2", gpus=2), parallelism={"tensor": 4})
    assert str(e.value) == (
        "pod llama-worker-0 runs 2 ranks, not a multiple of TP x CP = 4 (spec.parallelism of "
        "DataPipeline pretrain): the TP and CP peers of a data-parallel rank must share a pod; "
        "set nprocPerNode to a multiple of 4")
    with pytest.raises(ConfigError) as e:
        inject(pod(nproc="2", gpus=2, nnodes="3"), parallelism={"tensor": 2, "pipeline": 2})
    assert str(e.value) == (
        "the 6 ranks of PyTorchJob llama (PET_NNODES 3 x 2) are not a multiple of TP 2 x PP 2 "
        "= 4 (spec.parallelism of DataPipeline pretrain); scale the job to whole model replicas")


def test_parallel_injection_is_idempotent_and_the_sidecar_reads_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from datalane_sidecar import cli

    body = dp(parallelism={"tensor": 2})
    p = pod(nproc="4", gpus=4)
    p["spec"]["containers"][0]["env"].append({"name": "DATALANE_DP_SIZE", "value": "99"})
    once = mutate_pod(p, load_pipeline(body), DEFAULT_IMAGE)
    assert mutate_pod(once, load_pipeline(body), DEFAULT_IMAGE) == once
    names = [e["name"] for e in once["spec"]["containers"][0]["env"]]
    assert names.count("DATALANE_DP_SIZE") == 1
    assert env_of(once["spec"]["containers"][0])["DATALANE_DP_SIZE"] == "8"  # 4 x 4 / 2
    # the pipeline no longer declares a parallelism: the DP env goes away again
    plain = mutate_pod(once, load_pipeline(dp()), DEFAULT_IMAGE)
    assert "DATALANE_DP_SIZE" not in env_of(plain["spec"]["containers"][0])
    side = sidecar_of(once)
    for e in side["env"]:
        monkeypatch.setenv(e["name"], e.get("value", "llama-worker-0"))
    assert cli._parser().parse_args(side["command"][1:]).ranks_per_pod == 2


# ---- spec.sidecar.rankProcesses: the sidecar's --rank-processes ----


@pytest.mark.parametrize(("value", "env", "workers"), [
    (None, "0", 0),  # unset: threads, as before
    (0, "0", 0),
    (3, "3", 2),  # capped at the pod's 2 data-parallel ranks
    (1, "1", 1),
    ("auto", "auto", 2),  # one per data-parallel rank of the pod (2 ranks, 4 CPUs)
])
def test_rank_processes_reach_the_sidecar(monkeypatch: pytest.MonkeyPatch, value: Any,
                                          env: str, workers: int) -> None:
    from datalane_sidecar import cli

    sidecar = {} if value is None else {"rankProcesses": value}
    side = sidecar_of(inject(pod(nproc="2", gpus=2), sidecar=sidecar))
    assert env_of(side)["DATALANE_RANK_PROCESSES"] == env
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    for e in side["env"]:
        monkeypatch.setenv(e["name"], e.get("value", "llama-worker-0"))
    args = cli._parser().parse_args(side["command"][1:])
    assert cli.rank_processes(args.rank_processes, args.ranks_per_pod) == workers


def test_rank_processes_auto_in_a_tensor_parallel_pod_counts_data_parallel_ranks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane_sidecar import cli

    # 4 ranks, TP 2: the sidecar serves 2 DP ranks, so auto is 2 workers, not 4
    side = sidecar_of(inject(pod(nproc="4", gpus=4), parallelism={"tensor": 2},
                             sidecar={"rankProcesses": "auto"}))
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(16)))
    env = env_of(side)
    assert cli.rank_processes(env["DATALANE_RANK_PROCESSES"],
                              int(env["DATALANE_RANKS_PER_POD"])) == 2


@pytest.mark.parametrize(("value", "message"), [
    (-1, "spec.sidecar.rankProcesses -1 must be >= 0"),
    (257, "spec.sidecar.rankProcesses 257 must be <= 256"),
    ("many", "spec.sidecar.rankProcesses must be integer or 'auto', got 'many'"),
    ("2", "spec.sidecar.rankProcesses must be integer or 'auto', got '2'"),
    ("Auto", "spec.sidecar.rankProcesses must be integer or 'auto', got 'Auto'"),
    (True, "spec.sidecar.rankProcesses must be integer or 'auto', got True"),
    (1.5, "spec.sidecar.rankProcesses must be integer or 'auto', got 1.5"),
    (None, "spec.sidecar.rankProcesses must be integer or 'auto', got null"),
])
def test_a_bad_rank_processes_is_refused_naming_it(value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_pipeline(dp(sidecar={"rankProcesses": value}))
    assert str(e.value) == message


# ---- spec.sidecar.mapProcesses: the sidecar's --map-processes ----


@pytest.mark.parametrize(("value", "env"), [(None, None), (0, "0"), (3, "3"), (256, "256")])
def test_map_processes_reach_the_sidecar(monkeypatch: pytest.MonkeyPatch, value: Any,
                                         env: str | None) -> None:
    """Unset (a DataPipeline written before the field): no variable, the sidecar's default
    (threads), and the pod spec as before."""
    from datalane_sidecar import cli

    monkeypatch.delenv("DATALANE_MAP_PROCESSES", raising=False)
    sidecar = {} if value is None else {"mapProcesses": value}
    side = sidecar_of(inject(pod(nproc="2", gpus=2), sidecar=sidecar))
    assert env_of(side).get("DATALANE_MAP_PROCESSES") == env
    plain = sidecar_of(inject(pod(nproc="2", gpus=2)))
    assert [e for e in side["env"] if e["name"] != "DATALANE_MAP_PROCESSES"] == plain["env"]
    for e in side["env"]:
        monkeypatch.setenv(e["name"], e.get("value", "llama-worker-0"))
    assert cli._parser().parse_args(side["command"][1:]).map_processes == int(env or 0)


@pytest.mark.parametrize(("value", "message"), [
    (-1, "spec.sidecar.mapProcesses -1 must be >= 0"),
    (257, "spec.sidecar.mapProcesses 257 must be <= 256"),
    ("auto", "spec.sidecar.mapProcesses must be an integer, got 'auto'"),
    ("2", "spec.sidecar.mapProcesses must be an integer, got '2'"),
    (True, "spec.sidecar.mapProcesses must be an integer, got True"),
])
def test_a_bad_map_processes_is_refused_naming_it(value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_pipeline(dp(sidecar={"mapProcesses": value}))
    assert str(e.value) == message


# ---- spec.sidecar.imageBytes: the sidecar's --image-bytes ----


def test_image_bytes_reach_the_sidecar_and_unset_leave_its_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane_sidecar import cli

    from datalane.spec.knobs import Knobs

    base = dp()["spec"]["sidecar"]
    plain = sidecar_of(inject(pod()))
    assert "DATALANE_IMAGE_BYTES" not in env_of(plain)  # unset: no variable, the spec as before
    assert sidecar_of(inject(pod(), sidecar={**base, "imageBytes": None})) == plain
    side = sidecar_of(inject(pod(), sidecar={**base, "imageBytes": 128 << 20}))
    assert env_of(side)["DATALANE_IMAGE_BYTES"] == "134217728"
    # the one difference: the variable, appended to the same environment
    assert [e for e in side["env"] if e["name"] != "DATALANE_IMAGE_BYTES"] == plain["env"]
    assert {**side, "env": plain["env"]} == plain
    for container, expected in ((plain, Knobs.image_bytes), (side, 134217728)):
        monkeypatch.delenv("DATALANE_IMAGE_BYTES", raising=False)
        for e in container["env"]:
            monkeypatch.setenv(e["name"], e.get("value", "llama-worker-0"))
        assert cli._parser().parse_args(container["command"][1:]).image_bytes == expected
    assert Knobs.image_bytes == 512 << 20


@pytest.mark.parametrize(("value", "message"), [
    (0, "spec.sidecar.imageBytes 0 must be >= 1"),
    (-5, "spec.sidecar.imageBytes -5 must be >= 1"),
    ((1 << 40) + 1, "spec.sidecar.imageBytes 1099511627777 must be <= 1099511627776"),
    ("128Mi", "spec.sidecar.imageBytes must be an integer, got '128Mi'"),
    ("134217728", "spec.sidecar.imageBytes must be an integer, got '134217728'"),
    (True, "spec.sidecar.imageBytes must be an integer, got True"),
    (1.5, "spec.sidecar.imageBytes must be an integer, got 1.5"),
])
def test_a_bad_image_bytes_is_refused_naming_it(value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_pipeline(dp(sidecar={"imageBytes": value}))
    assert str(e.value) == message
