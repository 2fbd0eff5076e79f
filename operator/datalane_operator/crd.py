"""The ``datapipelines.datalane.io`` CustomResourceDefinition, generated from the models.

``spec`` comes from :class:`~datalane_operator.pipeline.PipelineSpec` and ``spec.recipe``
from :func:`datalane.spec.recipe_schema` (without ``lanes`` and ``global_batch_size``, which
the spec lifts to ``spec.lanes``/``spec.globalBatchSize``), so the recipe's schema has one
source of truth. :func:`structural` turns those JSON Schemas into Kubernetes *structural*
schemas:

* ``additionalProperties: false`` next to ``properties`` is forbidden there; it is dropped
  (the API server prunes unknown fields, and ``kubectl`` rejects them with its default
  strict field validation);
* JSON Schema ``pattern`` is a search, the model's is a full match: patterns are anchored;
* ``nullable`` stays (OpenAPI v3.0); a nullable ``enum`` is dropped and its choices go to the
  description, since the API server refuses null for an enum even when the enum lists it (the
  admission webhook checks the choice); ``exclusiveMinimum`` stays boolean;
* a model field that is a count or a word (``int | Literal["auto"]``) is Kubernetes'
  int-or-string, its words a pattern (which applies to strings only, as the bounds apply to
  numbers only), named in the description.

Every version of ``SERVED_VERSIONS`` (v1alpha1, the storage version, and v1beta1) has this
one schema, so the API server converts between them without a webhook (``conversion: None``).

CEL rules add what a single field cannot say (``globalBatchSize % lanes == 0``, lanes fixed
for the life of a run, name length). ``python -m datalane_operator crd`` prints the YAML
committed as ``crds/datapipelines.datalane.io.yaml``; a test fails when they differ.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from datalane.spec.model import json_schema
from datalane.spec.recipe import recipe_schema
from datalane_operator.names import (
    GROUP,
    KIND,
    PLURAL,
    SERVED_VERSIONS,
    SHORT_NAME,
    SINGULAR,
    VERSION,
)
from datalane_operator.pipeline import LIFTED_RECIPE_FIELDS, QUANTITY, PipelineSpec

__all__ = ["CRD_FILE", "crd_manifest", "crd_yaml", "spec_schema", "status_schema",
           "structural"]

CRD_FILE = f"crds/{PLURAL}.{GROUP}.yaml"
MAX_NAME = 63


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a model JSON Schema that Kubernetes accepts as a structural schema."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "additionalProperties" and value is False and "properties" in schema:
            continue
        if key == "description" and "description" in out:
            continue
        if key == "pattern":
            out[key] = f"^(?:{value})$"
        elif key == "enum" and schema.get("nullable"):
            # The API server refuses null for a nullable enum (even one listing null), and a
            # CEL rule per list item exceeds the cost budget of unbounded lists: the choice is
            # left to the admission webhook (the recipe model checks it) and documented.
            words = ", ".join(f"`{v}`" for v in value)
            out["description"] = (f"{schema.get('description', '')} One of {words}, or null "
                                  f"(checked at admission).").strip()
        elif key == "anyOf" and _int_or_words(value) is not None:
            choices = _int_or_words(value) or []
            out.update({"anyOf": [{"type": "integer"}, {"type": "string"}],
                        "pattern": f"^(?:{'|'.join(re.escape(w) for w in choices)})$",
                        "x-kubernetes-int-or-string": True})
            named = ", ".join(f"`{w}`" for w in choices)
            out["description"] = f"{schema.get('description', '')} An integer or {named}.".strip()
        elif key == "properties":
            out[key] = {name: structural(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _int_or_words(arms: list[dict[str, Any]]) -> list[str] | None:
    """The words of a model's ``int | Literal[...]`` schema (``anyOf`` an integer and a
    string enum), or None for any other ``anyOf``."""
    types = sorted(a.get("type", "") for a in arms)
    if types != ["integer", "string"]:
        return None
    (words,) = [a.get("enum") for a in arms if a.get("type") == "string"]
    return list(words) if words else None


def _quantity() -> dict[str, Any]:
    return {"anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": f"^{QUANTITY}$", "x-kubernetes-int-or-string": True}


def _resources() -> dict[str, Any]:
    table = {"type": "object", "additionalProperties": _quantity()}
    return {
        "type": "object",
        "description": "Resources of the sidecar container (requests and limits), as in a "
                       "container spec.",
        "properties": {
            "requests": {**table, "description": "Minimum resources the sidecar needs."},
            "limits": {**table, "description": "Maximum resources the sidecar may use."},
        },
    }


def recipe_part() -> dict[str, Any]:
    """``spec.recipe``: the recipe schema without the fields lifted into the spec."""
    schema = structural(recipe_schema())
    for name in LIFTED_RECIPE_FIELDS:
        schema["properties"].pop(name)
    schema["required"] = [r for r in schema.get("required", []) if r not in LIFTED_RECIPE_FIELDS]
    schema["description"] = ("The data recipe (see docs/recipe.md) without `lanes` and "
                             "`global_batch_size`, which are spec.lanes and "
                             "spec.globalBatchSize; the operator composes the full recipe.")
    return schema


def spec_schema() -> dict[str, Any]:
    """The schema of ``spec``: the pipeline model, the recipe, the sidecar's resources."""
    spec = structural(json_schema(PipelineSpec))
    spec["description"] = "What data a training job eats and how its sidecars are run."
    props = spec["properties"]
    props["recipe"] = recipe_part()
    spec["required"] = [*spec["required"], "recipe"]
    sidecar = props["sidecar"]
    sidecar["properties"]["resources"] = _resources()
    sidecar["default"] = {}  # so its fields' defaults apply when the block is omitted
    props["parallelism"]["default"] = {}
    props["data"]["default"] = {}
    # Fixed for the life of a run: changing them changes the data order.
    for name in ("lanes", "globalBatchSize"):
        props[name]["x-kubernetes-validations"] = [
            {"rule": "self == oldSelf",
             "message": f"spec.{name} is fixed for the life of a run; create a new "
                        f"DataPipeline for a new run"}]
    spec["x-kubernetes-validations"] = [
        {"rule": "self.globalBatchSize % self.lanes == 0",
         "message": "spec.globalBatchSize must be a multiple of spec.lanes",
         "reason": "FieldValueInvalid", "fieldPath": ".globalBatchSize"}]
    return spec


def _condition() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "Ready, Degraded or PhaseRolled."},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string", "description": "One CamelCase word."},
            "message": {"type": "string", "maxLength": 32768},
            "observedGeneration": {"type": "integer", "minimum": 0},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
        },
    }


def status_schema() -> dict[str, Any]:
    """``status``: written only by the operator, rebuilt from the world on every reconcile."""
    def integer(text: str) -> dict[str, Any]:
        return {"type": "integer", "minimum": 0, "description": text}

    return {
        "type": "object",
        "description": "Observed state, rebuilt by the operator from the workload, its pods "
                       "and the checkpoint store.",
        "properties": {
            "phase": {"type": "string", "description": "Pending, Starting, Running, Degraded, "
                      "Succeeded or Failed.",
                      "enum": ["Pending", "Starting", "Running", "Degraded", "Succeeded",
                               "Failed"]},
            "observedGeneration": integer("The spec generation this status describes."),
            "pods": integer("Pods the workload runs (all replica types)."),
            "readyPods": integer("Pods with a sidecar that are ready."),
            "ranksPerPod": integer("Ranks torchrun starts per pod (nprocPerNode)."),
            "ranks": integer("Trainer ranks (torchrun's WORLD_SIZE): pods x ranks per pod."),
            "worldSize": integer("Data-parallel (DP) world size: ranks / (TP x PP x CP) of "
                                 "spec.parallelism (pods x ranks per pod without it); 1 to "
                                 "the lanes."),
            "readersPerDataRank": integer("Ranks that read one DP rank through their pod's "
                                          "sidecar: TP x CP."),
            "lanesPerRank": {"anyOf": [{"type": "integer"}, {"type": "string"}],
                             "pattern": "^[0-9]+-[0-9]+$", "x-kubernetes-int-or-string": True,
                             "description": "Lanes each DP rank serves: lanes / world size "
                                            "when it divides them (DP rank r owns lanes "
                                            "[r*k, (r+1)*k)), else the range \"floor-ceil\" "
                                            "(8 lanes over 3 ranks: \"2-3\"; DP rank r owns "
                                            "lanes [floor(r*L/W), floor((r+1)*L/W)))."},
            "lastCommittedStep": integer("Newest committed checkpoint step in the store."),
            "checkpoints": {"type": "array", "maxItems": 10,
                            "items": {"type": "integer", "minimum": 0},
                            "description": "Newest committed checkpoint steps, ascending "
                                           "(at most 10)."},
            "recipeConfigMap": {"type": "string",
                                "description": "Immutable ConfigMap holding the current "
                                               "composed recipe, <name>-recipe-<digest>; a "
                                               "pod mounts the one of the recipe it is "
                                               "stamped with."},
            "conditions": {"type": "array", "items": _condition(),
                           "x-kubernetes-list-type": "map",
                           "x-kubernetes-list-map-keys": ["type"],
                           "description": "Ready and Degraded, with reasons; PhaseRolled "
                                          "after an edit of spec.recipe (whether every pod "
                                          "serves it)."},
        },
    }


def crd_manifest() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    schema = {
        "type": "object",
        "description": "A training job's data: recipe, lanes, checkpoints and sidecars.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            {"rule": f"self.metadata.name.size() <= {MAX_NAME}",
             "message": f"metadata.name has at most {MAX_NAME} characters (it is a label "
                        f"value on every injected pod)"}],
    }
    columns = [
        {"name": "Workload", "type": "string", "jsonPath": ".spec.workload.name",
         "priority": 1},
        {"name": "Lanes", "type": "integer", "jsonPath": ".spec.lanes"},
        {"name": "World", "type": "integer", "jsonPath": ".status.worldSize",
         "description": "Data-parallel world size."},
        {"name": "Ranks", "type": "integer", "jsonPath": ".status.ranks", "priority": 1},
        {"name": "Step", "type": "integer", "jsonPath": ".status.lastCommittedStep"},
        {"name": "Ready", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
         "description": "The Ready condition: True when every pod's sidecar serves."},
        {"name": "Reason", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].reason', "priority": 1,
         "description": "Why the pipeline is (not) ready (SidecarFailed, PodsNotReady, ...)."},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}",
                     "labels": {"app.kubernetes.io/name": "datalane",
                                "app.kubernetes.io/component": "crd"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
                      "singular": SINGULAR, "shortNames": [SHORT_NAME],
                      "categories": ["datalane"]},
            # One schema under every name (a copy each: no YAML aliases in the file), so the
            # API server converts between them by rewriting apiVersion (strategy None).
            "versions": [{
                "name": name,
                "served": True,
                "storage": name == VERSION,
                "schema": {"openAPIV3Schema": copy.deepcopy(schema)},
                "subresources": {"status": {}},
                "additionalPrinterColumns": copy.deepcopy(columns),
            } for name in SERVED_VERSIONS],
            "conversion": {"strategy": "None"},
        },
    }


HEADER = ("# Generated by `python -m datalane_operator crd` from the recipe and pipeline models;\n"
          "# do not edit (tests/operator/test_crd.py fails when this file drifts).\n")


def crd_yaml() -> str:
    """The CRD as the YAML text committed in ``crds/`` and the Helm chart."""
    body = yaml.safe_dump(crd_manifest(), sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body
