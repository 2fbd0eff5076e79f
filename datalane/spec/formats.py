"""Source file formats and compressions, as inferred from a file name.

One table for the engine (which reads the files) and the operator (which refuses, at admission,
a concrete file whose format could never be inferred).
"""

from __future__ import annotations

import os

__all__ = ["COMPRESSIONS", "FORMATS", "FORMAT_NAMES", "TOKEN_FORMATS", "UNSUPPORTED",
           "compression_of", "infer_format", "unsupported_compression"]

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
#: Compressions datalane refuses by name (reading them as text would give garbage records).
UNSUPPORTED = {".bz2": "bzip2", ".xz": "xz", ".lzma": "lzma", ".lz4": "lz4", ".br": "brotli",
               ".sz": "snappy", ".snappy": "snappy", ".z": "compress (LZW)", ".zip": "zip",
               ".7z": "7z", ".rar": "rar", ".lzo": "lzo"}
#: File extension -> format name: the registry of format names (one line per extension; the
#: engine's implementations are listed in ``datalane.engine.formats``).
FORMATS = {
    ".parquet": "parquet", ".pq": "parquet",
    ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
    ".idx": "megatron",  # Megatron-LM indexed dataset: NAME.idx, its tokens in NAME.bin
    ".u16": "flatbin", ".u32": "flatbin",  # flat token files (a .bin needs format: flatbin)
    ".mds": "mds",  # MosaicML Streaming shards (shard.00000.mds[.zstd]; or the dataset dir)
    ".lance": "lance",  # a Lance dataset directory (pylance: pip install 'datalane[lance]')
    ".tar": "webdataset",  # WebDataset tars: samples of members sharing a key
    ".arrow": "hf",  # Arrow IPC files, as Hugging Face datasets' save_to_disk writes them
}
#: URI scheme -> what to install for fsspec to open it (named when the scheme is unknown).
PROTOCOL_EXTRAS = {"hf": "huggingface_hub: pip install 'datalane[hf]'"}
FORMAT_NAMES = tuple(dict.fromkeys(FORMATS.values()))
#: Formats whose records are token ids and nothing else: a source of them sets ``tokens``.
TOKEN_FORMATS = frozenset({"megatron", "flatbin"})


def compression_of(name: str) -> str | None:
    """``gzip``, ``zstd`` or None, from the last extension."""
    return COMPRESSIONS.get(os.path.splitext(name)[1].lower())


def unsupported_compression(name: str) -> str | None:
    """The name of a compression datalane does not read, from the last extension, or None."""
    return UNSUPPORTED.get(os.path.splitext(name)[1].lower())


def infer_format(name: str) -> str | None:
    """``parquet``, ``jsonl`` or None, from the extension under any compression suffix."""
    stem = os.path.splitext(name)[0] if compression_of(name) else name
    return FORMATS.get(os.path.splitext(stem)[1].lower())
