"""Tenant isolation: the operator acts on a checkpoint store only with the credentials of the
pipeline's own namespace, or under the cluster policy an administrator opted into; filter
predicates come only from allowed modules. Real stores: a directory and S3 on moto."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import kopf
import pytest
from datalane_operator import handlers
from datalane_operator.admission import review_pipeline
from datalane_operator.cli import main as operator_main
from datalane_operator.crd import crd_manifest
from datalane_operator.pipeline import load_pipeline
from datalane_operator.policy import Policy
from datalane_operator.reconcile import decide
from datalane_operator.reconciler import look_at_store
from datalane_operator.runtime import OperatorConfig, Runtime
from datalane_operator.storage import Listing

from datalane.spec.errors import ConfigError
from datalane.store import CheckpointStore
from tests.store.support import commit_steps
from tests.support.s3server import S3Bucket

from .builders import dp, job, pod
from .fakeapi import FakeKube as FakeApi

OPT_IN = "checkpoints.allowOperatorIdentity"


def pipeline_on(uri: str, namespace: str = "team-a", secret: str | None = None,
                endpoint: str | None = None, keep: int = 1) -> dict[str, Any]:
    ckpt: dict[str, Any] = {"uri": uri, "keep": keep}
    if secret:
        ckpt["secretRef"] = {"name": secret}
    if endpoint:
        ckpt["endpoint"] = endpoint
    return dp(namespace=namespace, checkpoint=ckpt)


class FakeKube:
    """The one call look_at_store makes to the API server, recorded."""

    def __init__(self, secrets: dict[tuple[str, str], dict[str, str]]) -> None:
        self.secrets = secrets
        self.reads: list[tuple[str, str]] = []

    async def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        self.reads.append((namespace, name))
        return self.secrets.get((namespace, name))


STRICT = Policy()  # Helm's defaults


def look(body: dict[str, Any], policy: Policy = STRICT,
         secrets: dict[tuple[str, str], dict[str, str]] | None = None,
         ) -> tuple[Listing, FakeKube]:
    kube = FakeKube(secrets or {})
    rt = Runtime(OperatorConfig(policy=policy), kube=kube)  # type: ignore[arg-type]
    return asyncio.run(look_at_store(rt, load_pipeline(body))), kube


def steps_on_disk(root: Path) -> list[int]:
    return CheckpointStore(str(root)).committed_steps()


# -- admission ------------------------------------------------------------------------------


NOT_SET = "spec.checkpoint.secretRef is not set"
ASK_ADMIN = ("ask an administrator to allow the operator's own identity there "
             "(checkpoints.allowOperatorIdentity, checkpoints.operatorIdentityPrefixes)")
USE_SECRET = ("set spec.checkpoint.secretRef to a Secret in namespace 'team-a' with "
              "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or " + ASK_ADMIN)
USE_S3 = "use an s3:// store with a secretRef, or " + ASK_ADMIN


@pytest.mark.parametrize(("checkpoint", "why", "fix"), [
    ({"uri": "s3://ckpt/team-b/run"}, NOT_SET, USE_SECRET),
    ({"uri": "file:///mnt/ckpt/team-b"}, NOT_SET, USE_S3),
    ({"uri": "/mnt/ckpt/team-b"}, NOT_SET, USE_S3),
    ({"uri": "memory://team-b"}, NOT_SET, USE_S3),
    ({"uri": "gs://ckpt/team-b", "secretRef": {"name": "gcs"}},
     "the operator cannot take credentials for gs:// from Secret 'gcs' (only for s3://)",
     USE_S3),
    ({"uri": "file:///mnt/ckpt/team-b", "secretRef": {"name": "x"}},
     "the operator cannot take credentials for file:// from Secret 'x' (only for s3://)",
     USE_S3),
])
def test_a_store_the_operator_would_act_on_with_its_own_identity_is_refused(
        checkpoint: dict[str, Any], why: str, fix: str) -> None:
    v = review_pipeline(dp(namespace="team-a", checkpoint=checkpoint))
    assert not v.allowed
    assert v.message == (
        f"the operator would list and delete checkpoints of spec.checkpoint.uri "
        f"{checkpoint['uri']!r} with its own identity: {why}, and the cluster policy does not "
        f"allow that ({OPT_IN} is false); {fix}")


def test_a_secret_of_the_pipelines_namespace_is_enough() -> None:
    assert review_pipeline(pipeline_on("s3://ckpt/run", secret="s3-creds")).allowed


def test_the_opt_in_policy_admits_only_its_prefixes_per_namespace() -> None:
    policy = Policy(True, {"team-a": ("s3://ckpt/team-a", "file:///mnt/ckpt/team-a/"),
                           "*": ("s3://shared/",)})

    def verdict(uri: str, ns: str = "team-a") -> str:
        v = review_pipeline(pipeline_on(uri, ns), policy=policy)
        return "allowed" if v.allowed else v.message

    for uri in ("s3://ckpt/team-a", "s3://ckpt/team-a/run-1", "S3://ckpt//team-a/run-1",
                "file:///mnt/ckpt/team-a/run", "/mnt/ckpt/team-a/run", "s3://shared/x"):
        assert verdict(uri) == "allowed", uri
    assert verdict("s3://shared/y", ns="team-b") == "allowed"  # "*": every namespace
    refused = verdict("s3://ckpt/team-b/run")
    assert refused.endswith(
        "and the cluster policy allows that in namespace 'team-a' only under: "
        "s3://ckpt/team-a, file:///mnt/ckpt/team-a/, s3://shared/ "
        "(checkpoints.operatorIdentityPrefixes); " + USE_SECRET), refused
    # whole segments only, no way out of a prefix, and another namespace's prefix is not yours
    assert verdict("s3://ckpt/team-ab/run") != "allowed"
    assert verdict("file:///mnt/ckpt/team-a/../team-b").startswith(
        "spec.checkpoint.uri 'file:///mnt/ckpt/team-a/../team-b' has a '.' or '..' segment")
    assert "only under: s3://shared/ " in verdict("s3://ckpt/team-a/run", ns="team-b")
    # opted in without prefixes: every store (a single-tenant cluster)
    everywhere = Policy(allow_operator_identity=True)
    v = review_pipeline(pipeline_on("file:///anything"), policy=everywhere)
    assert v.allowed, v.message


def test_an_update_that_keeps_the_spec_is_not_refused_for_the_policy() -> None:
    """A pipeline stored before the policy (or with the webhook off) still takes kopf's
    annotation patches and label changes; a change of its spec is refused."""
    old = pipeline_on("s3://ckpt/team-b/run")
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"datalane.io/last-handled-configuration": "{}"}
    assert review_pipeline(new, old).allowed
    new["spec"]["checkpoint"]["keep"] = 5
    v = review_pipeline(new, old)
    assert not v.allowed and "with its own identity" in v.message


def test_a_secret_ref_to_another_namespace_is_impossible() -> None:
    body = pipeline_on("s3://ckpt/run", secret="creds")
    body["spec"]["checkpoint"]["secretRef"]["namespace"] = "team-b"
    v = review_pipeline(body)
    assert not v.allowed
    assert "spec.checkpoint.secretRef.namespace is not a known key" in v.message, v.message
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    ref = schema["properties"]["spec"]["properties"]["checkpoint"]["properties"]["secretRef"]
    assert set(ref["properties"]) == {"name"}  # the API server prunes anything else


# -- the store is never touched without the policy ------------------------------------------


def test_without_secret_or_policy_a_directory_store_is_never_collected(tmp_path: Path) -> None:
    victim = tmp_path / "team-b" / "ckpt"
    commit_steps(CheckpointStore(str(victim)), [2, 4, 6])
    listing, kube = look(pipeline_on(f"file://{victim}", "team-a", keep=1))
    assert steps_on_disk(victim) == [2, 4, 6], "another team's checkpoints were deleted"
    assert listing.denied and not listing.ok and listing.deleted == [] and kube.reads == []
    assert "with its own identity: spec.checkpoint.secretRef is not set" in listing.error
    # the administrator's policy for team-a's prefix: listed and collected
    mine = tmp_path / "team-a" / "ckpt"
    commit_steps(CheckpointStore(str(mine)), [2, 4, 6])
    policy = Policy(True, {"team-a": (f"file://{tmp_path}/team-a/",)})
    listing, _ = look(pipeline_on(f"file://{mine}", "team-a", keep=1), policy)
    assert (listing.ok, listing.committed, listing.deleted) == (True, [6], [2, 4])
    listing, _ = look(pipeline_on(f"file://{victim}", "team-a", keep=1), policy)
    assert listing.denied and steps_on_disk(victim) == [2, 4, 6]


def test_s3_store_of_another_team_is_never_collected_with_the_operators_identity(
        s3_bucket: S3Bucket) -> None:
    """The operator's process has working S3 credentials in its environment (set by the
    moto fixture, as a cloud role would be): without a Secret they must not be used."""
    uri = f"{s3_bucket.uri}/team-b"
    store = CheckpointStore(uri, s3_bucket.storage_options)
    commit_steps(store, [1, 2, 3])
    listing, _ = look(pipeline_on(uri, "team-a", endpoint=s3_bucket.endpoint))
    assert store.committed_steps() == [1, 2, 3], "another team's checkpoints were deleted"
    assert listing.denied and listing.deleted == []
    # a Secret without the keys would let s3fs fall back to the same identity: refused too
    listing, kube = look(pipeline_on(uri, "team-a", secret="empty",
                                     endpoint=s3_bucket.endpoint),
                         secrets={("team-a", "empty"): {"AWS_REGION": "eu-west-1"}})
    assert store.committed_steps() == [1, 2, 3], "deleted with the operator's identity"
    assert listing.denied and kube.reads == [("team-a", "empty")]
    assert listing.error == (f"Secret 'empty' (spec.checkpoint.secretRef) has no "
                             f"AWS_ACCESS_KEY_ID and no AWS_SECRET_ACCESS_KEY; the operator acts "
                             f"on {uri!r} only with the Secret's credentials: add the keys to "
                             f"the Secret")
    # a missing Secret is not a reason to fall back either
    listing, kube = look(pipeline_on(uri, "team-a", secret="gone", endpoint=s3_bucket.endpoint))
    assert listing.denied and "Secret 'gone' (spec.checkpoint.secretRef) does not exist in " \
                              "namespace 'team-a'" in listing.error
    assert store.committed_steps() == [1, 2, 3]
    # the Secret of the pipeline's own namespace, read from that namespace only: collected
    creds = {"AWS_ACCESS_KEY_ID": s3_bucket.storage_options["key"],
             "AWS_SECRET_ACCESS_KEY": s3_bucket.storage_options["secret"]}
    listing, kube = look(pipeline_on(uri, "team-b", secret="s3-creds",
                                     endpoint=s3_bucket.endpoint),
                         secrets={("team-b", "s3-creds"): creds})
    assert (listing.ok, listing.committed, listing.deleted) == (True, [3], [1, 2])
    assert kube.reads == [("team-b", "s3-creds")]


def test_a_denied_store_is_a_degraded_condition() -> None:
    p = load_pipeline(pipeline_on("s3://ckpt/team-b"))
    denied = Listing("s3://ckpt/team-b", error="the operator would list ...", denied=True)
    d = decide(p, job(workers=4, namespace="team-a"), [], denied, None, "2026-01-01T00:00:00Z")
    (deg,) = [c for c in d.status["conditions"] if c["type"] == "Degraded"]
    assert (deg["status"], deg["reason"], deg["message"]) == (
        "True", "StoreAccessDenied", "the operator would list ...")
    assert ("Warning", "StoreAccessDenied") in [(e.type, e.reason) for e in d.events]
    assert "lastCommittedStep" not in d.status


# -- predicates -----------------------------------------------------------------------------


def with_predicates(top: str | None, per_source: str | None = None) -> dict[str, Any]:
    body = dp()
    if top:
        body["spec"]["recipe"]["filters"] = {"predicate": top}
    if per_source:
        body["spec"]["recipe"]["sources"][1]["filters"] = {"predicate": per_source}
    return body


def test_predicates_are_refused_unless_their_module_is_allowed() -> None:
    v = review_pipeline(with_predicates("mypkg.filters:keep"))
    assert not v.allowed
    assert v.message == (
        "spec.recipe.filters.predicate 'mypkg.filters:keep' is not allowed: the cluster policy "
        "admits predicates from no module (recipes.predicateModules). A predicate is code the "
        "sidecar imports and runs; ask an administrator to add its module, or drop the "
        "predicate")
    policy = Policy(predicate_modules=("corp.filters", "datalane_contrib"))
    assert review_pipeline(with_predicates("corp.filters:keep", "corp.filters.lang:en"),
                           policy=policy).allowed
    v = review_pipeline(with_predicates("corp.filters:keep", "corp.filtersx:steal"),
                        policy=policy)
    assert v.message.startswith(
        "spec.recipe.sources[1].filters.predicate 'corp.filtersx:steal' is not allowed: the "
        "cluster policy admits predicates only from the modules corp.filters, "
        "datalane_contrib (recipes.predicateModules)"), v.message
    assert not review_pipeline(with_predicates("os:system"), policy=policy).allowed


def test_a_pod_of_a_pipeline_with_a_forbidden_predicate_gets_no_sidecar() -> None:
    """A pipeline stored while the webhook was off: its pods are refused, not injected."""
    index = {("ml", "llama"): [with_predicates("mypkg.filters:keep")]}
    rt = Runtime(kube=FakeApi(dp()))  # where the webhook writes the recipe ConfigMap

    def inject() -> str:
        patch = kopf.Patch()
        try:
            asyncio.run(handlers.inject_sidecar(body=kopf.Body(copy.deepcopy(pod("llama-0"))),
                                                patch=patch, warnings=[], pipelines=index,
                                                memo=kopf.Memo(runtime=rt)))
        except kopf.AdmissionError as e:
            return str(e)
        return f"injected ({len(patch.fns)} changes)"

    assert inject().startswith("spec.recipe.filters.predicate 'mypkg.filters:keep' is not "
                               "allowed")
    rt.config.policy = Policy(predicate_modules=("mypkg",))
    assert inject() == "injected (1 changes)"


# -- the flags --------------------------------------------------------------------------------


def test_policy_flags() -> None:
    p = Policy.from_flags(True, '{"team-a": ["s3://ckpt/team-a/"]}', "corp.filters, x")
    assert p == Policy(True, {"team-a": ("s3://ckpt/team-a/",)}, ("corp.filters", "x"))
    assert Policy.from_flags(False, "", "") == Policy()
    with pytest.raises(ConfigError, match="is set but --allow-operator-identity is not"):
        Policy.from_flags(False, '{"team-a": ["s3://b/"]}', "")
    with pytest.raises(ConfigError, match="must map namespaces to lists of URI prefixes"):
        Policy.from_flags(True, '{"team-a": "s3://b/"}', "")


def test_run_refuses_a_bad_policy_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    assert operator_main(["run", "--allow-operator-identity",
                          "--operator-identity-prefixes", "{team-a"]) == 2
    assert "--operator-identity-prefixes '{team-a' is not JSON" in capsys.readouterr().err


def test_the_refusal_quoted_in_the_docs_is_the_real_one() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
    text = " ".join(doc.read_text().split())
    v = review_pipeline(pipeline_on("s3://ckpt/team-b/run", "team-a"))
    assert f'denied the request: {v.message}' in text
