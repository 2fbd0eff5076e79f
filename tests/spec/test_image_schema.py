"""Per-image columns in the sample schema (datalane/spec/schema.py, spec/imagecolumns.py): their
capacity, how the schema checks and announces them, and how they follow rows."""

from __future__ import annotations

import numpy as np
import pytest

from datalane.spec import imagecolumns
from datalane.spec.errors import MismatchError
from datalane.spec.schema import Column, SampleSchema, text_schema

LOSS_MASK = Column("loss_mask", "uint8", pad=0, default=1)


def _schema() -> SampleSchema:
    return text_schema(7, (*imagecolumns.columns(768, 2), LOSS_MASK))


def test_per_image_columns_come_last_and_are_bounded_by_the_rows_tokens() -> None:
    schema = _schema()
    assert schema.names == ("input_ids", "positions", "loss_mask", *imagecolumns.NAMES)
    # 2 rows of 2048 tokens: at most 682 runs of 3 tokens a row; at most 2047 placeholders a
    # row (seq_len), 4 patch rows each
    shapes = {f.column.name: f.shape for f in schema.layout(2, 2048)}
    assert shapes["image_patches"] == (2 * 2047 * 4, 768)
    assert shapes["image_grid_thw"] == (1364, 3)
    assert shapes["image_seq"] == shapes["image_offset"] == (1364,)
    assert shapes["image_patch_start"] == (1365,)
    with pytest.raises(ValueError, match="per-image columns come after the others"):
        SampleSchema((*schema.columns[3:4], *schema.columns[:3]))


def test_the_schema_checks_used_rows_against_the_capacity() -> None:
    schema = _schema()
    cols = schema.empty(1, 7)  # 2 images at most (7 // 3), 6 * 4 = 24 patch rows
    assert cols["image_patch_start"].tolist() == [0]
    assert cols["image_patches"].shape == (0, 768)
    schema.check(cols, 1, 7, "here")
    cols.update(imagecolumns.build([], 768))
    cols["image_seq"] = np.zeros(3, dtype=np.int32)
    with pytest.raises(MismatchError, match=r"here: column 'image_seq' is int32\[3\]; the "
                                            r"schema has int32\[0\.\.2\]"):
        schema.check(cols, 1, 7, "here")


def test_the_announced_schema_round_trips_and_refuses_a_malformed_image_column() -> None:
    schema = _schema()
    assert SampleSchema.from_json(schema.to_json()) == schema
    data = schema.to_json()
    data[3] = {**data[3], "image": "frame"}
    with pytest.raises(MismatchError, match=r"sample schema\[3\] is not a per-image column"):
        SampleSchema.from_json(data)


class _Image:
    def __init__(self, rows: int, fill: int, grid: tuple[int, int, int]) -> None:
        self.values = np.full((rows, 2), fill, dtype=np.uint8)
        self.grid_thw = grid


def test_rows_are_renumbered_when_windows_join_and_microbatches_split() -> None:
    a, b, c = _Image(4, 1, (1, 2, 2)), _Image(8, 2, (1, 2, 4)), _Image(4, 3, (1, 2, 2))
    # lane window 0 (rows 0-1): a and b in its row 1; window 1 (rows 0-1): c in its row 0
    w0 = imagecolumns.build([(1, 5, a), (1, 9, b)], 2)
    w1 = imagecolumns.build([(0, 1, c)], 2)
    step = imagecolumns.concat([(0, w0), (2, w1)])
    assert step["image_seq"].tolist() == [1, 1, 2]
    assert step["image_offset"].tolist() == [5, 9, 1]
    assert step["image_patch_start"].tolist() == [0, 4, 12, 16]
    assert step["image_patches"][:, 0].tolist() == [1] * 4 + [2] * 8 + [3] * 4
    # microbatches of one row: none, a and b, c, none
    got = [imagecolumns.select(step, r, r + 1) for r in range(4)]
    assert [g["image_seq"].tolist() for g in got] == [[], [0, 0], [0], []]
    assert [g["image_patch_start"].tolist() for g in got] == [[0], [0, 4, 12], [0, 4], [0]]
    assert got[2]["image_patches"][:, 0].tolist() == [3] * 4
    assert got[2]["image_grid_thw"].tolist() == [[1, 2, 2]]
    assert got[3]["image_patches"].shape == (0, 2)
