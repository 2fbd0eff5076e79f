"""The DataPipeline model: strict loading, the composed recipe, error messages naming fields."""

from __future__ import annotations

import json

import pytest
from datalane_operator.pipeline import compose_recipe, load_pipeline, parse_resources

from datalane.spec.errors import ConfigError
from datalane.spec.recipe import load_recipe

from .builders import RECIPE, dp


def test_loads_and_composes_the_full_recipe() -> None:
    p = load_pipeline(dp(lanes=8, batch=32))
    assert (p.name, p.namespace, p.generation) == ("pretrain", "ml", 1)
    assert p.spec.workload.name == "llama" and p.spec.workload.trainer == "pytorch"
    assert p.spec.checkpoint.keep == 2 and p.spec.checkpoint.secretRef is not None
    assert p.spec.sidecar.socketDir == "/var/run/datalane"
    assert (p.recipe.lanes, p.recipe.global_batch_size, p.recipe.lane_batch) == (8, 32, 4)
    assert p.resources == {"requests": {"cpu": "2", "memory": "4Gi"},
                           "limits": {"memory": "8Gi"}}
    # what the sidecars get is a recipe file that loads to the same recipe
    again = load_recipe(json.loads(p.recipe_json()))
    assert again == p.recipe


def test_defaults_when_sidecar_block_is_absent() -> None:
    body = dp()
    del body["spec"]["sidecar"]
    p = load_pipeline(body)
    assert p.spec.sidecar.image is None and p.spec.sidecar.workers == 2
    assert p.resources == {}


def test_batch_not_multiple_of_lanes_names_both_fields() -> None:
    with pytest.raises(ConfigError) as e:
        load_pipeline(dp(lanes=8, batch=12))
    assert str(e.value) == ("spec.globalBatchSize 12 is not a multiple of spec.lanes 8; "
                            "try 8 or 16")


def test_lifted_fields_are_refused_inside_the_recipe() -> None:
    with pytest.raises(ConfigError, match=r"spec.recipe.lanes is not allowed: set spec.lanes"):
        compose_recipe({"lanes": 8, "globalBatchSize": 16, "recipe": {**RECIPE, "lanes": 8}})


def test_unknown_spec_key_suggests_the_right_one() -> None:
    body = dp()
    body["spec"]["lanse"] = body["spec"].pop("lanes")
    with pytest.raises(ConfigError, match=r"spec.lanse is not a known key; did you mean "
                                          r"'lanes'\?"):
        load_pipeline(body)


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s["recipe"]["sources"][0].update(format="csv"),
     "spec.recipe.sources[0].format 'csv' is not one of 'parquet', 'jsonl'"),
    (lambda s: s["recipe"].update(seq_len=0), "spec.recipe.seq_len 0 must be >= 1"),
    (lambda s: s["recipe"]["sources"][1].update(name="web"),
     "spec.recipe.sources[1].name 'web' is used by another source"),
    (lambda s: s["checkpoint"].update(keep=0), "spec.checkpoint.keep 0 must be >= 1"),
    (lambda s: s["workload"].update(kind="TFJob"),
     "spec.workload.kind 'TFJob' is not one of 'PyTorchJob'"),
    (lambda s: s["sidecar"].update(socketMode="0777"),
     "spec.sidecar.socketMode '0777' is not one of '0600', '0660'"),
    (lambda s: s.update(lanes=True), "spec.lanes must be an integer, got True"),
    (lambda s: s.pop("recipe"), "spec.recipe is required"),
])
def test_bad_values_are_named(change, message) -> None:  # type: ignore[no-untyped-def]
    body = dp()
    change(body["spec"])
    with pytest.raises(ConfigError) as e:
        load_pipeline(body)
    assert message in str(e.value)


def test_resources_are_validated() -> None:
    assert parse_resources({"limits": {"cpu": 2, "nvidia.com/gpu": "0"}}, "r") == {
        "limits": {"cpu": "2", "nvidia.com/gpu": "0"}}
    with pytest.raises(ConfigError, match=r"r.requests.memory '4 GB' is not a quantity"):
        parse_resources({"requests": {"memory": "4 GB"}}, "r")
    with pytest.raises(ConfigError, match=r"r.limit is not a known key"):
        parse_resources({"limit": {}}, "r")


def test_parallelism_defaults_to_pure_data_parallelism() -> None:
    par = load_pipeline(dp()).spec.parallelism
    assert (par.tensor, par.pipeline, par.context) == (1, 1, 1)
    assert (par.model_parallel, par.readers, par.describe()) == (1, 1, "")
    par = load_pipeline(dp(parallelism={"tensor": 2, "pipeline": 4, "context": 3})).spec.parallelism
    assert (par.tensor, par.pipeline, par.context) == (2, 4, 3)
    assert (par.model_parallel, par.readers) == (24, 6)  # TP x PP x CP; TP x CP
    assert par.describe() == "TP 2 x CP 3 x PP 4"


@pytest.mark.parametrize(("value", "message"), [
    ({"tensr": 2}, "spec.parallelism.tensr is not a known key; did you mean 'tensor'?"),
    ({"data": 2}, "spec.parallelism.data is not a known key; known keys: tensor, pipeline, "
                  "context"),
    ({"tensor": 0}, "spec.parallelism.tensor 0 must be >= 1"),
    ({"pipeline": -2}, "spec.parallelism.pipeline -2 must be >= 1"),
    ({"context": "2"}, "spec.parallelism.context must be an integer, got '2'"),
    ([2], "spec.parallelism must be a mapping, got list [2]"),
])
def test_bad_parallelism_is_named(value, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as e:
        load_pipeline(dp(parallelism=value))
    assert message in str(e.value)
