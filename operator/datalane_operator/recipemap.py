"""The recipe ConfigMaps: one immutable ConfigMap per recipe of a pipeline, named for its
content, and which of them to collect.

A sidecar reads the recipe of the ConfigMap its pod mounts; the pod webhook stamps the pod
with the recipe it injected (:mod:`datalane_operator.rollout`), and the rollout restarts pods
by their stamps. The two are one recipe by construction:

* the ConfigMap of a recipe is ``<pipeline>-recipe-<digest>`` (:func:`configmap_name`),
  ``digest`` being its stamp's (16 hex digits of the SHA-256 of the canonical recipe), with
  ``immutable: true``: a name always holds the same bytes;
* the webhook injects the volume naming the ConfigMap of the very recipe it stamps
  (:func:`datalane_operator.inject.mutate_pod`), and creates that ConfigMap before it admits
  the pod when it does not exist yet (:func:`datalane_operator.webhooks.inject_sidecar`): a
  pod admitted in the moment between an edit and the leader's reconcile finds it. The
  webhook creates rather than waits or refuses because the pod would otherwise wait on the
  leader (a lease duration without one) or be refused for a ConfigMap the webhook itself can
  write; a ConfigMap it cannot write refuses the pod, naming it (its controller retries).
  Each replica remembers for :data:`WRITTEN_TTL_S` which ones exist, so admission stays an
  answer from memory for all but the first pod of a recipe.
  Nothing can start a pod with another recipe: a pod whose ConfigMap is missing waits in
  ``ContainerCreating`` (the volume is not optional), never mounts another one.

The operators before this one wrote one mutable ConfigMap, ``<pipeline>-recipe``, rewritten
at each edit: a pod created between an edit and the rewrite was stamped with the new recipe
and started with the old one. Their pods keep mounting it after an upgrade; it is one more
recipe ConfigMap to collect.

**Collection** (:func:`collect`, in the leader's reconcile): a recipe ConfigMap of the
pipeline that is not the current recipe's and that no live pod of the workload mounts is
deleted once the leader has seen it so for ``grace`` seconds (:data:`RECIPE_GRACE_S`): longer
than a pod's admission (the webhook's 10 s timeout) plus a replica's index lag, so a pod
that a replica admitted with an older recipe in the moment of the edit is seen mounting it
before it could go. A pod that has not finished (``Succeeded``/``Failed``), terminating ones
included, keeps every ConfigMap it mounts. Owner references to the pipeline take all of them
with it. Pure functions on plain dicts; callers: :mod:`~datalane_operator.inject`,
:mod:`~datalane_operator.webhooks`, :mod:`~datalane_operator.reconciler`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datalane_operator.names import (
    FIELD_MANAGER,
    GROUP,
    KIND,
    LABEL_MANAGED_BY,
    LABEL_PIPELINE,
    RECIPE_FILE,
    VERSION,
    VOLUME_RECIPE,
    legacy_recipe_configmap_name,
    recipe_configmap_name,
)
from datalane_operator.pipeline import Pipeline
from datalane_operator.rollout import stamp_of

__all__ = ["RECIPE_GRACE_S", "WRITTEN_TTL_S", "Collection", "collect", "configmap_body",
           "configmap_name", "is_recipe_configmap", "labels_of", "mounted", "mounted_recipe",
           "owner_of"]

RECIPE_GRACE_S = 30.0
"""Seconds a recipe ConfigMap stays unreferenced, as the leader sees it, before it goes."""
WRITTEN_TTL_S = 10.0
"""Seconds a replica trusts that a recipe ConfigMap it created (or found) still exists, so
that a burst of pods costs one API call per recipe: well inside :data:`RECIPE_GRACE_S`, so a
pod admitted on that trust is seen mounting it before the leader could collect it."""
_DIGEST = r"[0-9a-f]{16}"
_DONE = ("Succeeded", "Failed")


def configmap_name(pipeline: Pipeline) -> str:
    """The ConfigMap of the pipeline's current recipe: ``<pipeline>-recipe-<stamp digest>``."""
    return recipe_configmap_name(pipeline.name, stamp_of(pipeline.recipe).digest)


def labels_of(pipeline: Pipeline) -> dict[str, str]:
    return {LABEL_PIPELINE: pipeline.name, LABEL_MANAGED_BY: FIELD_MANAGER}


def owner_of(pipeline: Pipeline) -> list[dict[str, Any]]:
    """The owner reference to the pipeline (none without its uid: the reconcile adopts it)."""
    if not pipeline.uid:
        return []
    return [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": pipeline.name,
             "uid": pipeline.uid, "controller": True, "blockOwnerDeletion": False}]


def configmap_body(pipeline: Pipeline) -> dict[str, Any]:
    """The immutable ConfigMap of the pipeline's current recipe (``recipe.json``: the
    composed recipe as :meth:`~datalane_operator.pipeline.Pipeline.recipe_json` writes it)."""
    meta: dict[str, Any] = {"name": configmap_name(pipeline), "namespace": pipeline.namespace,
                            "labels": labels_of(pipeline)}
    owners = owner_of(pipeline)
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "immutable": True,
            "data": {RECIPE_FILE: pipeline.recipe_json()}}


def is_recipe_configmap(name: str, pipeline: str) -> bool:
    """Whether ``name`` is a recipe ConfigMap of ``pipeline`` (content-named or legacy)."""
    return name == legacy_recipe_configmap_name(pipeline) or re.fullmatch(
        re.escape(f"{pipeline}-recipe-") + _DIGEST, name) is not None


def mounted(pod: Mapping[str, Any]) -> set[str]:
    """Every ConfigMap a pod mounts: its ``configMap`` volumes and projected sources."""
    out: set[str] = set()
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        cm = volume.get("configMap")
        if cm and cm.get("name"):
            out.add(str(cm["name"]))
        for source in (volume.get("projected") or {}).get("sources") or []:
            cm = source.get("configMap")
            if cm and cm.get("name"):
                out.add(str(cm["name"]))
    return out


def mounted_recipe(pod: Mapping[str, Any]) -> str | None:
    """The ConfigMap the pod's sidecar reads its recipe from (the injected volume), or None."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == VOLUME_RECIPE:
            return str((volume.get("configMap") or {}).get("name") or "") or None
    return None


def _live(pods: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    return (p for p in pods if (p.get("status") or {}).get("phase") not in _DONE)


@dataclass(frozen=True)
class Collection:
    """What :func:`collect` decided: the ConfigMaps to delete, as (name, uid), and since when
    each other unreferenced one has been seen so (to pass to the next call)."""

    delete: tuple[tuple[str, str], ...] = ()
    unreferenced: dict[str, float] = field(default_factory=dict)


def collect(configmaps: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
            pipeline: str, current: str, since: Mapping[str, float], now: float,
            grace: float = RECIPE_GRACE_S) -> Collection:
    """The recipe ConfigMaps of ``pipeline`` to delete now.

    ``configmaps``: those labelled with the pipeline (others' names, which are not recipe
    ConfigMaps of it, are never touched); ``pods``: the workload's pods; ``current``: the
    current recipe's ConfigMap, always kept; ``since``: the previous call's
    ``unreferenced``; ``now``: monotonic seconds. One is deleted when it is neither current nor
    mounted by a pod that has not finished, and was already so ``grace`` seconds ago.
    """
    kept = {current}.union(*(mounted(p) for p in _live(pods)))
    delete: list[tuple[str, str]] = []
    unreferenced: dict[str, float] = {}
    for cm in configmaps:
        meta = cm.get("metadata") or {}
        name = str(meta.get("name", ""))
        if (name in kept or not is_recipe_configmap(name, pipeline)
                or meta.get("deletionTimestamp")):
            continue
        first = since.get(name, now)
        if now - first >= grace:
            delete.append((name, str(meta.get("uid", ""))))
        else:
            unreferenced[name] = first
    return Collection(tuple(sorted(delete)), unreferenced)
