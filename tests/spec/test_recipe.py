"""The recipe model: strict loading from files and mappings, error texts, schema, canonical form.

Every error test asserts the message, because the message is the product: it must name the
dotted field path, the bad value and what would be valid.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from datalane.corpus import DemoCorpus
from datalane.spec import ConfigError, Knobs, Recipe, load_recipe, model, recipe_schema
from datalane.spec.formats import FORMAT_NAMES
from datalane.spec.packing import PACKER_NAMES
from tests.conftest import base_recipe_dict


def minimal(**overrides: Any) -> dict[str, Any]:
    """The smallest valid recipe mapping (no file is touched while loading a recipe)."""
    data: dict[str, Any] = {
        "lanes": 8,
        "global_batch_size": 16,
        "seq_len": 128,
        "tokenizer": {"uri": "/models/tokenizer.json"},
        "sources": [{"name": "web", "uris": ["/data/web/*.parquet"]}],
    }
    data.update(overrides)
    return data


def error_of(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_recipe(data)
    return str(info.value)


# -- loading ------------------------------------------------------------------------------------


def test_yaml_file_json_file_and_mapping_load_the_same_recipe(
        corpus: DemoCorpus, tmp_path: Path, write_recipe: Any) -> None:
    data = base_recipe_dict(corpus)
    from_mapping = load_recipe(data)
    from_yaml = load_recipe(write_recipe())
    json_path = tmp_path / "recipe.json"
    json_path.write_text(json.dumps(data))
    from_json = load_recipe(json_path)  # a PathLike works too

    assert from_yaml == from_mapping
    assert from_json == from_mapping
    assert from_mapping.lanes == 8
    assert from_mapping.global_batch_size == 16
    assert from_mapping.lane_batch == 2
    assert from_mapping.sequence_tokens == 129
    assert [s.name for s in from_mapping.sources] == ["web", "code"]
    assert from_mapping.sources[0].chunk_rows == 50
    assert from_mapping.sources[1].chunk_bytes == 8192
    assert from_mapping.sources[0].weight == pytest.approx(0.7)
    assert from_mapping.shuffle.block_size == 16


def test_yml_extension_and_json_content_in_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yml"
    path.write_text(json.dumps(minimal()))  # JSON is YAML
    assert load_recipe(path) == load_recipe(minimal())


def test_recipe_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    assert error_of(str(missing)) == (
        f"cannot read recipe {missing}: No such file or directory")

    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("lanes: [1, 2\nseq_len: 3\n")
    assert error_of(str(bad_yaml)).startswith(f"recipe {bad_yaml} is not valid YAML: ")

    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"lanes": 8,}')
    assert error_of(str(bad_json)).startswith(f"recipe {bad_json} is not valid JSON: ")

    listed = tmp_path / "list.yaml"
    listed.write_text("- lanes: 8\n")
    assert error_of(str(listed)) == "recipe must be a mapping, got list [{'lanes': 8}]"


def test_yaml_file_errors_carry_field_paths(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(minimal(sources=[{"name": "web", "uris": ["a.jsonl"],
                                                     "wieght": 2}])))
    assert error_of(str(path)) == "sources[0].wieght is not a known key; did you mean 'weight'?"


# -- unknown keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "message"), [
    (minimal(lanse=8),
     "lanse is not a known key; did you mean 'lanes'?"),
    (minimal(global_batch=16),
     "global_batch is not a known key; did you mean 'global_batch_size'?"),
    (minimal(tokenizer={"url": "/t.json"}),
     "tokenizer.url is not a known key; did you mean 'uri'?"),
    (minimal(sources=[{"name": "web", "uris": ["a.jsonl"], "text_feild": "body"}]),
     "sources[0].text_feild is not a known key; did you mean 'text_field'?"),
    (minimal(sources=[{"name": "a", "uris": ["a.jsonl"]},
                      {"name": "b", "uris": ["b.jsonl"], "filters": {"min_char": 3}}]),
     "sources[1].filters.min_char is not a known key; did you mean 'min_chars'?"),
    (minimal(shuffle={"blocksize": 8}),
     "shuffle.blocksize is not a known key; did you mean 'block_size'?"),
])
def test_unknown_key_names_the_path_and_suggests(data: dict[str, Any], message: str) -> None:
    assert error_of(data) == message


def test_unknown_key_without_a_close_match_lists_the_known_keys() -> None:
    assert error_of(minimal(xyzzy=1)) == (
        "xyzzy is not a known key; known keys: lanes, global_batch_size, seq_len, tokenizer, "
        "sources, seed, filters, packing, shuffle, bad_records, bad_records_max_fraction, "
        "eval, phases, version")


def test_knobs_are_not_recipe_keys() -> None:
    message = error_of(minimal(workers=4))
    assert message.startswith("workers is not a known key")


# -- types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "message"), [
    (minimal(lanes="8"), "lanes must be an integer, got '8'"),
    (minimal(lanes=True), "lanes must be an integer, got True"),
    (minimal(seq_len=1.5), "seq_len must be an integer, got 1.5"),
    (minimal(seed=None), "seed must be integer, got null"),
    (minimal(tokenizer="tok.json"), "tokenizer must be a mapping, got str 'tok.json'"),
    (minimal(tokenizer={"uri": 7}), "tokenizer.uri must be a string, got 7"),
    (minimal(tokenizer={"uri": "t", "add_bos": "yes"}),
     "tokenizer.add_bos must be true or false, got 'yes'"),
    (minimal(sources={"name": "web"}),
     "sources must be a list, got dict {'name': 'web'}"),
    (minimal(sources=["web"]), "sources[0] must be a mapping, got str 'web'"),
    (minimal(sources=[{"name": "web", "uris": "a.jsonl"}]),
     "sources[0].uris must be a list, got str 'a.jsonl'"),
    (minimal(sources=[{"name": "web", "uris": ["a.jsonl", 3]}]),
     "sources[0].uris[1] must be a string, got 3"),
    (minimal(sources=[{"name": "web", "uris": ["a"], "weight": "heavy"}]),
     "sources[0].weight must be a number, got 'heavy'"),
    (minimal(sources=[{"name": "web", "uris": ["a"], "format": "no-such-format"}]),
     "sources[0].format 'no-such-format' is not one of "
     + ", ".join(repr(n) for n in FORMAT_NAMES)),
    (minimal(sources=[{"name": "Web Pages", "uris": ["a"]}]),
     "sources[0].name 'Web Pages' does not match the pattern [a-z0-9]([a-z0-9_-]{0,62})?"),
    (minimal(bad_records="ignore"), "bad_records 'ignore' is not one of 'skip', 'fail'"),
    (minimal(packing={"algorithm": "no-such-packer"}),
     "packing.algorithm 'no-such-packer' is not one of "
     + ", ".join(repr(n) for n in PACKER_NAMES)),
    (minimal(tokenizer={"uri": "t", "sha256": "abc"}),
     "tokenizer.sha256 'abc' does not match the pattern [0-9a-f]{64}"),
    (minimal(filters={"predicate": "no_colon"}),
     r"filters.predicate 'no_colon' does not match the pattern [A-Za-z_][\w.]*:[A-Za-z_]\w*"),
])
def test_wrong_type_names_the_path_and_the_value(data: dict[str, Any], message: str) -> None:
    assert error_of(data) == message


@pytest.mark.parametrize(("data", "message"), [
    ({k: v for k, v in minimal().items() if k != "lanes"},
     "lanes is required (Number of logical lanes L, fixed for the life of a run.)"),
    (minimal(sources=[{"uris": ["a"]}]),
     "sources[0].name is required (Unique name of the source (lowercase letters, digits, "
     "'-', '_').)"),
    (minimal(tokenizer={}),
     "tokenizer.uri is required (Path or fsspec URI of a Hugging Face `tokenizer.json`.)"),
])
def test_missing_required_field_is_named(data: dict[str, Any], message: str) -> None:
    assert error_of(data) == message


# -- semantic checks ------------------------------------------------------------------------------


def test_global_batch_not_a_multiple_of_lanes_suggests_neighbours() -> None:
    assert error_of(minimal(global_batch_size=100)) == (
        "global_batch_size 100 is not a multiple of lanes 8; try 96 or 104")
    assert error_of(minimal(global_batch_size=4)) == (
        "global_batch_size 4 is not a multiple of lanes 8; try 8")
    assert error_of(minimal(lanes=3, global_batch_size=10)) == (
        "global_batch_size 10 is not a multiple of lanes 3; try 9 or 12")


def test_batch_multiple_of_lanes_is_accepted() -> None:
    recipe = load_recipe(minimal(lanes=8, global_batch_size=96))
    assert recipe.lane_batch == 12


def test_duplicate_source_names() -> None:
    data = minimal(sources=[{"name": "web", "uris": ["a"]}, {"name": "code", "uris": ["b"]},
                            {"name": "web", "uris": ["c"]}])
    assert error_of(data) == (
        "sources[2].name 'web' is used by another source; names must be unique")


@pytest.mark.parametrize(("data", "message"), [
    (minimal(filters={"min_chars": 10, "max_chars": 5}),
     "filters.min_chars 10 is greater than filters.max_chars 5; no document could pass"),
    (minimal(filters={"min_tokens": 9, "max_tokens": 8}),
     "filters.min_tokens 9 is greater than filters.max_tokens 8; no document could pass"),
    (minimal(sources=[{"name": "web", "uris": ["a"],
                       "filters": {"min_tokens": 100, "max_tokens": 10}}]),
     "sources[0].filters.min_tokens 100 is greater than sources[0].filters.max_tokens 10; "
     "no document could pass"),
])
def test_min_greater_than_max_filters(data: dict[str, Any], message: str) -> None:
    assert error_of(data) == message


def test_equal_min_and_max_filters_are_accepted() -> None:
    recipe = load_recipe(minimal(filters={"min_chars": 5, "max_chars": 5}))
    assert (recipe.filters.min_chars, recipe.filters.max_chars) == (5, 5)


@pytest.mark.parametrize(("data", "message"), [
    (minimal(lanes=0), "lanes 0 must be >= 1"),
    (minimal(lanes=-2), "lanes -2 must be >= 1"),
    (minimal(global_batch_size=0), "global_batch_size 0 must be >= 1"),
    (minimal(seq_len=0), "seq_len 0 must be >= 1"),
    (minimal(seed=-1), "seed -1 must be >= 0"),
    (minimal(version=2), "version 2 must be <= 1"),
    (minimal(sources=[{"name": "web", "uris": ["a"], "weight": 0}]),
     "sources: every source has weight 0 at step 0 (web 0); at least one needs a positive "
     "weight"),
    (minimal(sources=[{"name": "web", "uris": ["a"], "weight": -0.5}]),
     "sources[0].weight -0.5 must be >= 0"),
    (minimal(sources=[{"name": "web", "uris": ["a"], "epochs": 0}]),
     "sources[0].epochs 0 must be >= 1"),
    (minimal(sources=[{"name": "web", "uris": ["a"], "chunk_bytes": 0}]),
     "sources[0].chunk_bytes 0 must be >= 1"),
    (minimal(sources=[{"name": "web", "uris": ["a"], "chunk_rows": 0}]),
     "sources[0].chunk_rows 0 must be >= 1"),
    (minimal(sources=[{"name": "web", "uris": []}]),
     "sources[0].uris needs at least 1 item(s), got 0"),
    (minimal(sources=[]), "sources needs at least 1 item(s), got 0"),
    (minimal(filters={"max_chars": 0}), "filters.max_chars 0 must be >= 1"),
    (minimal(shuffle={"block_size": 0}), "shuffle.block_size 0 must be >= 1"),
    (minimal(packing={"bestfit_bins": 65}), "packing.bestfit_bins 65 must be <= 64"),
])
def test_bounds(data: dict[str, Any], message: str) -> None:
    assert error_of(data) == message


@pytest.mark.parametrize(("data", "message"), [
    (minimal(seq_len=2**20 + 1, global_batch_size=8),
     "seq_len 1048577 is above the limit of 1,048,576 tokens"),
    (minimal(seq_len=10**12, global_batch_size=8),
     "seq_len 1000000000000 is above the limit of 1,048,576 tokens"),
    (minimal(global_batch_size=2**20 + 8, seq_len=1),
     "global_batch_size 1048584 is above the limit of 1,048,576 sequences"),
    (minimal(global_batch_size=1024, seq_len=2**20),
     "global_batch_size 1024 x (seq_len 1048576 + 1) = 1,073,742,848 tokens per step is above "
     "the limit of 1,073,741,824; use a smaller batch or sequence length"),
    (minimal(global_batch_size=2**20, seq_len=1024),
     "global_batch_size 1048576 x (seq_len 1024 + 1) = 1,074,790,400 tokens per step is above "
     "the limit of 1,073,741,824; use a smaller batch or sequence length"),
])
def test_upper_bounds_of_sizes(data: dict[str, Any], message: str) -> None:
    """Sizes past their bounds are refused at load (numpy raised MemoryError, or ran for
    minutes, on the first step)."""
    assert error_of(data) == message


def test_the_largest_sizes_within_the_bounds_load() -> None:
    assert load_recipe(minimal(lanes=1, global_batch_size=1023, seq_len=2**20)).seq_len == 2**20
    recipe = load_recipe(minimal(global_batch_size=2**20, seq_len=1023))
    assert recipe.global_batch_size * recipe.sequence_tokens == 2**30


@pytest.mark.parametrize("weight", [math.nan, math.inf, -math.inf])
def test_non_finite_weight_is_rejected(weight: float) -> None:
    # NaN compares false with every bound, and NaN/Infinity are not JSON: the canonical form
    # (and so the fingerprint) would be invalid.
    data = minimal(sources=[{"name": "web", "uris": ["a"], "weight": weight}])
    assert error_of(data) == f"sources[0].weight must be a finite number, got {weight!r}"


def test_non_finite_weight_from_yaml_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(minimal()).replace(
        "name: web", "name: web\n  weight: .nan"))
    assert error_of(str(path)) == "sources[0].weight must be a finite number, got nan"


def test_null_is_accepted_only_for_optional_fields() -> None:
    recipe = load_recipe(minimal(sources=[{"name": "web", "uris": ["a.jsonl"], "epochs": None,
                                           "format": None, "filters": None}]))
    assert recipe.sources[0].epochs is None
    assert recipe.filters_for(recipe.sources[0]) == recipe.filters
    assert error_of(minimal(sources=[{"name": "web", "uris": ["a"], "weight": None}])) == (
        "sources[0].weight must be number, got null")


def test_source_filters_replace_the_recipe_filters() -> None:
    recipe = load_recipe(minimal(filters={"min_chars": 3}, sources=[
        {"name": "a", "uris": ["a"]},
        {"name": "b", "uris": ["b"], "filters": {"max_tokens": 50}}]))
    assert recipe.filters_for(recipe.sources[0]).min_chars == 3
    own = recipe.filters_for(recipe.sources[1])
    assert (own.min_chars, own.max_tokens) == (0, 50)


# -- relative paths -------------------------------------------------------------------------------


def test_relative_paths_resolve_against_the_recipe_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "project" / "recipes"
    folder.mkdir(parents=True)
    data = minimal(
        tokenizer={"uri": "tok/tokenizer.json"},
        sources=[{"name": "local", "uris": ["data/*.jsonl", "../shared/b.parquet",
                                            "/abs/c.jsonl", "s3://bucket/web/*.parquet",
                                            "file:///abs/d.jsonl"]}])
    (folder / "recipe.yaml").write_text(yaml.safe_dump(data))
    (folder / "recipe.json").write_text(json.dumps(data))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory must not matter

    for name in ("recipe.yaml", "recipe.json"):
        recipe = load_recipe(os.path.relpath(folder / name))
        assert recipe.tokenizer.uri == str(folder / "tok" / "tokenizer.json")
        assert recipe.sources[0].uris == [
            str(folder / "data" / "*.jsonl"),
            str(tmp_path / "project" / "shared" / "b.parquet"),
            "/abs/c.jsonl",
            "s3://bucket/web/*.parquet",
            "file:///abs/d.jsonl",
        ]


# -- schema ---------------------------------------------------------------------------------------


def _objects(schema: dict[str, Any], path: str = "recipe") -> list[tuple[str, dict[str, Any]]]:
    """Every object schema in ``schema`` with its dotted path."""
    found: list[tuple[str, dict[str, Any]]] = []
    if schema.get("type") == "object" and "properties" not in schema:  # a map: name -> value
        found.extend(_objects(schema["additionalProperties"], f"{path}.*"))
    elif schema.get("type") == "object":
        found.append((path, schema))
        for name, sub in schema["properties"].items():
            found.extend(_objects(sub, f"{path}.{name}"))
    elif schema.get("type") == "array":
        found.extend(_objects(schema["items"], f"{path}[]"))
    return found


def test_schema_is_strict_and_describes_every_field() -> None:
    schema = recipe_schema()
    json.dumps(schema)  # plain JSON, ready for a CRD
    objects = dict(_objects(schema))
    assert set(objects) == {"recipe", "recipe.tokenizer", "recipe.sources[]",
                            "recipe.sources[].filters", "recipe.sources[].chat",
                            "recipe.sources[].tokens", "recipe.sources[].vision",
                            "recipe.sources[].vision.resize", "recipe.sources[].vision.limits",
                            "recipe.sources[].vision.augment",
                            "recipe.sources[].interleaved",
                            "recipe.sources[].interleaved.resize",
                            "recipe.sources[].interleaved.limits",
                            "recipe.sources[].interleaved.augment",
                            "recipe.sources[].llava", "recipe.sources[].llava.resize",
                            "recipe.sources[].llava.limits", "recipe.sources[].llava.augment",
                            "recipe.filters", "recipe.packing", "recipe.shuffle",
                            "recipe.eval[]", "recipe.eval[].sources[]",
                            "recipe.eval[].sources[].filters", "recipe.eval[].sources[].chat",
                            "recipe.eval[].sources[].tokens", "recipe.eval[].sources[].vision",
                            "recipe.eval[].sources[].vision.resize",
                            "recipe.eval[].sources[].vision.limits",
                            "recipe.eval[].sources[].vision.augment",
                            "recipe.eval[].sources[].interleaved",
                            "recipe.eval[].sources[].interleaved.resize",
                            "recipe.eval[].sources[].interleaved.limits",
                            "recipe.eval[].sources[].interleaved.augment",
                            "recipe.eval[].sources[].llava",
                            "recipe.eval[].sources[].llava.resize",
                            "recipe.eval[].sources[].llava.limits",
                            "recipe.eval[].sources[].llava.augment", "recipe.phases[]"}
    for path, obj in objects.items():
        assert obj["additionalProperties"] is False, path
        assert obj["description"].strip(), path
        for name, prop in obj["properties"].items():
            assert isinstance(prop.get("description"), str), f"{path}.{name}"
            assert prop["description"].strip(), f"{path}.{name}"
            assert "type" in prop, f"{path}.{name}"


def test_schema_types_bounds_enums_and_required() -> None:
    schema = recipe_schema()
    props = schema["properties"]
    assert schema["required"] == ["lanes", "global_batch_size", "seq_len", "tokenizer",
                                  "sources"]
    assert props["lanes"] == {"type": "integer", "minimum": 1,
                              "description": "Number of logical lanes L, fixed for the life "
                                             "of a run."}
    assert props["bad_records"]["enum"] == ["skip", "fail"]
    assert props["bad_records"]["default"] == "skip"
    assert props["packing"]["properties"]["algorithm"]["enum"] == list(PACKER_NAMES)
    assert props["packing"]["properties"]["bestfit_bins"]["maximum"] == 64
    assert props["sources"]["type"] == "array"
    assert props["sources"]["minItems"] == 1
    source = props["sources"]["items"]
    assert source["required"] == ["name", "uris"]
    assert source["properties"]["weight"]["minimum"] == 0
    assert "exclusiveMinimum" not in source["properties"]["weight"]  # 0: off until a phase
    assert source["properties"]["format"]["enum"] == list(FORMAT_NAMES)
    assert source["properties"]["format"]["nullable"] is True
    assert source["properties"]["filters"]["nullable"] is True
    assert source["properties"]["uris"] == {
        "type": "array", "items": {"type": "string"}, "minItems": 1,
        "description": source["properties"]["uris"]["description"]}
    assert re.fullmatch(source["properties"]["name"]["pattern"], "web-2")
    assert props["tokenizer"]["properties"]["sha256"]["pattern"] == "[0-9a-f]{64}"


def test_schema_defaults_agree_with_the_loaded_defaults() -> None:
    schema = recipe_schema()
    canonical = load_recipe(minimal()).to_dict()

    def check(obj_schema: dict[str, Any], value: dict[str, Any], path: str) -> int:
        n = 0
        for name, prop in obj_schema["properties"].items():
            if "default" in prop:
                assert value[name] == prop["default"], f"{path}.{name}"
                n += 1
            if prop.get("type") == "object" and isinstance(value.get(name), dict):
                n += check(prop, value[name], f"{path}.{name}")
        return n

    checked = check(schema, canonical, "recipe")
    checked += check(schema["properties"]["sources"]["items"], canonical["sources"][0],
                     "sources[0]")
    assert checked >= 15


def test_fields_added_later_stay_out_of_the_canonical_form_at_their_default() -> None:
    """A plain-text source has no ``chat`` key in the canonical form, so the fingerprint of
    every recipe written before chat existed is unchanged (their checkpoints still load)."""
    text = load_recipe(minimal()).to_dict()
    assert "chat" not in text["sources"][0]
    data = minimal()
    data["sources"][0]["chat"] = {"train_on": "all"}
    chat = load_recipe(data).to_dict()["sources"][0]["chat"]
    assert chat["train_on"] == "all" and chat["messages_field"] == "messages"


# -- canonical form -------------------------------------------------------------------------------


def test_to_dict_is_canonical_and_includes_every_default() -> None:
    assert load_recipe(minimal()).to_dict() == {
        "lanes": 8,
        "global_batch_size": 16,
        "seq_len": 128,
        "tokenizer": {"uri": "/models/tokenizer.json", "sha256": None, "add_bos": False,
                      "add_eos": True, "bos_token": "<|bos|>", "eos_token": "<|eos|>",
                      "pad_token": None},
        "sources": [{"name": "web", "uris": ["/data/web/*.parquet"], "format": None,
                     "text_field": "text", "weight": 1.0, "epochs": 1,
                     "chunk_bytes": 1048576, "chunk_rows": None, "filters": None}],
        "seed": 0,
        "filters": {"min_chars": 0, "max_chars": None, "min_tokens": 0, "max_tokens": None,
                    "predicate": None},
        "packing": {"algorithm": "wrap", "bestfit_bins": 8},
        "shuffle": {"block_size": 1024},
        "bad_records": "skip",
        "version": 1,
    }


def test_canonical_form_round_trips_and_ignores_spelling(corpus: DemoCorpus) -> None:
    recipe = load_recipe(base_recipe_dict(corpus))
    assert load_recipe(recipe.to_dict()) == recipe
    # Writing a default explicitly, or an integer weight as a float, is the same recipe.
    spelled = minimal(seed=0, sources=[{"name": "web", "uris": ["/data/web/*.parquet"],
                                        "weight": 1, "epochs": 1}])
    assert load_recipe(spelled).canonical_json() == load_recipe(minimal()).canonical_json()
    assert load_recipe(minimal(seed=1)).canonical_json() != load_recipe(
        minimal()).canonical_json()
    text = load_recipe(minimal()).canonical_json()
    assert json.loads(text) == load_recipe(minimal()).to_dict()
    assert " " not in text.replace("/data/web/*.parquet", "")


def test_recipe_is_immutable() -> None:
    recipe = load_recipe(minimal())
    with pytest.raises(AttributeError):
        recipe.lanes = 4  # type: ignore[misc]
    assert isinstance(recipe, Recipe)


# -- knobs ----------------------------------------------------------------------------------------


def test_knobs_defaults_and_valid_values() -> None:
    assert model.load(Knobs, {}, "knobs") == Knobs(workers=2, prefetch=8, task_docs=256)
    assert model.load(Knobs, {"workers": 256, "prefetch": 1, "task_docs": 65536}) == Knobs(
        workers=256, prefetch=1, task_docs=65536)


@pytest.mark.parametrize(("data", "message"), [
    ({"workers": 0}, "knobs.workers 0 must be >= 1"),
    ({"workers": 257}, "knobs.workers 257 must be <= 256"),
    ({"workers": "4"}, "knobs.workers must be an integer, got '4'"),
    ({"workers": 2.0}, "knobs.workers must be an integer, got 2.0"),
    ({"prefetch": 0}, "knobs.prefetch 0 must be >= 1"),
    ({"prefetch": 2048}, "knobs.prefetch 2048 must be <= 1024"),
    ({"image_bytes": 0}, "knobs.image_bytes 0 must be >= 1"),
    ({"task_docs": None}, "knobs.task_docs must be integer, got null"),
    ({"worker": 4}, "knobs.worker is not a known key; did you mean 'workers'?"),
    ({"map_processes": -1}, "knobs.map_processes -1 must be >= 0"),
    ({"map_processes": 257}, "knobs.map_processes 257 must be <= 256"),
    ({"map_processes": True}, "knobs.map_processes must be an integer, got True"),
    ({"seed": 4}, "knobs.seed is not a known key; known keys: workers, map_processes, "
     "prefetch, task_docs, image_bytes"),
])
def test_knobs_reject_bad_values(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        model.load(Knobs, data, "knobs")
    assert str(info.value) == message


def test_knobs_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError) as info:
        model.load(Knobs, [("workers", 2)], "knobs")
    assert str(info.value) == "knobs must be a mapping, got list [('workers', 2)]"
