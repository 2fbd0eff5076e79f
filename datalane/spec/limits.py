"""Bounds on what one record of a source file may cost, shared by every format's reader.

A source file is hostile until checked: a header may claim a 4 GiB member, a line may never
end, a compressed frame may expand a thousandfold. A reader that would hold more than
:data:`MAX_RECORD_BYTES` for one record (a JSONL line, a tar member, an MDS sample, an Arrow
value) does not read it: the record is a bad record of reason :data:`TOO_LARGE`, counted under
``bad_records: skip`` and named with its file and offset under ``fail``. The bound is part of
the format contract (the same for every recipe), so it never changes which documents a valid
corpus yields. Callers: the readers in :mod:`datalane.engine.formats`.
"""

from __future__ import annotations

__all__ = ["MAX_RECORD_BYTES", "TOO_LARGE"]

MAX_RECORD_BYTES = 64 << 20
"""The most bytes one raw record may hold, after decompression (64 MiB)."""

TOO_LARGE = "too_large"
"""The bad-record reason of a record over :data:`MAX_RECORD_BYTES`."""
