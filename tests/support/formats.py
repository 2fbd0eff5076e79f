"""One fixture writer per declared format, keyed by the format's name.

A writer writes a small dataset of its format into a directory, with the format's own tools
where the format has them (pyarrow, ``datasets``' ``save_to_disk``, ``lance``, webdataset's
``TarWriter``, MosaicML Streaming's shards committed in tests/data/mds, Megatron's byte
layout), and returns what a contract test needs: the source files as a plan lists them, the
recipe source reading them, the field, the value every record's field holds (in file order,
so the test compares with what was written, not with what the reader said before), and chunk
sizes that cut the files into several chunks. tests/engine/test_format_contract.py runs every
declared format (:data:`datalane.spec.formats.DECLARED`) through the same contract with its
writer here; a declared format without a writer fails that test by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datalane.engine.files import SourceFile, expand, format_of
from datalane.engine.formats.directories import directory_lister, listed_format
from datalane.spec.formats import compression_of
from datalane.spec.recipe import Source
from datalane.spec.tokens import TokensSpec
from tests.data.format_corpus import write_hf, write_lance, write_mds, write_tars
from tests.data.make_mds import text_of as mds_text

__all__ = ["WRITERS", "Written", "listed_files"]


@dataclass(frozen=True)
class Written:
    """A dataset of one format, as a contract test reads it."""

    files: list[SourceFile]
    source: Source  # the recipe source that reads it (its format settings: tokens, ...)
    values: list[Any]  # each record's field value, in file order (token ids as lists)
    chunkings: list[tuple[int, int | None]]  # (chunk_bytes, chunk_rows) giving several chunks


def listed_files(uri: str, declared: str | None) -> list[SourceFile]:
    """The source files a recipe source of ``uri`` reads, listed as the plan lists them
    (:mod:`datalane.engine.plan`): dataset directories by their format's lister."""
    return [SourceFile(p, size, ident, format_of(p, declared or listed_format(ident), "test"),
                       compression_of(p))
            for p, size, ident in expand(uri, "test", directory_lister(declared))]


def _texts(prefix: str, n: int) -> list[str]:
    return [f"{prefix} document {i}: " + "word " * (i % 7) for i in range(n)]


def _ids(n: int) -> list[list[int]]:
    """Document i: ``i % 9 + 1`` token ids, distinct across documents."""
    return [[100 + 10 * i + j for j in range(i % 9 + 1)] for i in range(n)]


def _source(uri: str, fmt: str | None = None, **extra: Any) -> Source:
    return Source(name="s", uris=[uri], format=fmt, **extra)


def write_jsonl(root: Path) -> Written:
    """Two files of 60 lines ``{"text": ...}`` of varying length; chunks of 256 bytes align
    to newlines."""
    texts = _texts("jsonl", 120)
    for k in range(2):
        with open(root / f"part-{k}.jsonl", "w") as f:
            for t in texts[60 * k:60 * (k + 1)]:
                f.write(json.dumps({"text": t}) + "\n")
    uri = str(root / "*.jsonl")
    return Written(listed_files(uri, None), _source(uri), texts, [(256, None), (1000, None)])


def write_parquet(root: Path) -> Written:
    """Two files of 50 rows in row groups of 16."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = _texts("parquet", 100)
    for k in range(2):
        pq.write_table(pa.table({"text": texts[50 * k:50 * (k + 1)]}),
                       root / f"part-{k}.parquet", row_group_size=16)
    uri = str(root / "*.parquet")
    return Written(listed_files(uri, None), _source(uri), texts, [(1 << 20, None), (1, 7)])


def write_megatron(root: Path) -> Written:
    """Two Megatron datasets (``.idx`` + ``.bin``) of 40 documents, uint16."""
    from datalane.engine.formats.megatron import write_dataset

    docs = _ids(80)
    for k in range(2):
        write_dataset(str(root / f"part-{k}"), docs[40 * k:40 * (k + 1)])
    uri = str(root / "*.idx")
    return Written(listed_files(uri, None), _source(uri, tokens=TokensSpec()), docs,
                   [(64, None), (1 << 20, 5)])


def write_flatbin(root: Path) -> Written:
    """Two flat uint16 files of 40 documents each, listed in their offsets files."""
    from datalane.engine.formats.flatbin import write_flat

    docs = _ids(80)
    for k in range(2):
        write_flat(str(root / f"part-{k}.u16"), docs[40 * k:40 * (k + 1)], offsets=True)
    uri = str(root / "*.u16")
    return Written(listed_files(uri, None), _source(uri, tokens=TokensSpec(dtype="uint16")),
                   docs, [(64, None), (1 << 20, 5)])


def _from_corpus(root: Path, write: Callable[[Path], Any], prefix: str,
                 chunkings: list[tuple[int, int | None]]) -> Written:
    data = write(root)
    spec = data.source
    uri = spec["uris"][0]
    field = spec.get("text_field", "text")
    source = _source(uri, spec.get("format"), text_field=field)
    texts = [mds_text(prefix, i) for i in data.ids]
    return Written(listed_files(uri, spec.get("format")), source, texts, chunkings)


WRITERS: dict[str, Callable[[Path], Written]] = {
    "jsonl": write_jsonl,
    "parquet": write_parquet,
    "megatron": write_megatron,
    "flatbin": write_flatbin,
    "mds": lambda root: _from_corpus(root, write_mds, "mds", [(700, None), (1 << 20, 20)]),
    "webdataset": lambda root: _from_corpus(root, lambda r: write_tars(r, 2, 40), "wds",
                                            [(4096, None), (1 << 20, 9)]),
    "hf": lambda root: _from_corpus(root, lambda r: write_hf(r, 120), "hf",
                                    [(1 << 20, 7), (1 << 20, 25)]),
    "lance": lambda root: _from_corpus(root, lambda r: write_lance(r, 150), "lance",
                                       [(1 << 20, None), (1 << 20, 20)]),
}
