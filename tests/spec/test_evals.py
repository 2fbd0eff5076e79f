"""Eval streams in the recipe model (datalane.spec.evals): loading, errors, eval_recipe.

Every error test asserts the message: it names the dotted field path, the bad value and what
would be valid (or, for an unknown stream, every stream the recipe has).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from datalane.spec import ConfigError, Recipe, load_recipe
from datalane.spec.evals import (
    INHERITED,
    NAME_PATTERN,
    EvalStream,
    eval_recipe,
    stream_names,
    training_view,
)
from datalane.spec.recipe import _NAME
from tests.spec.test_recipe import error_of


def minimal(**overrides: Any) -> dict[str, Any]:
    """A valid recipe mapping with one eval stream (no file is touched while loading)."""
    data: dict[str, Any] = {
        "lanes": 4,
        "global_batch_size": 8,
        "seq_len": 64,
        "seed": 3,
        "tokenizer": {"uri": "/models/tokenizer.json"},
        "sources": [{"name": "web", "uris": ["/data/web/*.parquet"], "weight": 0.7},
                    {"name": "code", "uris": ["/data/code/*.jsonl"], "weight": 0.3}],
        "packing": {"algorithm": "bestfit", "bestfit_bins": 4},
        "shuffle": {"block_size": 8},
        "filters": {"min_chars": 5},
        "bad_records": "fail",
        "eval": [{"name": "heldout", "steps": 3,
                  "sources": [{"name": "val", "uris": ["/data/val/*.jsonl"]}]}],
    }
    data.update(overrides)
    return data


def stream(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "heldout", "steps": 3,
                           "sources": [{"name": "val", "uris": ["/data/val/*.jsonl"]}]}
    out.update(fields)
    return out


def test_an_eval_stream_loads_with_the_recipe_s_batch_and_seed_by_default() -> None:
    recipe = load_recipe(minimal())
    (s,) = recipe.eval
    assert s == EvalStream(name="heldout", sources=[s.sources[0]], steps=3)
    assert (s.global_batch_size, s.seed) == (None, None)
    assert s.sources[0].name == "val" and s.sources[0].uris == ["/data/val/*.jsonl"]
    assert stream_names(recipe) == ["train", "heldout"]


def test_eval_recipe_is_the_stream_s_sources_with_everything_else_the_recipe_s() -> None:
    recipe = load_recipe(minimal())
    r = eval_recipe(recipe, "heldout")
    assert [s.name for s in r.sources] == ["val"]
    assert r.sources == recipe.eval[0].sources
    assert (r.global_batch_size, r.seed) == (8, 3)  # the recipe's
    for name in INHERITED:
        assert getattr(r, name) == getattr(recipe, name), name
    assert r.packing.algorithm == "bestfit" and r.filters.min_chars == 5
    assert r.eval == []  # a plain recipe: no streams of its own
    assert "eval" not in r.to_dict()


def test_eval_recipe_takes_the_stream_s_own_batch_and_seed() -> None:
    recipe = load_recipe(minimal(eval=[stream(global_batch_size=12, seed=9)]))
    r = eval_recipe(recipe, "heldout")
    assert (r.global_batch_size, r.lane_batch, r.seed) == (12, 3, 9)
    assert (r.lanes, r.seq_len) == (4, 64)


def test_every_recipe_field_is_inherited_given_by_the_stream_or_about_training_only() -> None:
    # a field added to Recipe later must be decided on here: an eval stream takes it from
    # the recipe (INHERITED), from the stream, or leaves it at its default (training only)
    names = {f.name for f in dataclasses.fields(Recipe)}
    by_stream = {"sources", "global_batch_size", "seed"}
    assert set(INHERITED) | by_stream <= names
    assert names - set(INHERITED) - by_stream <= {"eval", "phases"}
    r = eval_recipe(load_recipe(minimal()), "heldout")
    if "phases" in names:
        assert not r.phases  # a schedule is the training run's course


def test_unknown_stream_names_it_and_lists_the_recipe_s_streams() -> None:
    recipe = load_recipe(minimal(eval=[stream(), stream(name="math")]))
    with pytest.raises(ConfigError) as info:
        eval_recipe(recipe, "evl")
    assert str(info.value) == ("no eval stream is named 'evl'; the recipe's streams are "
                               "'train', 'heldout', 'math'")
    with pytest.raises(ConfigError) as info:
        eval_recipe(recipe, "train")
    assert str(info.value) == ("'train' is the training stream, not an eval stream; the "
                               "recipe's streams are 'train', 'heldout', 'math'")
    with pytest.raises(ConfigError) as info:
        eval_recipe(load_recipe(minimal(eval=[])), "heldout")
    assert str(info.value) == ("no eval stream is named 'heldout'; the recipe has only the "
                               "'train' stream (no `eval:` streams)")


def test_train_is_not_an_eval_stream_name() -> None:
    assert error_of(minimal(eval=[stream(name="train")])) == (
        "eval[0].name 'train' names the training stream; give the eval stream another name")


def test_eval_stream_names_are_unique_and_follow_the_source_name_pattern() -> None:
    assert NAME_PATTERN == _NAME
    assert error_of(minimal(eval=[stream(), stream(steps=5)])) == (
        "eval[1].name 'heldout' is used by another eval stream; names must be unique")
    assert error_of(minimal(eval=[stream(name="Held Out")])) == (
        f"eval[0].name 'Held Out' does not match the pattern {_NAME}")


def test_eval_steps_and_batch_are_checked_naming_the_field() -> None:
    assert error_of(minimal(eval=[stream(steps=0)])) == "eval[0].steps 0 must be >= 1"
    assert error_of(minimal(eval=[{"name": "x", "sources": stream()["sources"]}])) == (
        "eval[0].steps is required (Steps (global batches) of every evaluation: exactly this "
        "many, padded with `ended` set once the stream's data runs out.)")
    assert error_of(minimal(eval=[stream(global_batch_size=10)])) == (
        "eval[0].global_batch_size 10 is not a multiple of lanes 4; try 8 or 12")
    assert error_of(minimal(eval=[stream(seed=-1)])) == "eval[0].seed -1 must be >= 0"


def test_eval_sources_are_validated_as_the_recipe_s_sources() -> None:
    two = [{"name": "val", "uris": ["/a.jsonl"]}, {"name": "val", "uris": ["/b.jsonl"]}]
    assert error_of(minimal(eval=[stream(sources=two)])) == (
        "eval[0].sources[1].name 'val' is used by another source; names must be unique")
    assert error_of(minimal(eval=[stream(sources=[])])) == (
        "eval[0].sources needs at least 1 item(s), got 0")
    assert error_of(minimal(eval=[stream(sources=[{"name": "v", "uris": ["/d/x.bin"],
                                                   "format": "flatbin"}])])) == (
        "eval[0].sources[0]: flatbin files hold token ids, not text; set "
        "eval[0].sources[0].tokens (for example `tokens: {}`) to read them")
    # a training source may be an eval source too: the user's choice
    same = minimal(eval=[stream(sources=[{"name": "web", "uris": ["/data/web/*.parquet"]}])])
    assert load_recipe(same).eval[0].sources[0].name == "web"


def test_a_recipe_without_eval_streams_keeps_its_canonical_form() -> None:
    recipe = load_recipe(minimal(eval=[]))
    assert recipe.eval == []
    assert "eval" not in recipe.to_dict()  # golden hashes and fingerprints stay
    assert "eval" not in load_recipe({k: v for k, v in minimal().items()
                                      if k != "eval"}).to_dict()


def test_training_view_drops_only_the_eval_streams() -> None:
    recipe = load_recipe(minimal())
    assert "eval" in recipe.to_dict()
    view = training_view(recipe)
    assert view.eval == []
    assert view.to_dict() == load_recipe({k: v for k, v in minimal().items()
                                          if k != "eval"}).to_dict()


def test_relative_eval_source_paths_are_relative_to_the_recipe_file(tmp_path: Path) -> None:
    data = minimal(eval=[stream(sources=[{"name": "val", "uris": ["val/*.jsonl"]}])])
    path = tmp_path / "sub" / "recipe.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    assert recipe.eval[0].sources[0].uris == [str(tmp_path / "sub" / "val" / "*.jsonl")]
    assert eval_recipe(recipe, "heldout").sources[0].uris == recipe.eval[0].sources[0].uris
