"""Source file formats and compressions, as inferred from a file name.

:data:`DECLARED` is the one declaration of every format: its name, the extensions that infer
it, whether its records are token ids only, whether a directory can hold one of its datasets,
and where the engine's implementation lives. Every other table is derived from it: the
extension table (:data:`FORMAT_BY_EXTENSION`, extension -> format name) that the engine and the
operator (which refuses, at admission, a concrete file whose format could never be inferred)
infer formats with, the recipe's choices (:data:`FORMAT_NAMES`) and its reference text
(:func:`format_reference`), :data:`TOKEN_FORMATS`, and the engine's registry of readers and
directory listers (:data:`datalane.engine.formats.FORMATS`, format name -> implementation),
which loads each declared implementation by its path. A new format is its module plus one
:class:`FormatSpec` line here; ``tests/engine`` fails naming whatever one of the two lacks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from datalane.spec.seams import engine_path

__all__ = ["COMPRESSIONS", "DECLARED", "FORMAT_BY_EXTENSION", "FORMAT_NAMES", "PART_FORMATS",
           "TOKEN_FORMATS", "UNSUPPORTED", "FormatSpec", "compression_of", "declared",
           "directory_formats", "format_reference", "infer_format", "unsupported_compression"]

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
#: Compressions datalane refuses by name (reading them as text would give garbage records).
UNSUPPORTED = {".bz2": "bzip2", ".xz": "xz", ".lzma": "lzma", ".lz4": "lz4", ".br": "brotli",
               ".sz": "snappy", ".snappy": "snappy", ".z": "compress (LZW)", ".zip": "zip",
               ".7z": "7z", ".rar": "rar", ".lzo": "lzo"}


@dataclass(frozen=True)
class FormatSpec:
    """One format, as the recipe, the operator and the engine know it."""

    name: str  # what a recipe's ``format:`` names (and the engine's registry key)
    extensions: tuple[str, ...]  # that infer it, under any compression suffix; may be none
    token_ids: bool = False  # records are token ids and nothing else: a source sets ``tokens``
    #: reads several fields of a record together, for a kind whose configuration names
    #: ``document_parts`` (a vision source's image and caption members)
    parts: bool = False
    #: what the reference calls a dataset directory of this format (``MDS``), or None when the
    #: format has none; an inferred directory is tried by each such format in ``probe`` order
    directory: str | None = None
    probe: int = 0
    #: how the recipe reference lists the extensions ("" : ``.a/.b (name)``, the name left
    #: out when the first extension is the name)
    shown: str = ""
    #: ``module:attribute`` of the engine's implementation ("": the format's own module of
    #: ``datalane.engine.formats``, attribute the upper-case name)
    implementation: str = ""

    @property
    def engine_path(self) -> tuple[str, str]:
        """``(module, attribute)`` of the engine's :class:`~datalane.engine.formats.Format`."""
        return engine_path(self.implementation,
                           f"datalane.engine.formats.{self.name}:{self.name.upper()}")

    @property
    def reference(self) -> str:
        if self.shown:
            return self.shown
        named = "" if self.extensions[0] == f".{self.name}" else f" ({self.name})"
        return "/".join(self.extensions) + named


#: Every format, in the order the recipe reference lists them.
DECLARED: tuple[FormatSpec, ...] = (
    # (a vision source reads an image-bytes column and a caption column)
    FormatSpec("parquet", (".parquet", ".pq"), shown=".parquet", parts=True),
    FormatSpec("jsonl", (".jsonl", ".json", ".ndjson"),
               shown=".jsonl/.json/.ndjson (optionally .gz or .zst)"),
    # Megatron-LM indexed dataset: NAME.idx, its tokens in NAME.bin
    FormatSpec("megatron", (".idx",), token_ids=True),
    # flat token files (a .bin needs format: flatbin)
    FormatSpec("flatbin", (".u16", ".u32"), token_ids=True),
    # MosaicML Streaming shards (shard.00000.mds[.zstd]; or the dataset dir)
    FormatSpec("mds", (".mds",), directory="MDS", probe=0),
    # a Lance dataset directory (pylance: pip install 'datalane[lance]')
    FormatSpec("lance", (".lance",), directory="Lance", probe=2),
    # WebDataset tars: samples of members sharing a key (a vision source reads two of them)
    FormatSpec("webdataset", (".tar",), parts=True),
    # Arrow IPC files, as Hugging Face datasets' save_to_disk writes them (an Image feature
    # for a vision source)
    FormatSpec("hf", (".arrow",), directory="HF", probe=1, parts=True),
)

#: File extension -> format name (derived from :data:`DECLARED`); the engine's registry of
#: implementations by format name is :data:`datalane.engine.formats.FORMATS`.
FORMAT_BY_EXTENSION = {ext: f.name for f in DECLARED for ext in f.extensions}
#: URI scheme -> what to install for fsspec to open it (named when the scheme is unknown).
PROTOCOL_EXTRAS = {"hf": "huggingface_hub: pip install 'datalane[hf]'"}
FORMAT_NAMES = tuple(f.name for f in DECLARED)
#: Formats whose records are token ids and nothing else: a source of them sets ``tokens``.
TOKEN_FORMATS = frozenset(f.name for f in DECLARED if f.token_ids)
#: Formats that read a document's parts from several fields of a record (vision sources).
PART_FORMATS = frozenset(f.name for f in DECLARED if f.parts)


def declared(name: str) -> FormatSpec:
    """The declaration of format ``name`` (KeyError: none)."""
    return _BY_NAME[name]


_BY_NAME = {f.name: f for f in DECLARED}


def directory_formats() -> list[FormatSpec]:
    """The formats a directory can hold a dataset of, in the order an inferred directory is
    tried (the first whose lister recognises it reads it)."""
    return sorted((f for f in DECLARED if f.directory is not None), key=lambda f: f.probe)


def format_reference() -> str:
    """The recipe reference's text on ``format`` (generated into docs/recipe.md and the CRD)."""
    titles = [f.directory for f in directory_formats()]
    dirs = ", ".join(t for t in titles[:-1] if t) + f" or {titles[-1]}"
    return ("File format; null infers it from the extension: "
            + ", ".join(f.reference for f in DECLARED)
            + f"; a directory is read as an {dirs} dataset.")


def compression_of(name: str) -> str | None:
    """``gzip``, ``zstd`` or None, from the last extension."""
    return COMPRESSIONS.get(os.path.splitext(name)[1].lower())


def unsupported_compression(name: str) -> str | None:
    """The name of a compression datalane does not read, from the last extension, or None."""
    return UNSUPPORTED.get(os.path.splitext(name)[1].lower())


def infer_format(name: str) -> str | None:
    """``parquet``, ``jsonl`` or None, from the extension under any compression suffix."""
    stem = os.path.splitext(name)[0] if compression_of(name) else name
    return FORMAT_BY_EXTENSION.get(os.path.splitext(stem)[1].lower())
