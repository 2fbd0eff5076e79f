"""The source formats, by name (the names :mod:`datalane.spec.formats` infers).

Each format is a module of its own implementing :class:`~datalane.engine.formats.base.Format`;
this table is the one place the engine looks them up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from datalane.engine.formats.base import MISSING, Format, FormatReader
from datalane.engine.formats.flatbin import FLATBIN
from datalane.engine.formats.hf import HF
from datalane.engine.formats.jsonl import JSONL
from datalane.engine.formats.lance import LANCE
from datalane.engine.formats.mds import MDS
from datalane.engine.formats.megatron import MEGATRON
from datalane.engine.formats.parquet import PARQUET
from datalane.engine.formats.webdataset import WEBDATASET

if TYPE_CHECKING:
    from datalane.spec.recipe import Source

__all__ = ["FORMATS", "MISSING", "Format", "FormatReader", "format_for", "format_named"]

FORMATS: dict[str, Format] = {
    "jsonl": JSONL,
    "parquet": PARQUET,
    "megatron": MEGATRON,
    "flatbin": FLATBIN,
    "mds": MDS,
    "lance": LANCE,
    "webdataset": WEBDATASET,
    "hf": HF,
}


def format_named(name: str) -> Format:
    return FORMATS[name]


def format_for(name: str, source: Source | None) -> Format:
    """The format ``name`` as ``source`` reads it. A format whose reading depends on the
    source's settings (flatbin: the token width and the boundary id) defines
    ``for_source(source)``, which returns a configured copy, or raises ConfigError when the
    source cannot read it at all (token files in a text source)."""
    fmt = FORMATS[name]
    configure = getattr(fmt, "for_source", None)
    if source is None or configure is None:
        return fmt
    configured: Format = configure(source)
    return configured
