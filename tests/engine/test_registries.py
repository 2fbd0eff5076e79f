"""The registries of the seams agree with what the recipe accepts and the docs promise.

A format or packer is a module of its own plus one declaration in spec (datalane/spec/formats.py,
datalane/spec/packing.py), a document kind a module plus its ``Source`` field; the engine's
registries are derived from those, and the recipe (which the operator validates without the
engine) names the same set. These tests make a registry that disagrees with the recipe fail by
name; tests/engine runs every registered one through its contract.
"""

from __future__ import annotations

import typing

from datalane.engine.documents import KINDS, kind_name
from datalane.engine.formats import FORMATS
from datalane.engine.packers import PACKERS
from datalane.spec import formats as spec_formats
from datalane.spec.recipe import Packing, Source


def _choices(cls: type, field: str) -> set[str]:
    hint = typing.get_type_hints(cls)[field]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    literal = args[0] if args and typing.get_origin(args[0]) is typing.Literal else hint
    return set(typing.get_args(literal))


def test_every_packer_the_recipe_accepts_is_registered_and_named_by_its_key() -> None:
    assert set(PACKERS) == _choices(Packing, "algorithm")
    for name, cls in PACKERS.items():
        assert cls.name == name, f"packer {cls.__name__} registered as {name!r}"


def test_every_format_the_recipe_accepts_or_infers_is_registered() -> None:
    import dataclasses

    (field,) = [f for f in dataclasses.fields(Source) if f.name == "format"]
    assert set(FORMATS) == set(field.metadata["choices"])
    assert set(spec_formats.FORMAT_BY_EXTENSION.values()) == set(FORMATS)
    for name, fmt in FORMATS.items():
        assert fmt.name == name


def test_every_document_kind_is_a_source_field() -> None:
    fields = set(typing.get_type_hints(Source))
    for name in KINDS:
        assert name in fields, f"kind {name!r} has no Source.{name} configuration field"
    text = Source(name="t", uris=["x"])
    assert kind_name(text) == "text"
