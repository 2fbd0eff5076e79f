"""The sample schema (datalane/spec/schema.py): column shapes and capacities, the byte layout of
a shared-memory slot, the checks of arrays against the schema, and the strict parse of a schema
a sidecar announces.

Offsets and sizes are computed by hand in the comments: every column starts on an 8-byte
boundary, per-image columns are laid out at their capacity after a 16-byte header of counts.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from datalane.spec.errors import MismatchError
from datalane.spec.schema import IMAGE_HEADER, Column, SampleSchema, text_schema

LOSS_MASK = Column("loss_mask", "uint8", pad=0, default=1)
DOCS = Column("doc_count", "int64", pad=0, per_token=False)  # one value per sequence
PATCH = Column("p", "uint8", 0, per_token=False, image="patch", width=6, patches_per_token=4)
BOUND = Column("b", "int64", 0, per_token=False, image="bound")
IMAGE = Column("i", "uint8", 0, per_token=False, image="image")


def _text() -> SampleSchema:
    return text_schema(5, (LOSS_MASK, DOCS))


def _images() -> SampleSchema:
    return text_schema(5, (PATCH, BOUND, IMAGE))


# -- columns ------------------------------------------------------------------------------------


def test_text_schema_orders_the_columns_per_image_last() -> None:
    schema = text_schema(5, (PATCH, LOSS_MASK))
    assert schema.names == ("input_ids", "positions", "loss_mask", "p")
    assert len(schema) == 4 and [c.name for c in schema] == list(schema.names)
    ids, positions = schema.column("input_ids"), schema.column("positions")
    assert (ids.dtype, ids.pad, ids.fill) == ("int32", 5, "document")
    assert (positions.dtype, positions.pad, positions.fill) == ("int32", -1, "position")
    assert schema.document_columns() == (ids, LOSS_MASK)  # not positions, not per-image
    assert schema.image_columns == (PATCH,)
    assert _text().image_columns == ()
    with pytest.raises(KeyError):
        schema.column("labels")


def test_columns_schemas_and_slot_fields_are_frozen_values() -> None:
    field = _text().layout(1, 1)[0]
    for value, name in ((LOSS_MASK, "pad"), (_text(), "columns"), (field, "offset")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
    assert {LOSS_MASK: 1}[Column("loss_mask", "uint8", pad=0, default=1)] == 1  # hashable


def test_shapes_and_capacities_of_each_kind_of_column() -> None:
    # 2 rows of 7 tokens: at most 7 // 3 = 2 images a row (a run is >= 3 tokens), 4 images;
    # at most 6 placeholders a row, 4 patch rows each: 2 * 6 * 4 = 48 patch rows
    assert LOSS_MASK.shape(2, 7) == (2, 7) and LOSS_MASK.nbytes(2, 7) == 14
    assert DOCS.shape(2, 7) == (2,) and DOCS.nbytes(2, 7) == 16
    assert IMAGE.capacity(2, 7) == 4 and IMAGE.shape(2, 7) == (4,)
    assert BOUND.capacity(2, 7) == 5 and BOUND.nbytes(2, 7) == 40
    assert PATCH.capacity(2, 7) == 48 and PATCH.shape(2, 7) == (48, 6)
    assert PATCH.nbytes(2, 7) == 288
    assert (IMAGE.per_image, LOSS_MASK.per_image, DOCS.per_image) == (True, False, False)


def test_only_per_image_columns_announce_their_image_fields() -> None:
    assert LOSS_MASK.to_json() == {"name": "loss_mask", "dtype": "uint8", "pad": 0,
                                   "fill": "document", "default": 1, "per_token": True}
    assert PATCH.to_json() == {"name": "p", "dtype": "uint8", "pad": 0, "fill": "document",
                               "default": 0, "per_token": False, "image": "patch", "width": 6,
                               "patches_per_token": 4}
    text = _text().dumps()
    assert " " not in text and json.loads(text) == _text().to_json()
    assert text.startswith('[{"default":0,"dtype":"int32","fill":"document","name":"input_ids"')


# -- layout -------------------------------------------------------------------------------------


def test_the_layout_aligns_every_column_to_8_bytes() -> None:
    # 2 rows of 5 tokens: input_ids 40 bytes at 0, positions 40 at 40, loss_mask 10 at 80
    # (the next starts at 96, not 90), doc_count 16 at 96: 112 bytes
    layout = _text().layout(2, 5)
    assert [(f.column.name, f.offset, f.nbytes, f.shape) for f in layout] == [
        ("input_ids", 0, 40, (2, 5)), ("positions", 40, 40, (2, 5)),
        ("loss_mask", 80, 10, (2, 5)), ("doc_count", 96, 16, (2,))]
    assert _text().slot_bytes(2, 5) == 112
    # the slot's end is aligned too: loss_mask last ends at 90, the slot is 96 bytes
    assert text_schema(5, (LOSS_MASK,)).slot_bytes(2, 5) == 96
    # 1 row of 1 token: input_ids 4 bytes at 0, positions 4 at 8: 16 bytes
    assert text_schema(5).slot_bytes(1, 1) == 16


def test_per_image_columns_lie_after_the_header_at_their_capacity() -> None:
    # 2 rows of 7 tokens after the 16-byte header: input_ids 56 at 16, positions 56 at 72,
    # p 48 x 6 = 288 at 128, b 5 x 8 = 40 at 416, i 4 at 456: the slot ends at 464 (460 up)
    assert IMAGE_HEADER == 16
    layout = _images().layout(2, 7)
    assert [(f.column.name, f.offset, f.nbytes, f.shape) for f in layout] == [
        ("input_ids", 16, 56, (2, 7)), ("positions", 72, 56, (2, 7)),
        ("p", 128, 288, (48, 6)), ("b", 416, 40, (5,)), ("i", 456, 4, (4,))]
    assert _images().slot_bytes(2, 7) == 464


def test_empty_arrays_hold_the_pad_values_and_no_image() -> None:
    cols = _images().empty(2, 7)
    assert cols["input_ids"].tolist() == [[5] * 7] * 2
    assert cols["positions"].tolist() == [[-1] * 7] * 2
    assert cols["input_ids"].dtype == np.dtype("<i4")
    assert cols["p"].shape == (0, 6) and cols["p"].dtype == np.uint8
    assert cols["b"].tolist() == [0] and cols["b"].dtype == np.int64  # the one start
    assert cols["i"].shape == (0,)
    assert _text().empty(2, 3)["doc_count"].tolist() == [0, 0]
    _images().check(cols, 2, 7, "empty")


# -- checks -------------------------------------------------------------------------------------


def _check_error(schema: SampleSchema, cols: dict[str, np.ndarray], rows: int = 2,
                 seq_tokens: int = 7) -> str:
    with pytest.raises(MismatchError) as info:
        schema.check(cols, rows, seq_tokens, "window")
    return str(info.value)


def test_check_refuses_other_names_dtypes_and_shapes() -> None:
    schema = _text()
    good = schema.empty(2, 7)
    schema.check(good, 2, 7, "window")
    swapped = {"positions": good["positions"], "input_ids": good["input_ids"],
               "loss_mask": good["loss_mask"], "doc_count": good["doc_count"]}
    assert _check_error(schema, swapped) == (
        "window has the columns ['positions', 'input_ids', 'loss_mask', 'doc_count']; the "
        "schema has ['input_ids', 'positions', 'loss_mask', 'doc_count']")
    assert _check_error(schema, {**good, "loss_mask": good["loss_mask"].astype(np.int32)}) == (
        "window: column 'loss_mask' is int32[2, 7]; the schema has uint8[2, 7]")
    assert _check_error(schema, {**good, "positions": good["positions"][:, :6]}) == (
        "window: column 'positions' is int32[2, 6]; the schema has int32[2, 7]")
    assert _check_error(schema, {**good, "doc_count": np.zeros(3, np.int64)}) == (
        "window: column 'doc_count' is int64[3]; the schema has int64[2]")


def test_check_takes_per_image_rows_from_none_up_to_the_capacity() -> None:
    schema = _images()
    base = schema.empty(2, 7)
    for cols in ({**base, "i": np.zeros(4, np.uint8), "b": np.zeros(5, np.int64),
                  "p": np.zeros((48, 6), np.uint8)},
                 {**base, "b": np.zeros(1, np.int64)}):
        schema.check(cols, 2, 7, "window")
    assert _check_error(schema, {**base, "i": np.zeros(5, np.uint8)}) == (
        "window: column 'i' is uint8[5]; the schema has uint8[0..4]")
    assert _check_error(schema, {**base, "b": np.zeros(0, np.int64)}) == (
        "window: column 'b' is int64[0]; the schema has int64[1..5]")
    assert _check_error(schema, {**base, "p": np.zeros((1, 5), np.uint8)}) == (
        "window: column 'p' is uint8[1, 5]; the schema has uint8[0..48, 6]")
    assert _check_error(schema, {**base, "p": np.zeros((49, 6), np.uint8)}) == (
        "window: column 'p' is uint8[49, 6]; the schema has uint8[0..48, 6]")
    assert _check_error(schema, {**base, "i": np.array(0, np.uint8)}) == (
        "window: column 'i' is uint8[]; the schema has uint8[0..4]")


# -- the schema's own rules ---------------------------------------------------------------------


@pytest.mark.parametrize(("columns", "message"), [
    ((LOSS_MASK, LOSS_MASK), "a sample schema names a column twice: ['loss_mask', 'loss_mask']"),
    ((Column("x", "float32", 0),), "column 'x' has the unknown dtype 'float32'"),
    ((Column("ids", "int32", 2**31),),
     "column 'ids' has the pad 2147483648, which int32 cannot hold (-2147483648..2147483647)"),
    ((Column("mask", "uint8", 0, default=-1),),
     "column 'mask' has the default -1, which uint8 cannot hold (0..255)"),
    ((Column("mask", "uint8", 256),), "column 'mask' has the pad 256, which uint8 cannot hold "
                                      "(0..255)"),
    ((dataclasses.replace(IMAGE, per_token=True),),
     "column 'i' is not a per-image column: per_token True, image 'image', width 0, "
     "patches_per_token 0"),
    ((dataclasses.replace(IMAGE, image="frame"),),
     "column 'i' is not a per-image column: per_token False, image 'frame', width 0, "
     "patches_per_token 0"),
    ((dataclasses.replace(IMAGE, width=-1),),
     "column 'i' is not a per-image column: per_token False, image 'image', width -1, "
     "patches_per_token 0"),
    ((dataclasses.replace(PATCH, patches_per_token=0),),
     "column 'p' is not a per-image column: per_token False, image 'patch', width 6, "
     "patches_per_token 0"),
    ((dataclasses.replace(BOUND, patches_per_token=1),),
     "column 'b' is not a per-image column: per_token False, image 'bound', width 0, "
     "patches_per_token 1"),
    ((dataclasses.replace(BOUND, patches_per_token=-1),),
     "column 'b' is not a per-image column: per_token False, image 'bound', width 0, "
     "patches_per_token -1"),
    ((dataclasses.replace(PATCH, patches_per_token=-4),),
     "column 'p' is not a per-image column: per_token False, image 'patch', width 6, "
     "patches_per_token -4"),
    ((IMAGE, LOSS_MASK),
     "a sample schema's per-image columns come after the others: ['i', 'loss_mask']"),
])
def test_a_schema_refuses_columns_it_cannot_lay_out(columns: tuple[Column, ...],
                                                     message: str) -> None:
    with pytest.raises(ValueError) as info:
        SampleSchema(columns)
    assert str(info.value) == message


def test_the_extreme_values_a_dtype_holds_are_accepted_as_pad_and_default() -> None:
    schema = SampleSchema((Column("a", "int32", -(2**31), default=2**31 - 1),
                           Column("b", "uint8", 255, default=0),
                           Column("c", "int64", 2**63 - 1, default=-(2**63))))
    assert schema.empty(1, 2)["b"].tolist() == [[255, 255]]


def test_per_image_columns_of_every_kind_and_width_are_accepted() -> None:
    schema = SampleSchema((LOSS_MASK, dataclasses.replace(IMAGE, width=0), BOUND, PATCH))
    assert schema.image_columns == (dataclasses.replace(IMAGE, width=0), BOUND, PATCH)


# -- the announced schema -----------------------------------------------------------------------


def test_an_announced_schema_round_trips() -> None:
    for schema in (_text(), _images()):
        assert SampleSchema.from_json(json.loads(schema.dumps())) == schema


def _announced(**change: Any) -> list[dict[str, Any]]:
    data = _images().to_json()
    data[2] = {**data[2], **change}
    return data


def _cut(item: Any, chars: int = 80) -> str:
    """The start of ``item``'s repr that a refusal quotes."""
    return repr(item)[:chars]


def _parse_error(data: Any) -> str:
    with pytest.raises(MismatchError) as info:
        SampleSchema.from_json(data, "the reply's schema")
    return str(info.value)


@pytest.mark.parametrize(("data", "message"), [
    ([], "the reply's schema must be a non-empty list of columns, got []"),
    ({"name": "x"}, "the reply's schema must be a non-empty list of columns, got {'name': 'x'}"),
    (["input_ids"], "the reply's schema[0] is not a column: 'input_ids'"),
    ([{"name": "x"}], "the reply's schema[0] is not a column: {'name': 'x'}"),
    ([{**LOSS_MASK.to_json(), "width": 3}],
     f"the reply's schema[0] is not a column: {_cut({**LOSS_MASK.to_json(), 'width': 3})}"),
    ([{**LOSS_MASK.to_json(), "dtype": "float16"}],
     "the reply's schema[0] has dtype 'float16' and fill 'document'; known: ['int32', "
     "'int64', 'uint8'], document, position"),
    ([{**LOSS_MASK.to_json(), "fill": "copy"}],
     "the reply's schema[0] has dtype 'uint8' and fill 'copy'; known: ['int32', 'int64', "
     "'uint8'], document, position"),
    *(([bad], f"the reply's schema[0] has a malformed field: {_cut(bad)}")
      for bad in ({**LOSS_MASK.to_json(), "pad": True}, {**LOSS_MASK.to_json(), "default": "1"},
                  {**LOSS_MASK.to_json(), "per_token": 1}, {**LOSS_MASK.to_json(), "name": 7})),
    *((_announced(**change), f"the reply's schema[2] is not a per-image column: "
                             f"{_cut(_announced(**change)[2], 120)}")
      for change in ({"image": "frame"}, {"width": True}, {"patches_per_token": 4.0})),
    (_announced(patches_per_token=0),
     "the reply's schema: column 'p' is not a per-image column: per_token False, image "
     "'patch', width 6, patches_per_token 0"),
    ([{**LOSS_MASK.to_json(), "pad": 2**63}],  # numpy would raise OverflowError later
     "the reply's schema: column 'loss_mask' has the pad 9223372036854775808, which uint8 "
     "cannot hold (0..255)"),
    ([LOSS_MASK.to_json(), LOSS_MASK.to_json()],
     "the reply's schema: a sample schema names a column twice: ['loss_mask', 'loss_mask']"),
])
def test_a_malformed_announced_schema_is_refused_naming_the_column(data: Any,
                                                                   message: str) -> None:
    assert _parse_error(data) == message


def test_an_announced_schema_is_named_sample_schema_by_default() -> None:
    with pytest.raises(MismatchError) as info:
        SampleSchema.from_json(None)
    assert str(info.value) == "sample schema must be a non-empty list of columns, got None"
