"""The generated CRD: committed file in sync, structural, one source for the recipe schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from datalane_operator.crd import CRD_FILE, crd_manifest, crd_yaml, structural

from datalane.spec.recipe import recipe_schema

ROOT = Path(__file__).resolve().parents[2]


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, sub in (schema.get("properties") or {}).items():
        out += walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += walk(schema["items"], f"{path}[]")
    return out


def openapi() -> dict[str, Any]:
    schema: dict[str, Any] = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crd_matches_the_generator() -> None:
    committed = (ROOT / CRD_FILE).read_text()
    assert committed == crd_yaml(), (
        f"{CRD_FILE} is stale: run `make generate`")


def test_schema_is_structural() -> None:
    for path, node in walk(openapi()):
        if path.endswith(".metadata"):
            continue
        assert "type" in node or "anyOf" in node, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        if "pattern" in node:
            assert node["pattern"].startswith("^") and node["pattern"].endswith("$"), path
        if node.get("nullable"):
            assert "enum" not in node, f"{path}: the API server refuses null for an enum"


def test_recipe_schema_has_one_source() -> None:
    recipe = openapi()["properties"]["spec"]["properties"]["recipe"]
    source = structural(recipe_schema())
    lifted = {"lanes", "global_batch_size"}
    assert set(recipe["properties"]) == set(source["properties"]) - lifted
    for name in recipe["properties"]:
        assert recipe["properties"][name] == source["properties"][name], name
    assert not lifted & set(recipe["required"])


def test_status_printer_columns_and_short_name() -> None:
    spec = crd_manifest()["spec"]
    version = spec["versions"][0]
    assert spec["names"]["shortNames"] == ["dp"] and spec["scope"] == "Namespaced"
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Workload", "Lanes", "World", "Ranks", "Step", "Ready", "Reason", "Phase",
                     "Age"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    # `kubectl get dp` shows the Ready condition's status, `-o wide` its reason too
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert "priority" not in columns["Ready"]
    assert columns["Reason"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert columns["Reason"]["priority"] == 1
    rules = openapi()["properties"]["spec"]["x-kubernetes-validations"]
    assert rules[0]["rule"] == "self.globalBatchSize % self.lanes == 0"


def test_every_served_version_has_the_one_schema_and_v1alpha1_is_stored() -> None:
    """v1alpha1 and v1beta1 are one schema under two names: the API server converts between
    them by rewriting apiVersion (conversion None); the storage version stays v1alpha1, what
    the operator reads and what the previous chart's CRD stored."""
    spec = crd_manifest()["spec"]
    versions = spec["versions"]
    assert [(v["name"], v["served"], v["storage"]) for v in versions] == [
        ("v1alpha1", True, True), ("v1beta1", True, False)]
    assert spec["conversion"] == {"strategy": "None"}
    alpha, beta = ({k: v for k, v in version.items() if k not in ("name", "storage")}
                   for version in versions)
    assert alpha == beta
    assert versions[0]["schema"] is not versions[1]["schema"]  # a copy each: no YAML alias


def test_yaml_round_trips() -> None:
    assert yaml.safe_load(crd_yaml()) == crd_manifest()


def test_parallelism_and_the_dp_status_fields() -> None:
    spec = openapi()["properties"]["spec"]
    par = spec["properties"]["parallelism"]
    assert "parallelism" not in spec["required"] and par["default"] == {}
    for name in ("tensor", "pipeline", "context"):
        assert (par["properties"][name]["type"], par["properties"][name]["minimum"],
                par["properties"][name]["default"]) == ("integer", 1, 1), name
    status = openapi()["properties"]["status"]["properties"]
    assert "ranks / (TP x PP x CP)" in status["worldSize"]["description"]
    assert {"ranks", "readersPerDataRank", "ranksPerPod"} <= set(status)
    columns = crd_manifest()["spec"]["versions"][0]["additionalPrinterColumns"]
    ranks = next(c for c in columns if c["name"] == "Ranks")
    assert (ranks["jsonPath"], ranks["priority"]) == (".status.ranks", 1)  # -o wide


def test_rank_processes_is_an_int_or_string_of_a_count_or_auto() -> None:
    node = dict(openapi()["properties"]["spec"]["properties"]["sidecar"]["properties"][
        "rankProcesses"])
    assert node.pop("description").endswith(" An integer or `auto`.")
    # the pattern applies to strings only and the bounds to integers only: 0-256 or "auto"
    assert node == {"anyOf": [{"type": "integer"}, {"type": "string"}],
                    "pattern": "^(?:auto)$", "x-kubernetes-int-or-string": True,
                    "minimum": 0, "maximum": 256, "default": 0}
