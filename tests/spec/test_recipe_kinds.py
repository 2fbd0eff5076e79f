"""A recipe's values are frozen all the way down, and its sources' kinds are checked against
their formats and the packer (spec/recipe.py: ``Source.validate``, ``Recipe.validate``).

Every refusal is asserted by its whole message: it names the field, the format or packer that
cannot serve the kind, and what would.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from datalane.spec import load_recipe
from datalane.spec.phases import Schedule
from datalane.spec.recipe import Source, document_kinds, part_formats
from tests.spec.test_recipe import error_of, minimal


def source(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "img", "uris": ["/data/img/a.parquet"]}
    out.update(fields)
    return out


BESTFIT = {"algorithm": "bestfit"}


# -- frozen values ------------------------------------------------------------------------------


def test_every_part_of_a_loaded_recipe_is_frozen() -> None:
    """A recipe is a value: the fingerprint of a run is computed once from it, so no part of
    it (a source, its filters, an eval stream, a phase, the schedule built from them) may be
    changed after loading."""
    recipe = load_recipe(minimal(
        sources=[{"name": "web", "uris": ["/d/a.jsonl"], "filters": {"min_chars": 2}}],
        eval=[{"name": "heldout", "steps": 1, "sources": [{"name": "v", "uris": ["/v.jsonl"]}]}],
        phases=[{"name": "late", "start_step": 3, "weights": {"web": 2.0}, "ramp_steps": 2}]))
    schedule = Schedule.of(recipe)
    parts: dict[str, object] = {
        "recipe": recipe, "tokenizer": recipe.tokenizer, "filters": recipe.filters,
        "packing": recipe.packing, "shuffle": recipe.shuffle, "source": recipe.sources[0],
        "source filters": recipe.sources[0].filters, "eval stream": recipe.eval[0],
        "phase": recipe.phases[0], "schedule": schedule, "segment": schedule.segments[0]}
    for what, value in parts.items():
        name = dataclasses.fields(value)[0].name  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
        assert getattr(value, name) is not None, what


# -- document kinds -----------------------------------------------------------------------------


def test_the_document_kinds_are_the_source_fields_that_configure_one() -> None:
    assert document_kinds() == ("chat", "tokens", "vision", "interleaved", "llava")


def test_a_sources_kind_field_and_document_field() -> None:
    text = load_recipe(minimal(sources=[source(text_field="body")])).sources[0]
    assert (text.kind_config, text.kind_field, text.field) == (None, "text", "body")
    chat = load_recipe(minimal(sources=[source(chat={})])).sources[0]
    assert chat.kind_config is chat.chat
    assert (chat.kind_field, chat.field) == ("chat", "messages")
    vision = load_recipe(minimal(packing=BESTFIT, sources=[source(vision={})])).sources[0]
    assert vision.kind_config is vision.vision and vision.kind_field == "vision"


def test_the_formats_that_read_a_kinds_parts() -> None:
    """A kind that names its formats (llava: JSON) is read only by them; the others by every
    format that declares parts."""
    recipe = load_recipe(minimal(packing=BESTFIT, sources=[
        source(name="v", vision={}), source(name="l", uris=["/d/a.jsonl"], llava={})]))
    assert part_formats(recipe.sources[0].vision) == frozenset({"hf", "parquet", "webdataset"})
    assert part_formats(recipe.sources[1].llava) == frozenset({"jsonl"})


@pytest.mark.parametrize(("fields", "message"), [
    ({"uris": ["/d/a.jsonl"], "vision": {}},
     "sources[0].vision: a vision document is read from several fields of a record at once, "
     "which the jsonl format does not do; use hf or parquet or webdataset files"),
    ({"uris": ["/d/a.parquet"], "format": "mds", "vision": {}},  # the format named wins
     "sources[0].vision: a vision document is read from several fields of a record at once, "
     "which the mds format does not do; use hf or parquet or webdataset files"),
    ({"uris": ["/d/a.tar"], "llava": {}},
     "sources[0].llava: a llava document is read from several fields of a record at once, "
     "which the webdataset format does not do; use jsonl files"),
    # the first format (by name) of the files that cannot; files of no known extension
    # (format None) are left to the reader
    ({"uris": ["/d/a.tar", "/d/c.mds", "/d/x.unknown", "/d/b.jsonl"], "interleaved": {}},
     "sources[0].interleaved: an interleaved document is read from several fields of a record "
     "at once, which the jsonl format does not do; use hf or parquet files"),
])
def test_a_kind_read_from_several_fields_needs_a_format_that_reads_parts(
        fields: dict[str, Any], message: str) -> None:
    assert error_of(minimal(packing=BESTFIT, sources=[source(**fields)])) == message


def test_a_kind_with_parts_loads_from_the_formats_that_read_them() -> None:
    for fields in ({"uris": ["/d/a.parquet", "/d/b.tar", "/d/c.arrow", "/d/x.unknown"],
                    "vision": {}},
                   {"uris": ["/d/a.jsonl"], "llava": {}},
                   {"uris": ["/d/a.jsonl"], "format": "hf", "interleaved": {}}):
        recipe = load_recipe(minimal(packing=BESTFIT, sources=[source(**fields)]))
        assert recipe.sources[0].kind_config is not None


@pytest.mark.parametrize(("fields", "message"), [
    ({"uris": ["/d/a.u16", "/d/b.idx"]},  # the first token format by name
     "sources[0]: flatbin files hold token ids, not text; set sources[0].tokens (for example "
     "`tokens: {}`) to read them"),
    ({"uris": ["/d/a.jsonl", "/d/b.idx"]},
     "sources[0]: megatron files hold token ids, not text; set sources[0].tokens (for example "
     "`tokens: {}`) to read them"),
    ({"uris": ["/d/a.jsonl"], "format": "megatron"},
     "sources[0]: megatron files hold token ids, not text; set sources[0].tokens (for example "
     "`tokens: {}`) to read them"),
    ({"uris": ["/d/a.idx"], "chat": {}},  # another kind is not a tokens configuration
     "sources[0]: megatron files hold token ids, not text; set sources[0].tokens (for example "
     "`tokens: {}`) to read them"),
])
def test_token_id_files_need_the_tokens_kind(fields: dict[str, Any], message: str) -> None:
    assert error_of(minimal(sources=[source(**fields)])) == message


def test_a_source_validated_alone_names_itself_source() -> None:
    with pytest.raises(Exception) as info:
        Source(name="t", uris=["/d/a.idx"]).validate("")
    assert str(info.value) == ("source: megatron files hold token ids, not text; set tokens "
                               "(for example `tokens: {}`) to read them")


@pytest.mark.parametrize("kind", ["vision", "interleaved"])
def test_a_kind_of_whole_documents_needs_a_packer_that_never_splits_them(kind: str) -> None:
    data = minimal(sources=[source(name="web", uris=["/d/w.jsonl"]), source(**{kind: {}})])
    assert error_of(data) == (
        f"sources[1].{kind}: its documents must never be split across sequences, but "
        f"packing.algorithm 'wrap' cuts documents anywhere; use 'bestfit'")
    assert error_of({**data, "eval": [{"name": "e", "steps": 1, "sources": [source(
        **{kind: {}})]}]}).startswith(f"sources[1].{kind}: its documents")
    assert load_recipe({**data, "packing": BESTFIT}).packing.algorithm == "bestfit"


def test_an_eval_stream_of_whole_documents_is_checked_with_the_recipes_packer() -> None:
    """The refusal names the recipe's own packing.algorithm, which the stream inherits (an
    eval stream has no packing of its own to set)."""
    data = minimal(eval=[{"name": "e", "steps": 1, "sources": [source(vision={})]}])
    assert error_of(data) == (
        "eval[0].sources[0].vision: its documents must never be split across sequences, but "
        "packing.algorithm 'wrap' cuts documents anywhere; use 'bestfit'")


def test_an_eval_streams_step_limit_names_its_batch_and_the_recipes_seq_len() -> None:
    data = minimal(seq_len=1 << 20, global_batch_size=1, lanes=1,
                   eval=[{"name": "e", "steps": 1, "global_batch_size": 1024,
                          "sources": [source()]}])
    assert error_of(data) == (
        "eval[0].global_batch_size 1024 x (seq_len 1048576 + 1) = 1,073,742,848 tokens per "
        "step is above the limit of 1,073,741,824; use a smaller batch or sequence length")


def test_a_kinds_own_files_are_relative_to_the_recipe_file(tmp_path: Path) -> None:
    """A chat source's template and tokenizer config, like its uris, are read relative to the
    recipe file's folder (absolute paths and URIs as written), in the eval streams too."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    data = minimal(
        sources=[source(uris=["a.jsonl"], chat={"template": "t/chat.jinja"}),
                 source(name="plain", uris=["b.jsonl"])],
        eval=[{"name": "e", "steps": 1, "sources": [
            source(uris=["s3://b/v.jsonl"], chat={"tokenizer_config": "../tc.json"}),
            source(name="abs", uris=["/v.jsonl"], chat={"template": "/t/abs.jinja"})]}])
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    chat = recipe.sources[0].chat
    assert chat is not None and chat.template == str(folder / "t" / "chat.jinja")
    assert recipe.sources[0].uris == [str(folder / "a.jsonl")]
    assert recipe.sources[1].uris == [str(folder / "b.jsonl")] and recipe.sources[1].chat is None
    held = [s.chat for s in recipe.eval[0].sources]
    assert held[0] is not None and held[0].tokenizer_config == str(tmp_path / "tc.json")
    assert held[0].template is None and recipe.eval[0].sources[0].uris == ["s3://b/v.jsonl"]
    assert held[1] is not None and held[1].template == "/t/abs.jinja"
    mapped = load_recipe(data).sources[0]  # a mapping has no file: paths stay as written
    assert mapped.uris == ["a.jsonl"] and mapped.chat is not None
    assert mapped.chat.template == "t/chat.jinja"
