"""Python values of one Arrow column, for the formats that read Arrow data (HF, Lance).

A string column may hold invalid UTF-8 (Arrow does not validate what a writer hands it); such
a column is read as bytes, so that the text kind counts each broken value as ``non_utf8``
instead of the whole batch failing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["column_values"]


def column_values(column: Any) -> list[Any]:
    """``column`` (an Arrow array or chunked array) as Python values."""
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError:  # invalid UTF-8 in a string column: per value, as bytes
        import pyarrow as pa

        target = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        return column.cast(target).to_pylist()  # type: ignore[no-any-return]
