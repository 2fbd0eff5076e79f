"""A document's parts from the columns of a row: how the columnar formats (Parquet, Hugging Face
Arrow files) read a kind whose documents are several fields of a record (its configuration's
``document_parts``: vision's ``image`` and ``text``, interleaved's ``images`` and ``texts``).

A configured reader reads every column a part names that the file has (:func:`part_rows`), and
a record is the row's ``{column: value}``; :func:`decode_parts` makes it ``{part: value}``.
What a part may hold is its name's (:data:`PARTS`):

* ``image``: ``binary`` / ``large_binary`` (the encoded image), or Hugging Face's ``Image``
  struct ``{bytes: binary, path: string}`` (its bytes); ``images``: a list of them, with nulls;
* ``text``: ``string`` / ``large_string`` / ``binary`` (UTF-8 judged by the kind); ``texts``: a
  list of them, with nulls.

The bad records (the source's ``bad_records`` policy applies; each detail names the column):
a part without a value (a null, or no column of it in the file) is ``missing_field``; values
in two of a part's columns (``image_field: [jpg, png]``, both set) ``malformed_sample``; a
column of another type ``wrong_type`` (every row of it: the type is the file's); an ``Image``
struct holding a path and no bytes (a dataset written without embedding its files)
``image_not_embedded``; a row whose value holds over
:data:`~datalane.spec.limits.MAX_RECORD_BYTES` ``too_large`` (counted from the offsets, never
made a Python object). A column is validated in full before any value is taken (offsets inside
their buffers, as :mod:`~datalane.engine.formats.arrowvalues`); what pyarrow refuses raises
for the reader to name the file. Callers: :mod:`~datalane.engine.formats.parquet`,
:mod:`~datalane.engine.formats.hf`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from datalane.engine.formats.base import TooLarge
from datalane.spec.limits import MAX_RECORD_BYTES, TOO_LARGE

__all__ = ["PART_REASONS", "PARTS", "decode_parts", "part_rows"]

#: part name -> (what its values are, whether a row holds a list of them)
PARTS: dict[str, tuple[str, bool]] = {"image": ("image", False), "images": ("image", True),
                                      "text": ("text", False), "texts": ("text", True)}
#: what a column of each kind of part may be, as the errors say it
_EXPECTED = {"image": "binary or an Image struct {bytes, path}",
             "text": "string or binary"}

WRONG_TYPE = "wrong_type"
NOT_EMBEDDED = "image_not_embedded"
#: the bad-record reasons of :func:`decode_parts`
PART_REASONS = frozenset({"missing_field", "malformed_sample", WRONG_TYPE, NOT_EMBEDDED,
                          TOO_LARGE})


@dataclass(frozen=True)
class WrongType:
    """Every value of a column whose type is none its part may have."""

    type: str


@dataclass(frozen=True)
class PathOnly:
    """An ``Image`` struct with a path and no bytes."""

    path: str


def _is_binary(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _is_text(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or _is_binary(t))


def _is_image_struct(t: Any) -> bool:
    import pyarrow as pa

    if not pa.types.is_struct(t) or t.get_field_index("bytes") < 0:
        return False
    paths = t.get_field_index("path")
    return _is_binary(t.field("bytes").type) and (paths < 0 or _is_text(t.field(paths).type))


def _is_list(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _accepts(part: str, t: Any) -> bool:
    what, listed = PARTS[part]
    if listed:
        if not _is_list(t):
            return False
        t = t.value_type
    return _is_text(t) if what == "text" else _is_binary(t) or _is_image_struct(t)


def _binary_type(t: Any) -> Any:
    """``t`` with every string type made the binary type of the same layout (for validating
    offsets without judging UTF-8, and for reading invalid UTF-8 as bytes)."""
    import pyarrow as pa

    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _binary_type(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(pa.field(t.value_field.name, _binary_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _binary_type(f.type)) for f in t])
    return t


def _row_bytes(arr: Any) -> np.ndarray:
    """int64 bytes of each row's strings and binaries (nulls 0), from the offsets alone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arr.type
    if _is_text(t):
        return np.asarray(pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False),
                          np.int64)
    if pa.types.is_struct(t):
        total = np.zeros(len(arr), np.int64)
        for child in arr.flatten():
            total += _row_bytes(child)
        return total
    if _is_list(t):
        inner = np.concatenate([[0], np.cumsum(_row_bytes(arr.values))])
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), np.int64)
        sizes = inner[offsets[1:]] - inner[offsets[:-1]]
        return np.where(arr.is_valid().to_numpy(zero_copy_only=False), sizes, 0)
    return np.zeros(len(arr), np.int64)


def _python(arr: Any) -> list[Any]:
    """The values of a validated array; invalid UTF-8 in a string: bytes (judged later)."""
    try:
        return arr.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError:
        return arr.cast(_binary_type(arr.type)).to_pylist()  # type: ignore[no-any-return]


def _image(value: Any) -> Any:
    """An image value: bytes, None, or a :class:`PathOnly` (an ``Image`` struct's bytes)."""
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path")
        if data is None and path is not None:
            return PathOnly(path if isinstance(path, str) else repr(path))
        return data
    return value


def _chunk_values(arr: Any, part: str) -> list[Any]:
    import pyarrow as pa

    arr.view(_binary_type(arr.type)).validate(full=True)
    sizes = _row_bytes(arr)
    big = np.flatnonzero(sizes > MAX_RECORD_BYTES)
    if len(big):
        keep = np.flatnonzero(sizes <= MAX_RECORD_BYTES)
        values: list[Any] = [None] * len(arr)
        for i, v in zip(keep.tolist(), _python(arr.take(pa.array(keep))), strict=True):
            values[i] = v
        for i in big.tolist():
            values[i] = TooLarge(int(sizes[i]), "value")
    else:
        values = _python(arr)
    what, listed = PARTS[part]
    if what == "image" and _is_image_struct(arr.type.value_type if listed else arr.type):
        values = [v if isinstance(v, TooLarge) else
                  [_image(x) for x in v] if listed and v is not None else _image(v)
                  for v in values]
    return values


def column_part_values(column: Any, part: str) -> list[Any]:
    """The values of one column (an Arrow array or chunked array) read for ``part``: Python
    values, :class:`TooLarge`, :class:`PathOnly` images, or :class:`WrongType` in every row of
    a column of a type the part cannot have. Raises what pyarrow raises on a column whose
    buffers are inconsistent (the reader names the file)."""
    import pyarrow as pa

    if not _accepts(part, column.type):
        return [WrongType(str(column.type))] * len(column)
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: list[Any] = []
    for arr in chunks:
        out.extend(_chunk_values(arr, part))
    return out


def part_rows(parts: dict[str, tuple[str, ...]], names: Sequence[str], rows: int,
              column: Callable[[str], Any]) -> list[dict[str, Any]]:
    """Each row's ``{column: value}`` of every column ``parts`` names that ``names`` (the
    file's columns) has; ``column(name)`` reads one. ValueError when a column does not hold
    ``rows`` values."""
    values: dict[str, list[Any]] = {}
    for part, cols in parts.items():
        for c in cols:
            if c in names and c not in values:
                got = column_part_values(column(c), part)
                if len(got) != rows:
                    raise ValueError(f"column {c!r} holds {len(got)} values for {rows} rows")
                values[c] = got
    return [{c: v[i] for c, v in values.items()} for i in range(rows)]


def decode_parts(row: dict[str, Any], parts: dict[str, tuple[str, ...]]) -> tuple[
        dict[str, Any] | None, str | None, str | None]:
    """``({part: value}, None, None)`` of one row (:func:`part_rows`), or ``(None, reason,
    detail)`` for a bad record; images are bytes (or lists of bytes and None)."""
    out: dict[str, Any] = {}
    for part, cols in parts.items():
        present = [c for c in cols if row.get(c) is not None]
        if not present:
            return None, "missing_field", (f"no value in column {'|'.join(cols)} (the "
                                           f"{part})")
        if len(present) > 1:
            return None, "malformed_sample", (f"the row has values in {len(present)} {part} "
                                              f"columns ({', '.join(present)}); it may hold one")
        col = present[0]
        value = row[col]
        if isinstance(value, TooLarge):
            return None, TOO_LARGE, f"column {col!r}: {value.detail}"
        if isinstance(value, WrongType):
            return None, WRONG_TYPE, (f"column {col!r} is {value.type}, not "
                                      f"{'a list of ' if PARTS[part][1] else ''}"
                                      f"{_EXPECTED[PARTS[part][0]]}")
        items = value if PARTS[part][1] else [value]
        for k, item in enumerate(items):
            if isinstance(item, PathOnly):
                at = f"[{k}]" if PARTS[part][1] else ""
                return None, NOT_EMBEDDED, (f"column {col!r}{at} holds the path {item.path!r} "
                                            f"and no image bytes (written without embedding "
                                            f"its image files)")
        out[part] = value
    return out, None, None
