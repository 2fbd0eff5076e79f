"""The generated CRD on a real API server: accepted, validating, defaulting, keeping nulls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.harness import Cluster

from .builders import dp

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "datapipelines.datalane.io.yaml"


@pytest.fixture(scope="module")
def crd(k8s_cluster: Cluster) -> Cluster:
    k8s_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    k8s_cluster.wait_crd_established("datapipelines.datalane.io")
    return k8s_cluster


def apply(c: Cluster, ns: str, body: dict[str, Any], *args: str) -> Any:
    body = json.loads(json.dumps(body))
    body["metadata"]["namespace"] = ns
    for key in ("uid", "generation"):
        body["metadata"].pop(key, None)
    return c.kubectl(*args, "-f", "-", input=yaml.safe_dump(body), check=False)


def test_valid_pipeline_is_stored_with_defaults(crd: Cluster, k8s_namespace: str) -> None:
    body = dp()
    body["spec"]["recipe"]["sources"][0]["epochs"] = None  # "forever" must survive
    body["spec"]["recipe"]["sources"][0]["format"] = None
    out = apply(crd, k8s_namespace, body, "create")
    assert out.returncode == 0, out.stderr
    got = json.loads(crd.kubectl("get", "dp", "pretrain", "-n", k8s_namespace, "-o",
                                 "json").stdout)
    spec = got["spec"]
    assert spec["recipe"]["sources"][0]["epochs"] is None
    assert spec["recipe"]["sources"][0]["format"] is None
    assert spec["recipe"]["sources"][1]["epochs"] == 1  # defaulted
    assert spec["sidecar"]["socketDir"] == "/var/run/datalane"
    # no stored default: the operator resolves the kind's own trainer container (PyTorchJob's
    # "pytorch", TrainJob's "node")
    assert spec["workload"].get("container") is None
    assert spec["parallelism"] == {"tensor": 1, "pipeline": 1, "context": 1}  # defaulted
    table = crd.kubectl("get", "dp", "-n", k8s_namespace).stdout.split("\n")[0].split()
    assert table == ["NAME", "LANES", "WORLD", "STEP", "READY", "PHASE", "AGE"]


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.update(globalBatchSize=12),
     "spec.globalBatchSize must be a multiple of spec.lanes"),
    (lambda s: s.update(lanes=0), "spec.lanes: Invalid value: 0"),
    (lambda s: s["workload"].update(name="Bad_Name"), "spec.workload.name"),
    (lambda s: s["recipe"].update(packing={"algorithm": "greedy"}),
     "spec.recipe.packing.algorithm"),
    (lambda s: s["sidecar"].update(resources={"limits": {"cpu": "lots"}}),
     "spec.sidecar.resources.limits.cpu"),
    (lambda s: s["recipe"].pop("tokenizer"), "spec.recipe.tokenizer: Required value"),
    (lambda s: s.update(parallelism={"tensor": 0}), "spec.parallelism.tensor: Invalid value: 0"),
])
def test_schema_refuses(crd: Cluster, k8s_namespace: str, change, message) -> None:  # type: ignore[no-untyped-def]
    body = dp()
    change(body["spec"])
    out = apply(crd, k8s_namespace, body, "create")
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_unknown_fields_are_refused_by_kubectl(crd: Cluster, k8s_namespace: str) -> None:
    body = dp()
    body["spec"]["recipe"]["sedd"] = 3
    out = apply(crd, k8s_namespace, body, "apply")
    assert out.returncode != 0 and 'unknown field "spec.recipe.sedd"' in out.stderr
    body = dp(parallelism={"tensor": 2, "data": 4})
    out = apply(crd, k8s_namespace, body, "apply")
    assert out.returncode != 0 and 'unknown field "spec.parallelism.data"' in out.stderr


def test_lanes_are_fixed(crd: Cluster, k8s_namespace: str) -> None:
    assert apply(crd, k8s_namespace, dp(), "create").returncode == 0
    out = crd.kubectl("patch", "dp", "pretrain", "-n", k8s_namespace, "--type=merge", "-p",
                      '{"spec": {"lanes": 16, "globalBatchSize": 32}}', check=False)
    assert out.returncode != 0
    assert "spec.lanes is fixed for the life of a run" in out.stderr
