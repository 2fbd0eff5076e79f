"""The source formats, by name: the implementations of the formats
:data:`datalane.spec.formats.DECLARED` declares.

Each format is a module of its own implementing :class:`~datalane.engine.formats.base.Format`
(a :class:`~datalane.engine.formats.base.FormatBase`); this registry is built from the
declarations, each implementation loaded from the path its declaration names
(``datalane.engine.formats.<name>:<NAME>`` unless it says otherwise), so it is the one place
the engine looks formats up and never a second table to keep in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from datalane.engine.formats.base import MISSING, Format, FormatBase, FormatReader
from datalane.engine.seams import load_declared
from datalane.spec.errors import ConfigError
from datalane.spec.formats import DECLARED, FormatSpec
from datalane.spec.recipe import part_formats

if TYPE_CHECKING:
    from datalane.spec.recipe import Source

__all__ = ["FORMATS", "MISSING", "Format", "FormatReader", "format_for", "format_named",
           "implementation"]


def implementation(spec: FormatSpec) -> Format:
    """The engine's implementation of the declared format ``spec``; ImportError naming the
    declaration and what is missing when there is none."""
    fmt: Format = load_declared("format", spec.name, "datalane.spec.formats", spec.engine_path,
                                FormatBase)
    return fmt


#: Format name -> the engine's implementation (the spec's extension table is
#: :data:`datalane.spec.formats.FORMAT_BY_EXTENSION`).
FORMATS: dict[str, Format] = {spec.name: implementation(spec) for spec in DECLARED}


def format_named(name: str) -> Format:
    return FORMATS[name]


def format_for(name: str, source: Source | None) -> Format:
    """The format ``name`` as ``source`` reads it (:meth:`Format.for_source`: a configured
    copy, or ConfigError when the source cannot read it at all: a kind that reads a record's
    parts together, vision, from a format that does not declare ``parts``)."""
    fmt = FORMATS[name]
    if source is None:
        return fmt
    can = part_formats(source.kind_config)
    if name not in can and hasattr(source.kind_config, "document_parts"):
        raise ConfigError(f"source {source.name!r}: a {source.kind_field} document is read "
                          f"from several fields of a record at once, which the {name} format "
                          f"does not do; use {' or '.join(sorted(can))} files")
    return fmt.for_source(source)
