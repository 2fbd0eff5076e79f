"""Tars built byte by byte for the hostile-input tests: members written with :mod:`tarfile`'s
headers, header fields overwritten with their checksum made valid again (so the reader gets
past the checksum to the field under test), sparse members that claim gigabytes."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

__all__ = ["FIELDS", "fix_checksum", "set_field", "write_tar"]

#: ustar header fields: name -> (start, end) in the 512-byte block
FIELDS = {"name": (0, 100), "mode": (100, 108), "size": (124, 136), "mtime": (136, 148),
          "checksum": (148, 156), "type": (156, 157), "magic": (257, 265),
          "prefix": (345, 500)}


def fix_checksum(raw: bytearray, at: int) -> None:
    """Rewrite the checksum of the header at byte ``at`` to match its other bytes."""
    block = raw[at:at + 512]
    total = sum(block[:148]) + 8 * 32 + sum(block[156:])
    raw[at + 148:at + 156] = b"%06o\0 " % total


def set_field(raw: bytearray, at: int, field: str, value: bytes) -> None:
    """Overwrite ``field`` of the header at byte ``at`` (NUL-padded) and fix the checksum."""
    lo, hi = FIELDS[field]
    raw[at + lo:at + hi] = value[:hi - lo].ljust(hi - lo, b"\0")
    fix_checksum(raw, at)


def write_tar(path: Path, members: list[tuple[str, bytes]],
              fmt: int = tarfile.GNU_FORMAT, pax: dict[str, dict[str, str]] | None = None
              ) -> dict[str, int]:
    """Write ``members``; the offset of each member's first header (its extended headers
    included). ``pax``: extra pax records per member name (PAX_FORMAT)."""
    offsets: dict[str, int] = {}
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            if pax and name in pax:
                info.pax_headers = dict(pax[name])
            offsets.setdefault(name, tf.offset)
            tf.addfile(info, io.BytesIO(body))
    return offsets
