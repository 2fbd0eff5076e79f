"""examples/pretrain.yaml, the README's cluster example, is what admission accepts: the
DataPipeline with its PyTorchJob (8 lanes over 4 workers), and the objects it needs."""

from __future__ import annotations

from pathlib import Path

import yaml
from datalane_operator.admission import review_pipeline

ROOT = Path(__file__).resolve().parents[2]


def test_pretrain_example_is_admitted_with_its_job() -> None:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "pretrain.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert sorted(kinds) == ["ConfigMap", "DataPipeline", "PyTorchJob", "Secret"]
    body, job = kinds["DataPipeline"], kinds["PyTorchJob"]
    assert (body["metadata"]["name"], job["metadata"]["name"]) == ("pretrain", "llama")
    assert body["spec"]["workload"] == {"kind": "PyTorchJob", "name": "llama"}
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    body["metadata"]["namespace"] = "default"
    verdict = review_pipeline(body, workload=job)
    assert verdict.allowed, verdict.message
    # the trainer's script is the ConfigMap's, the Secret is the one the checkpoint names
    assert "SidecarLoader" in kinds["ConfigMap"]["data"]["train.py"]
    assert body["spec"]["checkpoint"]["secretRef"]["name"] == kinds["Secret"]["metadata"]["name"]
    compile(kinds["ConfigMap"]["data"]["train.py"], "train.py", "exec")
