"""What a pod is stamped with is what its sidecar mounts (review finding 1): the recipe
ConfigMaps through the real pod webhook handler, the real reconcile and the real
:class:`~datalane_operator.kube.Kube`, over an API server in memory (tests/operator/fakeapi.py)
that answers as the real one does.

* the race: a recipe edit between the webhook's admission and the leader's ConfigMap write,
  either way round, leaves every pod mounting the bytes of the recipe it is stamped with;
* the upgrade: a pipeline of the previous version (one mutable ConfigMap ``<name>-recipe``)
  keeps its running pods, the next pods get the content-named ConfigMap, and the old one is
  collected once no pod mounts it;
* the webhook's write: created before the pod is admitted, never on a dry run, and a pod
  whose ConfigMap cannot be written is refused, naming it.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import kopf
from datalane_operator import handlers
from datalane_operator.inject import mutate_pod
from datalane_operator.pipeline import load_pipeline
from datalane_operator.reconciler import reconcile
from datalane_operator.rollout import Stamp, stamp_of
from datalane_operator.runtime import OperatorConfig, Runtime
from datalane_operator.storage import Listing
from kubernetes.client.rest import ApiException

from datalane.spec.recipe import load_recipe

from .builders import RECIPE, RECIPE_CONFIGMAP_META, dp, job, pod
from .fakeapi import FakeKube

KEY = ("ml", "pretrain")
ANNEAL = {"name": "anneal", "start_step": 500, "weights": {"web": 1.0}}
OLD_NAME = "pretrain-recipe-66693d1a8e29c782"  # sha256 of the canonical RECIPE, 16 hex digits
NEW_NAME = "pretrain-recipe-009211fb40dec5cd"  # ... with ANNEAL appended


def edited() -> dict[str, Any]:
    body = dp(recipe={**copy.deepcopy(RECIPE), "phases": [ANNEAL]})
    body["metadata"]["generation"] = 2
    return body


def edit(kube: FakeKube) -> None:
    """The edit stored: the spec is the edited one, the status stays."""
    kube.body = {**edited(), "status": kube.body.get("status") or {}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def runtime(kube: FakeKube, clock: Clock | None = None) -> Runtime:
    rt = Runtime(OperatorConfig(sidecar_image="img:1"), kube=kube, clock=clock or Clock())
    rt.listings[KEY] = Listing("s3://ckpt/run-1", [])
    return rt


def admit(rt: Runtime, index_body: dict[str, Any], name: str, dryrun: bool = False,
          ) -> dict[str, Any]:
    """The pod ``name`` as the pod webhook admits it, its index holding ``index_body``."""
    patch = kopf.Patch()
    body = pod(name)
    asyncio.run(handlers.inject_sidecar(
        body=kopf.Body(copy.deepcopy(body)), patch=patch, warnings=[], dryrun=dryrun,
        pipelines={("ml", "llama"): [copy.deepcopy(index_body)]}, memo=kopf.Memo(runtime=rt)))
    for fn in patch.fns:
        fn(body)
    return body


def recipe_volume(p: dict[str, Any]) -> str:
    (vol,) = [v for v in p["spec"]["volumes"] if v["name"] == "datalane-recipe"]
    return str(vol["configMap"]["name"])


def mounted_stamp(kube: FakeKube, p: dict[str, Any]) -> Stamp | None:
    """The stamp of the recipe the pod's sidecar reads: the ConfigMap its volume names, as the
    API server holds it now (None when there is none)."""
    cm = kube.core.configmaps.get(("ml", recipe_volume(p)))
    if cm is None:
        return None
    return stamp_of(load_recipe(json.loads(cm["data"]["recipe.json"])))


def stamp_on(p: dict[str, Any]) -> Stamp | None:
    return Stamp.parse(p["metadata"]["annotations"]["datalane.io/recipe"])


def test_a_pod_admitted_between_an_edit_and_the_configmap_write_mounts_its_stamp() -> None:
    kube = FakeKube(dp(), job(workers=2))
    rt = runtime(kube)
    asyncio.run(reconcile(rt, KEY))  # the leader wrote the recipe's ConfigMap
    first = admit(rt, dp(), "llama-worker-0")
    # the edit is stored and in the webhook's index; the leader has not reconciled it yet
    edit(kube)
    second = admit(rt, edited(), "llama-worker-1")
    assert stamp_on(second) == stamp_of(load_pipeline(edited()).recipe)
    assert mounted_stamp(kube, second) == stamp_on(second)  # there before the pod is
    assert recipe_volume(second) == NEW_NAME
    assert mounted_stamp(kube, first) == stamp_on(first)
    # the leader's reconcile, then pods the other way round: a replica whose index still holds
    # the old recipe admits one after the leader wrote the new one
    for p in (first, second):
        kube.core.add(kube.core.pods, p, "ml")
    asyncio.run(reconcile(rt, KEY))
    third = admit(rt, dp(), "llama-worker-2")
    for p in (first, second, third):
        assert mounted_stamp(kube, p) == stamp_on(p), p["metadata"]["name"]
    assert recipe_volume(third) == OLD_NAME
    assert kube.body["status"]["recipeConfigMap"] == NEW_NAME
    for name, body in ((OLD_NAME, dp()), (NEW_NAME, edited())):  # content-named, immutable
        cm = kube.core.configmaps[("ml", name)]
        assert cm["immutable"] is True
        assert cm["data"] == {"recipe.json": load_pipeline(body).recipe_json()}
        assert cm["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def legacy(kube: FakeKube) -> dict[str, Any]:
    """What the previous operator left: its mutable ConfigMap ``pretrain-recipe`` (as its
    reconcile wrote it) and a Running pod mounting it, stamped with the same recipe."""
    pipeline = load_pipeline(dp())
    kube.core.add(kube.core.configmaps, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "pretrain-recipe", **copy.deepcopy(RECIPE_CONFIGMAP_META)},
        "data": {"recipe.json": pipeline.recipe_json()}}, "ml")
    old = mutate_pod(pod("llama-worker-0", phase="Running"), pipeline, "img:0")
    for vol in old["spec"]["volumes"]:
        if vol["name"] == "datalane-recipe":
            vol["configMap"]["name"] = "pretrain-recipe"
    kube.core.add(kube.core.pods, old, "ml")
    return old


def test_a_pipeline_of_the_previous_version_keeps_working_after_the_upgrade() -> None:
    kube = FakeKube(dp(), job(workers=2))
    clock = Clock()
    old_pod = legacy(kube)
    before = copy.deepcopy(kube.core.configmaps[("ml", "pretrain-recipe")])
    rt = runtime(kube, clock)
    asyncio.run(reconcile(rt, KEY))  # the upgraded operator's first reconcile
    assert kube.body["status"]["recipeConfigMap"] == OLD_NAME
    assert set(kube.core.configmaps) == {("ml", "pretrain-recipe"), ("ml", OLD_NAME)}
    assert kube.core.configmaps[("ml", "pretrain-recipe")] == before  # untouched, still mounted
    assert ("ml", "llama-worker-0") in kube.core.pods  # same recipe: not restarted
    assert mounted_stamp(kube, old_pod) == stamp_on(old_pod)
    # the next pod (worker 1 created, say, by a rescale) gets the content-named ConfigMap
    new_pod = admit(rt, dp(), "llama-worker-1")
    assert recipe_volume(new_pod) == OLD_NAME
    assert mounted_stamp(kube, new_pod) == stamp_on(new_pod)
    kube.core.add(kube.core.pods, new_pod, "ml")
    clock.now += 3600  # mounted for an hour: kept
    asyncio.run(reconcile(rt, KEY))
    assert ("ml", "pretrain-recipe") in kube.core.configmaps
    # the old pod goes; the legacy ConfigMap is collected once it stayed unmounted 30 s
    del kube.core.pods[("ml", "llama-worker-0")]
    asyncio.run(reconcile(rt, KEY))
    clock.now += 29
    asyncio.run(reconcile(rt, KEY))
    assert ("ml", "pretrain-recipe") in kube.core.configmaps
    clock.now += 1
    asyncio.run(reconcile(rt, KEY))
    assert set(kube.core.configmaps) == {("ml", OLD_NAME)}
    assert mounted_stamp(kube, new_pod) == stamp_on(new_pod)


def test_an_edited_recipes_old_configmap_goes_when_its_last_pod_does() -> None:
    kube = FakeKube(dp(), job(workers=1))
    clock = Clock()
    rt = runtime(kube, clock)
    rt.listings[KEY] = Listing("s3://ckpt/run-1", [100, 200])
    asyncio.run(reconcile(rt, KEY))
    running = admit(rt, dp(), "llama-worker-0")
    running["status"] = {"phase": "Running"}
    kube.core.add(kube.core.pods, running, "ml")
    edit(kube)
    asyncio.run(reconcile(rt, KEY))  # the rollout waits for the next checkpoint (step 300)
    assert ("ml", "llama-worker-0") in kube.core.pods
    clock.now += 600
    asyncio.run(reconcile(rt, KEY))
    assert set(kube.core.configmaps) == {("ml", OLD_NAME), ("ml", NEW_NAME)}
    # terminating (its containers may still run): kept; finished: collected after the grace
    kube.core.pods[("ml", "llama-worker-0")]["metadata"]["deletionTimestamp"] = "now"
    asyncio.run(reconcile(rt, KEY))
    clock.now += 600
    asyncio.run(reconcile(rt, KEY))
    assert ("ml", OLD_NAME) in kube.core.configmaps
    kube.core.pods[("ml", "llama-worker-0")]["status"]["phase"] = "Succeeded"
    asyncio.run(reconcile(rt, KEY))
    clock.now += 30
    asyncio.run(reconcile(rt, KEY))
    assert set(kube.core.configmaps) == {("ml", NEW_NAME)}


def test_the_webhook_writes_the_configmap_first_never_on_a_dry_run() -> None:
    kube = FakeKube(dp())
    clock = Clock()
    rt = runtime(kube, clock)
    dry = admit(rt, dp(), "llama-worker-0", dryrun=True)
    assert recipe_volume(dry) == OLD_NAME
    assert kube.core.configmaps == {}  # a dry run has no side effect (sideEffects NoneOnDryRun)
    admitted = admit(rt, dp(), "llama-worker-0")
    assert [c for c in kube.core.calls if "config_map" in c[0]] == [
        ("create_namespaced_config_map", OLD_NAME)]
    assert mounted_stamp(kube, admitted) == stamp_on(admitted)
    cm = kube.core.configmaps[("ml", OLD_NAME)]
    assert {k: cm["metadata"][k] for k in RECIPE_CONFIGMAP_META} == RECIPE_CONFIGMAP_META
    assert cm["data"] == {"recipe.json": load_pipeline(dp()).recipe_json()}
    # a burst of pods: written 9.9 s ago, no call; 10 s ago, a create again (it exists: 409)
    clock.now += 9.9
    admit(rt, dp(), "llama-worker-1")
    assert len([c for c in kube.core.calls if "config_map" in c[0]]) == 1
    clock.now += 0.1
    admit(rt, dp(), "llama-worker-2")
    assert [c for c in kube.core.calls if "config_map" in c[0]] == [
        ("create_namespaced_config_map", OLD_NAME)] * 2
    assert len(kube.core.configmaps) == 1


def test_a_pod_whose_configmap_cannot_be_written_is_refused_naming_it() -> None:
    kube = FakeKube(dp())
    refused = ApiException(status=403, reason="Forbidden")
    refused.body = json.dumps({"message": 'configmaps is forbidden: User "system:serviceaccount:'
                                          'dl:dl-datalane" cannot create resource "configmaps"'})
    kube.core.refuse["create_namespaced_config_map"] = refused
    rt = runtime(kube)
    try:
        admit(rt, dp(), "llama-worker-0")
    except kopf.AdmissionError as e:
        message = str(e)
    else:
        raise AssertionError("admitted")
    assert message == (
        f"cannot create ConfigMap {OLD_NAME!r}, the recipe of DataPipeline pretrain that the "
        f"pod's sidecar would mount: 403 configmaps is forbidden: User "
        f"\"system:serviceaccount:dl:dl-datalane\" cannot create resource \"configmaps\"; the "
        f"pod is refused rather than left waiting for it (its controller retries)")


def test_without_a_job_its_pods_left_still_keep_their_configmap() -> None:
    """The job deleted (its pods terminating) or not created yet: the pods are listed for the
    collection only when there is an old ConfigMap to decide on."""
    kube = FakeKube(dp())  # no PyTorchJob
    clock = Clock()
    rt = runtime(kube, clock)
    asyncio.run(reconcile(rt, KEY))
    assert not [c for c in kube.core.calls if c[0] == "list_namespaced_pod"]  # nothing old
    left = admit(rt, dp(), "llama-worker-0")
    kube.core.add(kube.core.pods, left, "ml")
    edit(kube)
    asyncio.run(reconcile(rt, KEY))
    clock.now += 600
    asyncio.run(reconcile(rt, KEY))
    assert set(kube.core.configmaps) == {("ml", OLD_NAME), ("ml", NEW_NAME)}
    del kube.core.pods[("ml", "llama-worker-0")]
    asyncio.run(reconcile(rt, KEY))
    clock.now += 30
    asyncio.run(reconcile(rt, KEY))
    assert set(kube.core.configmaps) == {("ml", NEW_NAME)}
