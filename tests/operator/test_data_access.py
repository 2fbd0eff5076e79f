"""How the sidecar reaches the data: ``spec.data`` (a Secret, endpoint and region of the
sources, distinct from the checkpoint store's), ``spec.checkpoint.region``, and the
termination message settings of the injected sidecar."""

from __future__ import annotations

import json
from typing import Any

from datalane_operator import names
from datalane_operator.admission import review_pipeline
from datalane_operator.inject import mutate_pod
from datalane_operator.pipeline import load_pipeline
from datalane_operator.storage import sidecar_store_options

from .builders import RECIPE, dp, pod
from .podrunner import expand

CKPT = {"uri": "s3://ckpt/run-1", "secretRef": {"name": "ckpt-creds"}, "keep": 2}


def sidecar(**spec: Any) -> dict[str, Any]:
    out = mutate_pod(pod(), load_pipeline(dp(**spec)), "img:1")
    (side,) = [c for c in out["spec"]["initContainers"] if c["name"] == names.SIDECAR_CONTAINER]
    return {"side": side, "pod": out}


def env_list(side: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(e["name"], e.get("value", e.get("valueFrom"))) for e in side["env"]]


def test_one_secret_for_data_and_checkpoints_as_before() -> None:
    side = sidecar(checkpoint=CKPT)["side"]
    assert side["envFrom"] == [{"secretRef": {"name": "ckpt-creds"}}]
    env = dict(env_list(side))
    assert json.loads(env["DATALANE_STORE_OPTIONS"]) == {}
    assert not {"AWS_ENDPOINT_URL_S3", "AWS_REGION", "GOOGLE_APPLICATION_CREDENTIALS"} & set(env)
    assert (side["terminationMessagePath"], side["terminationMessagePolicy"]) == (
        "/dev/termination-log", "FallbackToLogsOnError")


def test_a_data_secret_of_its_own_keeps_the_checkpoint_keys_out_of_the_environment() -> None:
    made = sidecar(checkpoint=CKPT | {"region": "eu-west-1"},
                   data={"secretRef": {"name": "data-creds"},
                         "endpoint": "https://minio.data:9000", "region": "us-east-1",
                         "googleCredentials": "key.json"})
    side, out = made["side"], made["pod"]
    assert side["envFrom"] == [{"secretRef": {"name": "data-creds"}}]  # AWS_* of the data
    env = env_list(side)
    names_in_order = [n for n, _ in env]
    # the checkpoint keys as references, defined before the options that use them
    key_ref = {"secretKeyRef": {"name": "ckpt-creds", "key": "AWS_ACCESS_KEY_ID"}}
    secret_ref = {"secretKeyRef": {"name": "ckpt-creds", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert env[:2] == [("DATALANE_CHECKPOINT_AWS_ACCESS_KEY_ID", key_ref),
                       ("DATALANE_CHECKPOINT_AWS_SECRET_ACCESS_KEY", secret_ref)]
    assert names_in_order.index("DATALANE_STORE_OPTIONS") > 1
    options = dict(env)["DATALANE_STORE_OPTIONS"]
    assert json.loads(options) == {
        "key": "$(DATALANE_CHECKPOINT_AWS_ACCESS_KEY_ID)",
        "secret": "$(DATALANE_CHECKPOINT_AWS_SECRET_ACCESS_KEY)",
        "client_kwargs": {"region_name": "eu-west-1"},
        # AWS_ENDPOINT_URL_S3 is the data's (MinIO): the checkpoints on AWS S3 ignore it
        "config_kwargs": {"ignore_configured_endpoint_urls": True}}
    # what the kubelet hands the sidecar: the checkpoint keys in the options only
    kubelet = {"DATALANE_CHECKPOINT_AWS_ACCESS_KEY_ID": "CKPT-AK",
               "DATALANE_CHECKPOINT_AWS_SECRET_ACCESS_KEY": "CKPT/SK+1"}
    assert json.loads(expand(options, kubelet))["key"] == "CKPT-AK"
    assert json.loads(expand(options, kubelet))["secret"] == "CKPT/SK+1"
    assert dict(env)["AWS_ENDPOINT_URL_S3"] == "https://minio.data:9000"
    assert dict(env)["AWS_REGION"] == "us-east-1"
    mount = names.DATA_CREDENTIALS_MOUNT
    assert dict(env)["GOOGLE_APPLICATION_CREDENTIALS"] == f"{mount}/key.json"
    assert {"name": names.VOLUME_DATA_CREDENTIALS, "mountPath": mount,
            "readOnly": True} in side["volumeMounts"]
    vols = {v["name"]: v for v in out["spec"]["volumes"]}
    assert vols[names.VOLUME_DATA_CREDENTIALS]["secret"] == {"secretName": "data-creds",
                                                             "defaultMode": 0o440}
    # no credential value anywhere in the pod
    assert "CKPT-AK" not in json.dumps(out)
    # the trainer gets none of it
    trainer = next(c for c in out["spec"]["containers"] if c["name"] == "pytorch")
    assert not [e for e in trainer["env"] if "AWS" in e["name"] or "GOOGLE" in e["name"]]
    # idempotent: a second pass gives the same pod
    again = mutate_pod(out, load_pipeline(dp(checkpoint=CKPT | {"region": "eu-west-1"}, data={
        "secretRef": {"name": "data-creds"}, "endpoint": "https://minio.data:9000",
        "region": "us-east-1", "googleCredentials": "key.json"})), "img:1")
    assert again == out


def test_checkpoint_region_and_endpoint_options() -> None:
    spec = load_pipeline(dp(checkpoint=CKPT | {"endpoint": "http://minio:9000",
                                              "region": "eu-west-3"})).spec.checkpoint
    assert sidecar_store_options(spec) == {"client_kwargs": {
        "endpoint_url": "http://minio:9000", "region_name": "eu-west-3"}}
    verdict = review_pipeline(dp(checkpoint={"uri": "gs://c/run", "region": "eu"}))
    assert not verdict.allowed
    assert "spec.checkpoint.region is set, but spec.checkpoint.uri 'gs://c/run'" in (
        verdict.message)


def test_data_settings_are_checked_at_admission() -> None:
    verdict = review_pipeline(dp(data={"googleCredentials": "key.json"}))
    assert not verdict.allowed
    assert verdict.message == ("spec.data.googleCredentials 'key.json' names a key of the "
                               "data Secret, but spec.data.secretRef is not set")
    gs = {**RECIPE, "tokenizer": {"uri": "gs://d/tok.json"},
          "sources": [{"name": "web", "uris": ["gs://d/web/*.parquet"], "weight": 1.0}]}
    verdict = review_pipeline(dp(recipe=gs, data={"endpoint": "https://minio:9000"}))
    assert verdict.allowed
    assert verdict.warnings == ["spec.data.endpoint is set, but no source of the recipe is an "
                                "s3:// URI: it has no effect"]
    assert review_pipeline(dp(data={"secretRef": {"name": "d"}, "region": "us-east-1"}))\
        .warnings == []
    bad = review_pipeline(dp(data={"region": "Not A Region"}))
    assert not bad.allowed and "spec.data.region" in bad.message
