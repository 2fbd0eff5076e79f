"""Fuzzing the columnar readers of a document's parts (datalane/engine/formats/columnparts.py):
Parquet with a binary or ``Image``-struct image column and a caption column, a Hugging Face
Arrow stream of the struct (the vision kind), and OBELICS-style ``texts`` / ``images`` list
columns in both formats (the interleaved kind), mutated by flips, cuts and hostile values in
their footer / message fields and buffers (tests/engine/formats/fuzz/stream_harness.py).

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

from tests.engine.formats.fuzz.stream_harness import (
    Field,
    Outcomes,
    fuzz_file,
    parquet_bytes,
    read_source,
    text,
)
from tests.support.arrowbytes import messages
from tests.support.kinds import VISION_TOKENIZER

pytestmark = pytest.mark.fuzz

EXAMPLES = 120
BOUND = 200  # bytes a record may hold in these cases (MAX_RECORD_BYTES, lowered)
STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
_IMAGE_TYPES = {"binary", "large_binary", "struct<bytes: binary, path: string>"}
_TEXT_TYPES = {"string", "large_string", "binary", "large_binary"}


def table(kind: str) -> pa.Table:
    """30 rows: images of 0-232 bytes (over BOUND from row 25; every 7th null, every 11th
    path-only in the struct), captions (every 13th null); ``lists``: the same as OBELICS-style
    rows, each a text, an image and another text, nulls where the other stands."""
    images: list[Any] = [None if i % 7 == 3 else bytes([i]) * (i * 8) for i in range(30)]
    captions = [None if i % 13 == 5 else f"caption {i} " + "word " * (i % 9)
                for i in range(30)]
    if kind == "lists":
        return pa.table({
            "texts": pa.array([None if c is None else [c, None, "after"] for c in captions],
                              pa.list_(pa.string())),
            "images": pa.array([None if b is None else [None, b, None] for b in images],
                               pa.list_(pa.binary()))})
    if kind == "binary":
        column = pa.array(images, pa.binary())
    else:
        column = pa.array([None if b is None else {"bytes": None if i % 11 == 2 else b,
                                                   "path": f"p/{i}.jpg"}
                           for i, b in enumerate(images)], STRUCT)
    return pa.table({"image": column, "caption": pa.array(captions, pa.string())})


def parquet_file(kind: str) -> tuple[bytes, list[Field]]:
    return parquet_bytes(table(kind))


def arrow_file(kind: str) -> tuple[bytes, list[Field]]:
    buf = io.BytesIO()
    t = table(kind)
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
    if isinstance(value, dict | list):
        return sum(_size(v) for v in (value.values() if isinstance(value, dict) else value))
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogateescape"))
    return len(value) if isinstance(value, bytes) else 0


def _bytes_type(t: Any) -> Any:
    if pa.types.is_list(t):
        return pa.list_(_bytes_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([(f.name, _bytes_type(f.type)) for f in t])
    return pa.binary()


def _values(column: Any) -> list[Any]:
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError:  # invalid UTF-8 (a flip in a string): its bytes, judged later
        return column.cast(_bytes_type(column.type)).to_pylist()  # type: ignore[no-any-return]


def _accepts(t: Any, types: set[str], listed: bool) -> bool:
    if listed:
        return pa.types.is_list(t) and str(t.value_type) in types
    return str(t) in types


def _image(v: Any) -> Any:
    """An image value as the rules read it: bytes, None, or ("path", p) for a path only."""
    if isinstance(v, dict):
        return ("path", v["path"]) if v["bytes"] is None and v["path"] is not None \
            else v["bytes"]
    return v


#: per layout, each part in the kind's order: (part, column, accepted types, a list?)
LAYOUTS = {"pairs": [("image", "image", _IMAGE_TYPES, False),
                     ("text", "caption", _TEXT_TYPES, False)],
           "lists": [("texts", "texts", _TEXT_TYPES, True),
                     ("images", "images", _IMAGE_TYPES, True)]}


def judge(t: pa.Table, layout: str) -> list[tuple[int, int, Any, str | None]]:
    """What the rules make of each row of a table pyarrow read."""
    parts = LAYOUTS[layout]
    columns = {c: (t.schema.field(c).type, _values(t.column(c)))
               for _, c, _, _ in parts if c in t.column_names}
    out = []
    for r in range(t.num_rows):
        row: dict[str, Any] = {}
        reason: str | None = None
        for part, c, types, listed in parts:
            if c not in columns:
                reason = "missing_field"
                break
            type_, values = columns[c]
            if not _accepts(type_, types, listed):
                reason = "wrong_type"
                break
            v = values[r]
            if v is None:
                reason = "missing_field"
                break
            if _size(v) > BOUND:
                reason = "too_large"
                break
            if part.startswith("image"):
                v = [_image(x) for x in v] if listed else _image(v)
                if any(isinstance(x, tuple) for x in (v if listed else [v])):
                    reason = "image_not_embedded"
                    break
            else:
                v = [text(x) for x in v] if listed else text(v)
            row[part] = v
        out.append((0, r, None if reason else row, reason))
    return out


def reference(data: bytes, fmt: str, layout: str) -> list[Any] | None:
    try:
        if fmt == "parquet":
            return judge(pq.read_table(io.BytesIO(data)), layout)
        with pa.ipc.open_stream(io.BytesIO(data)) as r:
            return judge(r.read_all(), layout)
    except Exception:  # pyarrow refuses the bytes
        return None


KINDS = {"pairs": {"vision": {"image_field": ["image"], "text_field": "caption"}},
         "lists": {"interleaved": {}}}


def read(path: Any, layout: str) -> list[tuple[int, int, Any, str | None]]:
    got = read_source({"uris": [str(path)], "chunk_rows": 5, **KINDS[layout]},
                      tokenizer={"uri": str(VISION_TOKENIZER)}, packing={"algorithm": "bestfit"})
    def texts(parts: dict[str, Any]) -> dict[str, Any]:
        return {k: [text(x) for x in v] if k == "texts" else text(v) if k == "text" else v
                for k, v in parts.items()}

    return [(f, p, v if v is None else texts(v), r) for f, p, v, r in got]


#: variant -> (format, table kind, layout)
VARIANTS = {"parquet-binary": ("parquet", "binary", "pairs"),
            "parquet-struct": ("parquet", "struct", "pairs"),
            "hf-struct": ("hf", "struct", "pairs"),
            "parquet-lists": ("parquet", "lists", "lists"),
            "hf-lists": ("hf", "lists", "lists")}
OUTCOMES = {v: Outcomes(f"image columns {v}") for v in VARIANTS}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mutated_image_columns_read_as_pyarrow_reads_them_or_fail_naming_the_file(
        variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane.engine.formats import columnparts

    monkeypatch.setattr(columnparts, "MAX_RECORD_BYTES", BOUND)
    fmt, kind, layout = VARIANTS[variant]
    data, fields = parquet_file(kind) if fmt == "parquet" else arrow_file(kind)
    original = fuzz_file(OUTCOMES[variant], data, fields,
                         ".parquet" if fmt == "parquet" else ".arrow",
                         lambda path: read(path, layout), lambda raw: reference(raw, fmt, layout),
                         EXAMPLES, variant)
    assert len(original) == 30
    reasons = {r for *_, r in original}
    assert reasons >= {None, "missing_field", "too_large"}, reasons
    assert kind != "struct" or "image_not_embedded" in reasons
    print("\n" + OUTCOMES[variant].report())
    counts = OUTCOMES[variant].counts
    assert counts["error"] and counts["exact"], dict(counts)
