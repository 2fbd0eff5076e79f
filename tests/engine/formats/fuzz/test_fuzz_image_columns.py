"""Fuzzing the columnar readers of a vision source's parts (datalane/engine/formats/
columnparts.py): Parquet with a binary or ``Image``-struct image column and a caption column,
and a Hugging Face Arrow stream of the struct, mutated by flips, cuts and hostile values in
their footer / message fields (tests/fuzz/stream_harness.py).

Each case is planned and read by datalane's plan and record reader with the bound on a
record's bytes lowered (so that a mutated length reaches it), and compared, row by row, with
an independent reading of the same bytes by pyarrow (``read_table``, ``open_stream``) judged by
the rules of docs/vlm.md in plain Python: ``{image, text}`` or the exact bad-record reason.
pyarrow refusing the bytes means datalane must raise a DataError naming the file.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fuzz.stream_harness import Field, Outcomes, fuzz_file, parquet_bytes, read_source, text
from tests.hostile.arrowbytes import messages
from tests.support.kinds import VISION_TOKENIZER

EXAMPLES = 120
BOUND = 200  # bytes a record may hold in these cases (MAX_RECORD_BYTES, lowered)
STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
_IMAGE_TYPES = {"binary", "large_binary", "struct<bytes: binary, path: string>"}
_TEXT_TYPES = {"string", "large_string", "binary", "large_binary"}


def table(kind: str) -> pa.Table:
    """30 rows: images of 0-232 bytes (over BOUND from row 25; every 7th null, every 11th
    path-only in the struct), captions (every 13th null)."""
    images: list[Any] = [None if i % 7 == 3 else bytes([i]) * (i * 8) for i in range(30)]
    captions = [None if i % 13 == 5 else f"caption {i} " + "word " * (i % 9)
                for i in range(30)]
    if kind == "binary":
        column = pa.array(images, pa.binary())
    else:
        column = pa.array([None if b is None else {"bytes": None if i % 11 == 2 else b,
                                                   "path": f"p/{i}.jpg"}
                           for i, b in enumerate(images)], STRUCT)
    return pa.table({"image": column, "caption": pa.array(captions, pa.string())})


def parquet_file(kind: str) -> tuple[bytes, list[Field]]:
    return parquet_bytes(table(kind))


def arrow_file() -> tuple[bytes, list[Field]]:
    buf = io.BytesIO()
    t = table("struct")
    with pa.ipc.new_stream(buf, t.schema) as w:
        w.write_table(t, max_chunksize=8)
    data = buf.getvalue()
    fields: list[Field] = []
    for m in messages(data):
        fields.append(Field(m.at + 4, 4))
        fields += [Field(f, 8) for f in (m.body_field, m.rows_field) if f is not None]
        fields += [Field(i, 4) for i in range(m.at + 8, m.at + 8 + m.length - 4, 4)]
        # the body's buffers (validity bitmaps, offsets)
        fields += [Field(i, 4) for i in range(m.at + 8 + m.length,
                                               m.at + 8 + m.length + m.body - 4, 8)]
    return data, fields


def _size(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values())
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogateescape"))
    return len(value) if isinstance(value, bytes) else 0


def _values(column: Any) -> list[Any]:
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError:  # invalid UTF-8 (a flip in a string): its bytes, judged later
        t = pa.struct([("bytes", pa.binary()), ("path", pa.binary())]) if \
            pa.types.is_struct(column.type) else pa.binary()
        return column.cast(t).to_pylist()  # type: ignore[no-any-return]


def judge(t: pa.Table) -> list[tuple[int, int, Any, str | None]]:
    """What the rules make of each row of a table pyarrow read."""
    parts = {"image": ("image", _IMAGE_TYPES), "text": ("caption", _TEXT_TYPES)}
    columns = {part: (str(t.schema.field(c).type), _values(t.column(c)))
               for part, (c, _) in parts.items() if c in t.column_names}
    out = []
    for r in range(t.num_rows):
        row: dict[str, Any] = {}
        reason: str | None = None
        for part, (_, types) in parts.items():
            if part not in columns:
                reason = "missing_field"
                break
            type_name, values = columns[part]
            if type_name not in types:
                reason = "wrong_type"
                break
            v = values[r]
            if v is None:
                reason = "missing_field"
                break
            if _size(v) > BOUND:
                reason = "too_large"
                break
            if isinstance(v, dict):
                if v["bytes"] is None:
                    reason = "image_not_embedded"
                    break
                v = v["bytes"]
            row[part] = text(v) if part == "text" else v
        out.append((0, r, None if reason else row, reason))
    return out


def reference(data: bytes, fmt: str) -> list[Any] | None:
    try:
        if fmt == "parquet":
            return judge(pq.read_table(io.BytesIO(data)))
        with pa.ipc.open_stream(io.BytesIO(data)) as r:
            return judge(r.read_all())
    except Exception:  # pyarrow refuses the bytes
        return None


def read(path: Any) -> list[tuple[int, int, Any, str | None]]:
    got = read_source({"uris": [str(path)], "chunk_rows": 5,
                       "vision": {"image_field": ["image"], "text_field": "caption"}},
                      tokenizer={"uri": str(VISION_TOKENIZER)}, packing={"algorithm": "bestfit"})
    return [(f, p, {**v, "text": text(v["text"])} if v else v, r) for f, p, v, r in got]


VARIANTS = {"parquet-binary": ("parquet", "binary"), "parquet-struct": ("parquet", "struct"),
            "hf-struct": ("hf", "struct")}
OUTCOMES = {v: Outcomes(f"image columns {v}") for v in VARIANTS}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mutated_image_columns_read_as_pyarrow_reads_them_or_fail_naming_the_file(
        variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane.engine.formats import columnparts

    monkeypatch.setattr(columnparts, "MAX_RECORD_BYTES", BOUND)
    fmt, kind = VARIANTS[variant]
    data, fields = parquet_file(kind) if fmt == "parquet" else arrow_file()
    original = fuzz_file(OUTCOMES[variant], data, fields,
                         ".parquet" if fmt == "parquet" else ".arrow", read,
                         lambda raw: reference(raw, fmt), EXAMPLES, variant)
    assert len(original) == 30
    reasons = {r for *_, r in original}
    assert reasons >= {None, "missing_field", "too_large"}, reasons
    assert kind == "binary" or "image_not_embedded" in reasons
    print("\n" + OUTCOMES[variant].report())
    counts = OUTCOMES[variant].counts
    assert counts["error"] and counts["exact"], dict(counts)
