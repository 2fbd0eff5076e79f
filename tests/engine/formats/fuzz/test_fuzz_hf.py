"""Fuzzing the Arrow IPC (Hugging Face) reader: a stream of three record batches (a text and
an id column), mutated at each message's metadata length, body length and row count, and
anywhere by flips, cuts and overwritten runs (flatbuffers, buffers, offsets). See
harness.py."""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import strategies as st

from tests.data.format_corpus import text_of
from tests.engine.formats.fuzz.harness import EDGES, Dataset, Site, fuzz
from tests.support.arrowbytes import messages

pytestmark = pytest.mark.fuzz

CASES = 300
DOCS = [text_of("hf", i) for i in range(9)]


def _set(fmt: str, at: int) -> Any:
    def apply(raw: bytes, value: int) -> bytes:
        return raw[:at] + struct.pack(fmt, value) + raw[at + struct.calcsize(fmt):]
    return apply


def dataset() -> Dataset:
    buf = io.BytesIO()
    schema = pa.schema([("text", pa.string()), ("id", pa.int64())])
    with pa.ipc.new_stream(buf, schema) as w:
        for b in range(3):
            rows = range(3 * b, 3 * b + 3)
            w.write_batch(pa.record_batch([pa.array([DOCS[i] for i in rows]),
                                           pa.array(list(rows), pa.int64())], schema=schema))
    raw = buf.getvalue()
    found = messages(raw)
    ends = [m.at for m in found[1:]] + [len(raw) - 8]
    spans: list[tuple[str, int, int, int]] = []
    sites: list[Site] = []
    for m, end in zip(found, ends, strict=True):
        i32 = st.sampled_from([n for n in EDGES if -(1 << 31) <= n < 1 << 31]) | st.integers(
            m.length - 16, m.length + 16)
        i64 = st.sampled_from([n for n in EDGES if -(1 << 63) <= n < 1 << 63]) | st.integers(
            -64, m.body + 64)
        sites.append(Site("data.arrow", f"metadata length at {m.at}", (m.at + 4, m.at + 8),
                          i32, _set("<i", m.at + 4)))
        if m.body_field is not None:
            sites.append(Site("data.arrow", f"body length at {m.at}",
                              (m.body_field, m.body_field + 8), i64, _set("<q", m.body_field)))
        if m.rows_field is not None:
            sites.append(Site("data.arrow", f"row count at {m.at}",
                              (m.rows_field, m.rows_field + 8), i64, _set("<q", m.rows_field)))
        if m.kind == 3:
            b = len([x for x in spans]) // 3
            spans.extend(("data.arrow", m.at, end, 3 * b + k) for k in range(3))
    return Dataset("hf", {"data.arrow": raw}, "data.arrow", {"chunk_rows": 2}, DOCS, spans,
                   sites)


def test_fuzz_hf(tmp_path: Path) -> None:
    # A bad record is rare here (0 or 1 of 300: an Arrow column has no per-record framing to
    # break), so only errors and exact reads must be reached.
    fuzz(dataset(), tmp_path, CASES, reach=("error", "exact"))
