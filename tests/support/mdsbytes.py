"""MDS shards and indexes written byte by byte, as the format is laid out (see
datalane/engine/formats/mds.py): ``uint32 n | uint32 offsets[n + 1] | JSON config | samples``,
a sample the uint32 sizes of its variable-size columns, then every column's bytes. The
hostile-input tests write shards the way ``MDSWriter`` would, then break one field."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

__all__ = ["TEXT_ONLY", "Columns", "config_of", "shard_bytes", "text_dataset", "write_index"]

Columns = tuple[list[str], list[str], list[int | None]]  # names, encodings, fixed sizes
TEXT_ONLY: Columns = (["id", "text"], ["int", "str"], [8, None])


def config_of(columns: Columns) -> dict[str, Any]:
    names, encodings, sizes = columns
    return {"column_names": names, "column_encodings": encodings, "column_sizes": sizes,
            "compression": None, "format": "mds", "hashes": [], "size_limit": 1 << 26,
            "version": 2}


def shard_bytes(columns: Columns, samples: list[list[bytes]],
                config_text: bytes | None = None) -> bytes:
    """A shard of ``samples`` (each column's bytes); ``config_text``: the JSON config to write
    instead of the columns' own (the samples are still laid out by ``columns``)."""
    config = config_text if config_text is not None else json.dumps(
        config_of(columns), sort_keys=True).encode()
    bodies = []
    for values in samples:
        var = [len(v) for v, size in zip(values, columns[2], strict=True) if size is None]
        bodies.append(struct.pack(f"<{len(var)}I", *var) + b"".join(values))
    n = len(samples)
    offsets = [4 + 4 * (n + 1) + len(config)]
    for body in bodies:
        offsets.append(offsets[-1] + len(body))
    return struct.pack(f"<I{n + 1}I", n, *offsets) + config + b"".join(bodies)


def write_index(root: Path, columns: Columns, shards: list[tuple[str, int, int]]) -> Path:
    """``root/index.json`` listing ``(basename, bytes, samples)`` shards."""
    entries = [{**config_of(columns), "raw_data": {"basename": name, "bytes": size, "hashes": {}},
                "samples": n, "zip_data": None} for name, size, n in shards]
    path = root / "index.json"
    path.write_text(json.dumps({"shards": entries, "version": 2}))
    return path


def text_dataset(root: Path, texts: list[str], columns: Columns = TEXT_ONLY) -> Path:
    """A dataset directory of one shard, sample ``i`` holding ``(i, texts[i])``."""
    root.mkdir(parents=True, exist_ok=True)
    raw = shard_bytes(columns, [[struct.pack("<q", i), t.encode()] for i, t in
                                enumerate(texts)])
    (root / "shard.00000.mds").write_bytes(raw)
    write_index(root, columns, [("shard.00000.mds", len(raw), len(texts))])
    return root
