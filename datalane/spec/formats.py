"""Source file formats and compressions, as inferred from a file name.

One table for the engine (which reads the files) and the operator (which refuses, at admission,
a concrete file whose format could never be inferred).
"""

from __future__ import annotations

import os

__all__ = ["COMPRESSIONS", "FORMATS", "compression_of", "infer_format"]

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".json": "jsonl",
           ".ndjson": "jsonl"}


def compression_of(name: str) -> str | None:
    """``gzip``, ``zstd`` or None, from the last extension."""
    return COMPRESSIONS.get(os.path.splitext(name)[1].lower())


def infer_format(name: str) -> str | None:
    """``parquet``, ``jsonl`` or None, from the extension under any compression suffix."""
    stem = os.path.splitext(name)[0] if compression_of(name) else name
    return FORMATS.get(os.path.splitext(stem)[1].lower())
