"""The injected sidecar's and trainer's environment, value by value, where a slip would go
unseen: the checkpoint Secret's ledger key beside a data Secret, both Secrets for a store that
is not S3, the store options' canonical text, ranks per pod when torchrun's count is unknown,
node counts of 0 and 1, and a trainer that already carries one of the variables."""

from __future__ import annotations

import json
from typing import Any

from datalane_operator import names

from datalane.store.signing import LEDGER_KEY_ENV

from .builders import pod
from .test_inject import env_of, inject, sidecar_of

CKPT = {"uri": "s3://ckpt/run-1", "secretRef": {"name": "ckpt-creds"}, "keep": 2}
DATA = {"secretRef": {"name": "data-creds"}}


def test_beside_a_data_secret_the_ledger_key_comes_from_the_checkpoint_secret() -> None:
    side = sidecar_of(inject(pod(), checkpoint=CKPT, data=DATA))
    assert side["envFrom"] == [{"secretRef": {"name": "data-creds"}}]
    assert side["env"][2] == {"name": LEDGER_KEY_ENV, "valueFrom": {"secretKeyRef": {
        "name": "ckpt-creds", "key": LEDGER_KEY_ENV, "optional": True}}}


def test_a_checkpoint_store_that_is_not_s3_gets_both_secrets_the_datas_last() -> None:
    """No per-store keys outside S3: both Secrets as envFrom, the data's after the
    checkpoint's (a clash: the data's wins), and no checkpoint key variables."""
    side = sidecar_of(inject(pod(), checkpoint=CKPT | {"uri": "gs://ckpt/run-1"}, data=DATA))
    assert side["envFrom"] == [{"secretRef": {"name": "ckpt-creds"}},
                               {"secretRef": {"name": "data-creds"}}]
    env = env_of(side)
    assert not [n for n in env if n.startswith("DATALANE_CHECKPOINT_")]
    assert LEDGER_KEY_ENV not in env
    assert json.loads(env["DATALANE_STORE_OPTIONS"]) == {}


def test_the_store_options_are_one_canonical_text() -> None:
    """Sorted keys, no spaces: the same pipeline always gives the same pod spec."""
    side = sidecar_of(inject(pod(), checkpoint=CKPT | {"region": "eu-west-1"}, data=DATA | {
        "endpoint": "https://minio.data:9000"}))
    text = env_of(side)["DATALANE_STORE_OPTIONS"]
    assert text == ('{"client_kwargs":{"region_name":"eu-west-1"},"config_kwargs":'
                    '{"ignore_configured_endpoint_urls":true},'
                    '"key":"$(DATALANE_CHECKPOINT_AWS_ACCESS_KEY_ID)",'
                    '"secret":"$(DATALANE_CHECKPOINT_AWS_SECRET_ACCESS_KEY)"}')


def test_ranks_per_pod_is_1_when_the_pod_does_not_say() -> None:
    """``nprocPerNode: gpu`` on a trainer without a GPU limit: torchrun's count is unknown."""
    bare = pod(nproc="gpu", gpus=4)
    assert env_of(sidecar_of(inject(bare)))["DATALANE_RANKS_PER_POD"] == "4"
    del bare["spec"]["containers"][0]["resources"]
    assert env_of(sidecar_of(inject(bare)))["DATALANE_RANKS_PER_POD"] == "1"


def test_a_node_count_of_0_is_unknown_and_1_is_one_node() -> None:
    one = env_of(inject(pod(nproc="2", gpus=2, nnodes="1"),
                        parallelism={"tensor": 2})["spec"]["containers"][0])
    assert (one["DATALANE_DP_SIZE"], one["DATALANE_DP_READERS"]) == ("1", "2")
    zero = env_of(inject(pod(nproc="2", gpus=2, nnodes="0"),
                         parallelism={"tensor": 2})["spec"]["containers"][0])
    assert zero["DATALANE_DP_READERS"] == "2" and "DATALANE_DP_SIZE" not in zero


def test_a_trainer_variable_already_set_is_replaced_not_repeated() -> None:
    """(Whether ``_strip`` or ``_set_env`` removes the old one: either does.)"""
    p: dict[str, Any] = pod()
    p["spec"]["containers"][0]["env"].append({"name": "DATALANE_SOCKET", "value": "/old.sock"})
    trainer = inject(p)["spec"]["containers"][0]
    socks = [e for e in trainer["env"] if e["name"] == "DATALANE_SOCKET"]
    assert len(socks) == 1 and socks[0]["value"] != "/old.sock"
    assert socks[0]["value"].endswith(names.SOCKET_FILE)
