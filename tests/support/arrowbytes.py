"""Where pyarrow put the fields of an Arrow IPC stream's messages, so a hostile-input test can
overwrite one: the metadata length, the body length and a record batch's row count."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from datalane.engine.formats.hf import _field

__all__ = ["Message", "messages"]


@dataclass(frozen=True)
class Message:
    at: int  # the message's byte offset (its continuation marker)
    length: int  # metadata bytes
    kind: int  # 1 schema, 3 record batch
    body_field: int | None  # absolute offset of the int64 body length
    rows_field: int | None  # absolute offset of the int64 row count (record batches)
    body: int


def messages(raw: bytes) -> list[Message]:
    """The messages of a stream written with the continuation marker, up to its end marker."""
    out = []
    pos = 0
    while True:
        marker, length = struct.unpack_from("<Ii", raw, pos)
        assert marker == 0xFFFFFFFF
        if length == 0:
            return out
        base = pos + 8
        meta = raw[base:base + length]
        root = struct.unpack_from("<I", meta, 0)[0]
        kind_at = _field(meta, root, 1)
        kind = meta[kind_at] if kind_at is not None else 0
        body_at = _field(meta, root, 3)
        body = struct.unpack_from("<q", meta, body_at)[0] if body_at is not None else 0
        rows_at = None
        header_at = _field(meta, root, 2)
        if kind == 3 and header_at is not None:
            header = header_at + struct.unpack_from("<I", meta, header_at)[0]
            rows_at = _field(meta, header, 0)
        out.append(Message(pos, length, kind, None if body_at is None else base + body_at,
                           None if rows_at is None else base + rows_at, body))
        pos = base + length + body
