"""The recipe ConfigMaps' pure parts (operator/datalane_operator/recipemap.py): the name of a
recipe's ConfigMap, its body, what a pod mounts, and which old ones to collect when."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from datalane_operator.cli import main as operator_main
from datalane_operator.inject import mutate_pod
from datalane_operator.pipeline import load_pipeline
from datalane_operator.recipemap import (
    collect,
    configmap_body,
    configmap_name,
    is_recipe_configmap,
    mounted,
    mounted_recipe,
)
from datalane_operator.rollout import stamp_of

from .builders import RECIPE, RECIPE_CONFIGMAP_META, dp, pod

OLD = "pretrain-recipe-66693d1a8e29c782"
NEW = "pretrain-recipe-009211fb40dec5cd"
ANNEAL = {"name": "anneal", "start_step": 500, "weights": {"web": 1.0}}


def test_the_name_is_the_digest_of_the_canonical_recipe() -> None:
    pipeline = load_pipeline(dp())
    canonical = json.dumps(pipeline.recipe.to_dict(), sort_keys=True, separators=(",", ":"))
    assert hashlib.sha256(canonical.encode()).hexdigest()[:16] == "66693d1a8e29c782"
    assert configmap_name(pipeline) == OLD
    assert configmap_name(load_pipeline(dp(recipe={**RECIPE, "phases": [ANNEAL]}))) == NEW
    # knobs of the sidecar and the checkpoint store are no part of the recipe
    assert configmap_name(load_pipeline(dp(sidecar={"workers": 7}))) == OLD
    assert configmap_name(load_pipeline(dp(name="other"))) == "other-recipe-66693d1a8e29c782"


def test_the_body_is_immutable_owned_and_holds_the_recipe_json() -> None:
    pipeline = load_pipeline(dp())
    body = configmap_body(pipeline)
    assert body == {
        "apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
        "metadata": {"name": OLD, "namespace": "ml", **RECIPE_CONFIGMAP_META},
        "data": {"recipe.json": pipeline.recipe_json()}}
    assert stamp_of(pipeline.recipe).digest == OLD.rsplit("-", 1)[1]


def test_the_injected_pod_mounts_the_configmap_of_its_stamp() -> None:
    pipeline = load_pipeline(dp(recipe={**RECIPE, "phases": [ANNEAL]}))
    out = mutate_pod(pod(), pipeline, "img:1")
    assert mounted_recipe(out) == NEW
    assert mounted(out) == {NEW}
    stamp = json.loads(out["metadata"]["annotations"]["datalane.io/recipe"])
    assert f"pretrain-recipe-{stamp['digest']}" == NEW
    assert mounted_recipe(pod()) is None


def test_which_names_are_the_pipelines_recipe_configmaps() -> None:
    assert is_recipe_configmap("pretrain-recipe", "pretrain")  # the previous version's
    assert is_recipe_configmap(OLD, "pretrain")
    for other in ("pretrain-recipe-66693d1a8e29c78", "pretrain-recipe-66693D1A8E29C782",
                  "pretrain-recipe-66693d1a8e29c782x", "pretrain-settings",
                  "pre-recipe-66693d1a8e29c782", "pretrainx-recipe"):
        assert not is_recipe_configmap(other, "pretrain"), other
    assert not is_recipe_configmap(OLD, "pre")  # another pipeline's, whose name is a prefix
    assert is_recipe_configmap("a.b-recipe-0123456789abcdef", "a.b")
    assert not is_recipe_configmap("axb-recipe-0123456789abcdef", "a.b")


def cm(name: str, uid: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid or f"u-{name[-4:]}",
                         "labels": {"datalane.io/pipeline": "pretrain"}}}


def mounting(name: str, phase: str | None = "Running", *, projected: bool = False,
             deleting: bool = False) -> dict[str, Any]:
    volume: dict[str, Any] = ({"name": "v", "projected": {"sources": [{"configMap": {
        "name": name}}]}} if projected else {"name": "datalane-recipe",
                                             "configMap": {"name": name}})
    p: dict[str, Any] = {"metadata": {"name": f"p-{name[-4:]}"},
                         "spec": {"volumes": [volume]}}
    if phase is not None:
        p["status"] = {"phase": phase}
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return p


def test_collect_keeps_the_current_and_every_mounted_one() -> None:
    maps = [cm("pretrain-recipe"), cm(OLD), cm(NEW), cm("pretrain-recipe-0000000000000000")]
    pods = [mounting("pretrain-recipe", deleting=True),  # terminating: still running
            mounting(OLD, None),  # pending: not started yet
            mounting("pretrain-recipe-0000000000000000", "Succeeded")]  # finished
    first = collect(maps, pods, "pretrain", NEW, {}, now=100.0, grace=30.0)
    assert first.delete == ()
    assert first.unreferenced == {"pretrain-recipe-0000000000000000": 100.0}
    later = collect(maps, pods, "pretrain", NEW, first.unreferenced, now=129.9, grace=30.0)
    assert later.delete == ()
    assert later.unreferenced == {"pretrain-recipe-0000000000000000": 100.0}
    done = collect(maps, pods, "pretrain", NEW, later.unreferenced, now=130.0, grace=30.0)
    assert done.delete == (("pretrain-recipe-0000000000000000", "u-0000"),)
    assert done.unreferenced == {}
    # a projected volume keeps it too; a pod whose sidecar was never injected keeps nothing
    assert collect([cm(OLD)], [mounting(OLD, projected=True), pod()], "pretrain", NEW, {},
                   now=0.0, grace=0.0).delete == ()


def test_collect_starts_the_grace_again_when_a_pod_mounts_it_meanwhile() -> None:
    maps = [cm(OLD), cm(NEW)]
    seen = collect(maps, [], "pretrain", NEW, {}, now=0.0, grace=30.0).unreferenced
    assert seen == {OLD: 0.0}
    # a replica with an older index admitted a pod of the old recipe at 20 s
    seen = collect(maps, [mounting(OLD)], "pretrain", NEW, seen, now=25.0, grace=30.0
                   ).unreferenced
    assert seen == {}
    seen = collect(maps, [], "pretrain", NEW, seen, now=40.0, grace=30.0).unreferenced
    assert seen == {OLD: 40.0}
    assert collect(maps, [], "pretrain", NEW, seen, now=69.0, grace=30.0).delete == ()
    assert collect(maps, [], "pretrain", NEW, seen, now=70.0, grace=30.0).delete == (
        (OLD, "u-c782"),)


def test_collect_touches_only_this_pipelines_recipe_configmaps() -> None:
    gone = copy.deepcopy(cm(OLD))
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    maps = [cm("pretrain-settings"), cm("other-recipe-66693d1a8e29c782"), gone, cm(NEW)]
    # the current one stays even when no pod mounts it (before the first pod, say)
    out = collect(maps, [], "pretrain", NEW, {}, now=1e6, grace=0.0)
    assert out.delete == () and out.unreferenced == {}


def test_run_refuses_a_negative_grace(capsys: pytest.CaptureFixture[str]) -> None:
    assert operator_main(["run", "--recipe-grace", "-1"]) == 2
    assert "--recipe-grace -1.0 must be a number of seconds >= 0" in capsys.readouterr().err
    assert operator_main(["run", "--recipe-grace", "nan"]) == 2
