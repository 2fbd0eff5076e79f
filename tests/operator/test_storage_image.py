"""What the sidecar image reads: its storage backends (images/sidecar/requirements.txt on top
of the lock), the chart's ``sidecar.protocols`` and the operator's default list agree, and
admission warns about any other scheme."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from datalane_operator.admission import review_pipeline
from datalane_operator.storage import DEFAULT_PROTOCOLS

from .builders import RECIPE, dp

ROOT = Path(__file__).resolve().parents[2]
# the fsspec implementation each scheme needs, and the distribution that brings it
BACKENDS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
BUILT_IN = {"file", "memory"}  # fsspec itself


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", version), (
                f"{path}: {line!r} is not name==version")
            out[name] = version
    return out


def test_storage_requirements_are_pinned_beside_the_lock() -> None:
    storage = pins(ROOT / "images/sidecar/requirements.txt")
    lock = pins(ROOT / "images/constraints.txt")
    assert "gcsfs" in storage and "s3fs" in lock
    # gcsfs pins fsspec exactly, to its own version: it must be the lock's fsspec
    assert storage["gcsfs"] == lock["fsspec"]
    # each package is pinned once: a second pin of a locked package could only conflict
    assert sorted(set(storage) & set(lock)) == []
    text = (ROOT / "images/sidecar/Dockerfile").read_text()
    run = " ".join(text.replace("\\\n", " ").split())
    assert ('--constraint constraints.txt ".[sidecar]" --requirement storage-requirements.txt'
            in run)
    assert "COPY images/sidecar/requirements.txt ./storage-requirements.txt" in text
    ignore = (ROOT / "images/sidecar/Dockerfile.dockerignore").read_text().splitlines()
    assert "!images/sidecar/requirements.txt" in ignore


def test_the_chart_declares_what_the_image_reads() -> None:
    values = yaml.safe_load((ROOT / "helm/datalane/values.yaml").read_text())
    declared = values["sidecar"]["protocols"]
    assert tuple(declared) == DEFAULT_PROTOCOLS  # the operator's default without the chart
    installed = set(pins(ROOT / "images/constraints.txt")) | set(
        pins(ROOT / "images/sidecar/requirements.txt"))
    for scheme in declared:
        assert scheme in BUILT_IN or BACKENDS[scheme] in installed, (
            f"sidecar.protocols lists {scheme!r}, but the image installs no "
            f"{BACKENDS.get(scheme, 'fsspec implementation')} for it")
    assert {"s3", "gs"} <= set(declared)


def test_admission_warns_about_a_scheme_the_image_cannot_read() -> None:
    recipe = {**RECIPE, "sources": [
        {"name": "web", "uris": ["hdfs://nn/web/*.parquet"], "weight": 0.7},
        {"name": "code", "uris": ["gs://data/code/part-0.jsonl.zst"], "weight": 0.3}]}
    body = dp(recipe=recipe)
    body["spec"]["sidecar"].pop("image")  # the operator's default image
    verdict = review_pipeline(body)
    assert verdict.allowed  # a warning, never a refusal
    assert verdict.warnings == [
        "spec.recipe.sources[0].uris[0] 'hdfs://nn/web/*.parquet' uses the scheme 'hdfs', "
        "which the sidecar image cannot read (it reads file, memory, s3, s3a, gs, gcs: Helm "
        "value sidecar.protocols); the sidecars will fail to start"]
    # the chart's list is what counts: one without gs warns about gs, here for the
    # checkpoint store too
    body["spec"]["checkpoint"] = {"uri": "gs://ckpt/run"}
    verdict = review_pipeline(body, protocols=("file", "s3", "hdfs"),
                              policy=_allow_operator_identity())
    assert [w.split(" uses ")[0] for w in verdict.warnings] == [
        "spec.recipe.sources[1].uris[0] 'gs://data/code/part-0.jsonl.zst'",
        "spec.checkpoint.uri 'gs://ckpt/run'"], verdict.warnings
    # a pipeline with its own image is told the list is the default image's
    verdict = review_pipeline(dp(recipe=recipe))
    (warning,) = verdict.warnings
    assert warning.endswith("which the default sidecar image cannot read (it reads file, "
                            "memory, s3, s3a, gs, gcs: Helm value sidecar.protocols); "
                            "spec.sidecar.image 'registry.example/datalane-sidecar:0.1.0' must "
                            "have an fsspec implementation for it")
    assert review_pipeline(dp()).warnings == []  # s3:// everywhere: nothing to say


def _allow_operator_identity() -> object:
    from datalane_operator.policy import Policy

    return Policy(allow_operator_identity=True)
