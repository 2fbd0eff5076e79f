"""Parquet readers (a text column, a token id column) against mutated files
(tests/engine/formats/fuzz/stream_harness.py).

The files are written uncompressed, so a flip inside a data page can change a value and leave
a valid file (Parquet's page checksums are optional and off by default): each case is planned
on the mutated file and compared with what pyarrow's own ``read_table`` reads from the same
bytes (row by row: the value, or a bad record where the row has none). pyarrow refusing the
bytes means datalane must raise a DataError naming the file - never a raw ArrowInvalid or
OSError. Most mutations hit the footer: its length, the magic, and the thrift metadata (row
counts, column chunk offsets and sizes).
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

pytestmark = pytest.mark.fuzz

EXAMPLES = 100


def table(kind: str) -> pa.Table:
    if kind == "text":
        return pa.table({"text": [f"row {i} " + "word " * (i % 5) for i in range(30)]})
    return pa.table({"input_ids": pa.array([list(range(3, 3 + i % 7)) for i in range(30)],
                                     pa.list_(pa.int32()))})


def parquet_file(kind: str) -> tuple[bytes, list[Field]]:
    return parquet_bytes(table(kind))


def reference(data: bytes, field: str) -> list[Any] | None:
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception:  # pyarrow refuses the bytes
        return None
    if field not in table.column_names:  # a flip in the schema's name: every row lacks it
        return [(0, r, None, "bad") for r in range(table.num_rows)]
    column = table.column(field)
    try:
        values = column.to_pylist()
    except UnicodeDecodeError:  # a string that is not UTF-8: its bytes (a bad record later)
        values = [text(v) for v in column.cast(pa.binary()).to_pylist()]
    return [(0, r, v, None if v is not None else "bad") for r, v in enumerate(values)]


SOURCES = {"text": {}, "ids": {"tokens": {}}}
OUTCOMES = {kind: Outcomes(f"parquet {kind}") for kind in SOURCES}



@pytest.mark.parametrize("kind", list(SOURCES))
def test_mutated_parquet_files_read_as_pyarrow_reads_them_or_fail_naming_the_file(
        kind: str) -> None:
    data, fields = parquet_file(kind)
    field = "text" if kind == "text" else "input_ids"

    def read(path: Any) -> list[Any]:
        got = read_source({"uris": [str(path)], "chunk_rows": 5, **SOURCES[kind]})
        return [(f, p, text(v), None if r is None else "bad") for f, p, v, r in got]

    original = fuzz_file(OUTCOMES[kind], data, fields, ".parquet", read,
                         lambda raw: reference(raw, field), EXAMPLES, kind)
    assert len(original) == 30
