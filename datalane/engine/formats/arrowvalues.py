"""Python values of one Arrow column, for the formats that read Arrow data (HF, Lance).

A string column may hold invalid UTF-8 (Arrow does not validate what a writer hands it); such
a column is read as bytes, so that the text kind counts each broken value as ``non_utf8``
instead of the whole batch failing.

:func:`decoded` is what a reader of a hostile file calls: the column is validated in full
first (every offset inside its buffers; a string column as binary, so invalid UTF-8 stays a
per-value matter), since pyarrow turns values into Python objects without checking them (a
negative string offset was a raw ``SystemError``), and a value over
:data:`~datalane.spec.limits.MAX_RECORD_BYTES` becomes the
:class:`~datalane.engine.formats.base.TooLarge` marker every format uses instead of a Python
object (the map stage sets it aside as ``too_large``).
"""

from __future__ import annotations

from typing import Any

from datalane.engine.formats.base import TooLarge
from datalane.spec.limits import MAX_RECORD_BYTES

__all__ = ["column_values", "decoded"]


def column_values(column: Any) -> list[Any]:
    """``column`` (an Arrow array or chunked array) as Python values."""
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError:  # invalid UTF-8 in a string column: per value, as bytes
        import pyarrow as pa

        target = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        return column.cast(target).to_pylist()  # type: ignore[no-any-return]


def _as_binary(column: Any) -> Any:
    """A string column viewed as binary (the same buffers), any other column as it is."""
    import pyarrow as pa

    if pa.types.is_string(column.type):
        return column.view(pa.binary())
    if pa.types.is_large_string(column.type):
        return column.view(pa.large_binary())
    return column


def _value_bytes(column: Any) -> Any:
    """Each value's bytes (numpy int64), or None when no value can be over the bound."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.nbytes <= MAX_RECORD_BYTES:
        return None
    t = column.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or \
            pa.types.is_large_string(t):
        lengths = pc.binary_length(column)
    elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            t.value_type.bit_width is not None:  # token ids: list<int32> and the like
        lengths = pc.multiply(pc.list_value_length(column), max(t.value_type.bit_width // 8, 1))
    else:
        return None
    return lengths.fill_null(0).to_numpy(zero_copy_only=False)


def decoded(column: Any) -> list[Any]:
    """The values of ``column`` (an Arrow array) from a file not yet trusted: the column is
    validated in full (pyarrow's ArrowInvalid otherwise, for the caller to name the file),
    and each value over MAX_RECORD_BYTES is a :class:`TooLarge`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    _as_binary(column).validate(full=True)
    sizes = _value_bytes(column)
    if sizes is None or not np.any(sizes > MAX_RECORD_BYTES):
        return column_values(column)
    big = sizes > MAX_RECORD_BYTES
    values = column_values(pc.if_else(pa.array(big), pa.nulls(len(column), column.type),
                                      column))
    for i in np.flatnonzero(big):
        values[i] = TooLarge(int(sizes[i]), "value")
    return values
