"""The source formats, by name (the names :mod:`datalane.spec.formats` infers).

Each format is a module of its own implementing :class:`~datalane.engine.formats.base.Format`;
this table is the one place the engine looks them up.
"""

from __future__ import annotations

from datalane.engine.formats.base import MISSING, Format, FormatReader
from datalane.engine.formats.jsonl import JSONL
from datalane.engine.formats.parquet import PARQUET

__all__ = ["FORMATS", "MISSING", "Format", "FormatReader", "format_named"]

FORMATS: dict[str, Format] = {
    "jsonl": JSONL,
    "parquet": PARQUET,
}


def format_named(name: str) -> Format:
    return FORMATS[name]
