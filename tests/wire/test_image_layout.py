"""Per-image columns in the wire's layout (datalane/wire/layout.py): fixed capacity in a
shared-memory slot after a header of the two counts, used rows inline, and a payload whose
counts or columns do not agree refused by name."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from datalane.spec import imagecolumns
from datalane.spec.errors import MismatchError
from datalane.spec.schema import Column, text_schema
from datalane.wire import datalane_pb2 as pb
from datalane.wire.layout import Layout

_SCHEMA = text_schema(0, (Column("loss_mask", "uint8", 0, default=1),
                          *imagecolumns.columns(4, 2)))


class _Image:
    def __init__(self, rows: int, fill: int) -> None:
        self.values = np.full((rows, 4), fill, dtype=np.uint8)
        self.grid_thw = (1, 2, rows // 2)


def _microbatch() -> dict[str, np.ndarray]:
    """2 rows of 10 tokens: images of 4 and 8 patch rows in row 0 (at 2 and 5), none in 1."""
    cols = {c.name: np.full((2, 10), 1, dtype=c.np_dtype) for c in _SCHEMA
            if not c.per_image}
    cols.update(imagecolumns.build([(0, 2, _Image(4, 7)), (0, 5, _Image(8, 9))], 4))
    return cols


def _announced(layout: Layout) -> Layout:
    reply = pb.OpenReply()
    layout.announce(reply)
    return Layout.announced(reply, "the reply")


def test_a_slot_holds_the_counts_then_the_columns_at_capacity() -> None:
    layout = _announced(Layout.of(_SCHEMA, 2, 10))
    # 16 bytes of counts; 3 per-token columns; 2 x 9 x 4 patch rows; 2 x 3 images
    assert [(f.column.name, f.offset, f.shape) for f in layout.fields] == [
        ("input_ids", 16, (2, 10)), ("positions", 96, (2, 10)), ("loss_mask", 176, (2, 10)),
        ("image_patches", 200, (72, 4)), ("image_grid_thw", 488, (6, 3)),
        ("image_seq", 560, (6,)), ("image_offset", 584, (6,)),
        ("image_patch_start", 608, (7,))]
    buffer = mmap.mmap(-1, 2 * layout.slot_bytes)
    cols = _microbatch()
    layout.write(buffer, layout.slot_bytes, cols)
    assert np.frombuffer(buffer, "<i8", 2, layout.slot_bytes).tolist() == [2, 12]
    views = layout.views(buffer, layout.slot_bytes)
    assert {k: v.tolist() for k, v in views.items()} == {k: v.tolist() for k, v in cols.items()}
    assert views["image_patch_start"].tolist() == [0, 4, 12]
    inline = layout.unpack(layout.pack(cols), "inline")  # only the used rows travel
    assert len(layout.pack(cols)[3]) == 12 * 4
    assert {k: v.tolist() for k, v in inline.items()} == {k: v.tolist() for k, v in cols.items()}


def test_counts_over_the_capacity_or_columns_that_disagree_are_refused() -> None:
    layout = Layout.of(_SCHEMA, 2, 10)
    buffer = mmap.mmap(-1, layout.slot_bytes)
    layout.write(buffer, 0, _microbatch())
    buffer[0:8] = np.array([7], dtype="<i8").tobytes()  # 7 images: 6 fit 2 rows of 10
    with pytest.raises(MismatchError, match=r"slot at byte 0 counts 7 images and 12 patch "
                                            r"rows; it holds at most 6 and 72"):
        layout.views(buffer, 0)
    buffer[0:8] = np.array([1], dtype="<i8").tobytes()  # 1 image: its start ends at 4, not 12
    with pytest.raises(MismatchError, match=r"'image_patch_start' \[0, 4\]\.\.\. does not "
                                            r"rise from 0 to the 12 rows"):
        layout.views(buffer, 0)
    payloads = layout.pack(_microbatch())
    with pytest.raises(MismatchError, match=r"inline: column 'image_grid_thw' describes 1 "
                                            r"images; 'image_seq' has 2"):
        layout.unpack([*payloads[:4], payloads[4][:12], *payloads[5:]], "inline")
    with pytest.raises(MismatchError, match=r"per-image column 'image_patches' has 6 bytes"):
        layout.unpack([*payloads[:3], b"\0" * 6, *payloads[4:]], "inline")


def _images(n: int, width: int = 4, rows: int = 2) -> dict[str, np.ndarray]:
    """The text columns of 2 rows of 10 tokens and ``n`` images of ``rows`` patch rows of
    ``width`` bytes (3 a row at tokens 0, 3 and 6)."""
    cols = {c.name: np.full((2, 10), 1, dtype=c.np_dtype) for c in _SCHEMA
            if not c.per_image}
    where = [(k // 3, 3 * (k % 3), _Image(rows, k)) for k in range(n)]
    for _, _, image in where:
        image.values = np.full((rows, width), 1, dtype=np.uint8)
    cols.update(imagecolumns.build(where, width))
    return cols


def test_per_image_columns_up_to_their_capacity_are_packed_and_no_more() -> None:
    """2 rows of 10 tokens hold at most 6 images (a run is 3 tokens at least): 6 are packed,
    their used rows only; a 7th is refused, and so are patch rows of another width."""
    layout = Layout.of(_SCHEMA, 2, 10)
    packed = layout.pack(_images(6))
    assert [len(p) for p in packed[3:]] == [12 * 4, 6 * 3 * 4, 6 * 4, 6 * 4, 7 * 8]
    with pytest.raises(ValueError, match=r"^column 'image_grid_thw' has the shape \[7, 3\]; the "
                                         r"layout has \[6, 3\]$"):
        layout.pack(_images(7))
    with pytest.raises(ValueError, match=r"^column 'image_patches' has the shape \[12, 5\]; the "
                                         r"layout has \[72, 4\]$"):
        layout.pack(_images(6, width=5))


def test_inline_per_image_columns_up_to_their_capacity_are_read_and_no_more() -> None:
    """Inline buffers carry the used rows: 6 images (the capacity of 2 rows of 10 tokens)
    are read back; 7 rows of image_grid_thw (84 bytes) are refused."""
    layout = Layout.of(_SCHEMA, 2, 10)
    packed = layout.pack(_images(6))
    got = layout.unpack(packed, "inline")
    assert got["image_seq"].tolist() == [0, 0, 0, 1, 1, 1]
    assert got["image_offset"].tolist() == [0, 3, 6, 0, 3, 6]
    with pytest.raises(MismatchError, match=r"^inline: per-image column 'image_grid_thw' has 84 "
                                            r"bytes; the layout holds up to 6 rows of 12$"):
        layout.unpack([*packed[:4], packed[4] + packed[4][:12], *packed[5:]], "inline")


@pytest.mark.parametrize(("images", "rows"), [(0, 0), (6, 12)])
def test_a_slot_of_no_image_or_of_images_at_capacity_is_read(images: int, rows: int) -> None:
    """The counts' bounds are inclusive: a vision recipe's microbatch of text only (0 images,
    0 patch rows) and one at the capacity of 2 rows of 10 tokens (6 images, 72 = 6 x 12 patch
    rows) are read from their slot."""
    layout = Layout.of(_SCHEMA, 2, 10)
    buffer = mmap.mmap(-1, layout.slot_bytes)
    layout.write(buffer, 0, _images(images, rows=rows))
    assert np.frombuffer(buffer, "<i8", 2, 0).tolist() == [images, images * rows]
    views = layout.views(buffer, 0)
    assert views["image_patches"].shape == (images * rows, 4)
    assert views["image_patch_start"].tolist() == [rows * k for k in range(images + 1)]


def test_a_per_image_column_announced_at_another_capacity_is_refused() -> None:
    """2 rows of 10 tokens hold at most 6 images: image_seq laid out for 5 is refused, naming
    the capacity."""
    reply = pb.OpenReply()
    Layout.of(_SCHEMA, 2, 10).announce(reply)
    f = next(f for f in reply.layout if f.name == "image_seq")
    f.shape[0], f.nbytes = 5, 20
    with pytest.raises(MismatchError, match=r"^the reply: per-image column 'image_seq' is laid "
                                            r"out as \[5\]; \[2, 10\] tokens hold at most \[6\]$"):
        Layout.announced(reply, "the reply")
