"""The unit a trainer receives (datalane/client/batch.py): its defaults, its schema check, its
size and its copy, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from datalane.client.batch import Batch
from datalane.spec.schema import Column, text_schema

CHAT = text_schema(2, extra=(Column("loss_mask", "uint8", 0, default=1),))


def _columns() -> dict[str, np.ndarray]:
    """2 rows of 3 tokens: int32 ids and positions, a uint8 mask."""
    ids = np.array([[5, 6, 7], [8, 9, 2]], dtype=np.int32)
    return {"input_ids": ids, "positions": np.array([[0, 1, 2], [0, 1, -1]], dtype=np.int32),
            "loss_mask": np.array([[1, 1, 0], [0, 1, 1]], dtype=np.uint8)}


def test_a_batch_is_not_ended_and_carries_nothing_else_unless_told() -> None:
    """A new batch has not ended, carries no lane digest, no schema and no trained target."""
    b = Batch(3, 1, _columns())
    assert (b.step, b.index, b.ended, b.lane_digests, b.schema, b.step_tokens) == (
        3, 1, False, {}, None, 0)
    assert Batch(0, 0, _columns()).lane_digests is not b.lane_digests  # one dict each


def test_a_batch_without_a_schema_takes_any_columns() -> None:
    """The schema check needs a schema: without one, columns in any order are accepted."""
    cols = _columns()
    b = Batch(0, 0, {"loss_mask": cols["loss_mask"], "input_ids": cols["input_ids"]})
    assert list(b.columns) == ["loss_mask", "input_ids"]


def test_a_batch_must_have_its_schemas_columns_in_order() -> None:
    """With a schema, the columns are the schema's names in schema order: the same set in
    another order is refused, naming both lists."""
    cols = _columns()
    assert list(Batch(0, 0, cols, schema=CHAT).columns) == ["input_ids", "positions",
                                                            "loss_mask"]
    with pytest.raises(ValueError, match=r"columns \['positions', 'input_ids', 'loss_mask'\] "
                                         r"does not match its schema's \['input_ids', "
                                         r"'positions', 'loss_mask'\]"):
        Batch(0, 0, {k: cols[k] for k in ("positions", "input_ids", "loss_mask")}, schema=CHAT)


def test_nbytes_is_every_columns_bytes() -> None:
    """nbytes sums every column: 2 x 3 x (4 + 4 + 1) = 54 bytes."""
    assert Batch(0, 0, _columns()).nbytes == 54
    assert Batch(0, 0, {}).nbytes == 0


def test_a_copy_keeps_every_field_and_owns_its_columns_and_digests() -> None:
    """copy() carries step, index, ended, the lane digests, the schema and step_tokens, with
    columns and digests of its own (writing to the copy leaves the original as it was)."""
    b = Batch(4, 2, _columns(), ended=True, lane_digests={5: b"\x01" * 8}, schema=CHAT,
              step_tokens=9)
    c = b.copy()
    assert (c.step, c.index, c.ended, c.lane_digests, c.schema, c.step_tokens) == (
        4, 2, True, {5: b"\x01" * 8}, CHAT, 9)
    c.columns["input_ids"][0, 0] = 99
    c.lane_digests[6] = b""
    assert b.columns["input_ids"][0, 0] == 5 and list(b.lane_digests) == [5]
    assert all(np.array_equal(c.columns[k], b.columns[k]) for k in ("positions", "loss_mask"))
