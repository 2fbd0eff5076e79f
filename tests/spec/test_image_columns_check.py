"""What a client accepts of a payload's per-image columns (datalane/spec/imagecolumns.py,
``check``): one count of images throughout, patch starts rising from 0 to the patch rows,
each image's patch rows its grid's t * h * w, every image inside the ``rows`` x
``seq_tokens`` sequences and in order. Each rule by hand, on 2 rows of 10 tokens."""

from __future__ import annotations

import numpy as np
import pytest

from datalane.spec import imagecolumns
from datalane.spec.errors import MismatchError

ROWS, TOKENS = 2, 10


class _Image:
    def __init__(self, rows: int) -> None:
        self.values = np.zeros((rows, 4), dtype=np.uint8)
        self.grid_thw = (1, 2, rows // 2)


def _cols(*where: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """The columns of images ``(row, offset, patch rows)``."""
    return imagecolumns.build([(r, o, _Image(n)) for r, o, n in where], 4)


def _refused(cols: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(MismatchError, match=r"^mb 3: " + message):
        imagecolumns.check(cols, ROWS, TOKENS, "mb 3")


def test_images_at_the_edges_of_the_sequences_are_accepted() -> None:
    """Row 0 token 0, two images in one row, and row 1 token 9 (the last of each) fit."""
    imagecolumns.check(_cols((0, 0, 4), (1, 2, 2), (1, 9, 2)), ROWS, TOKENS, "mb 3")


def test_no_image_at_all_is_accepted() -> None:
    """A microbatch of text only: no image, one patch start (0)."""
    cols = _cols()
    assert cols["image_patch_start"].tolist() == [0]
    imagecolumns.check(cols, ROWS, TOKENS, "mb 3")


@pytest.mark.parametrize("name", ["image_grid_thw", "image_offset", "image_patch_start"])
def test_every_column_counts_the_images_of_image_seq(name: str) -> None:
    """2 images in image_seq: a column with one row less is refused by name."""
    cols = _cols((0, 1, 2), (1, 1, 2))
    cols[name] = cols[name][:-1]
    _refused(cols, rf"column '{name}' describes 1 images; 'image_seq' has 2$")


def test_patch_starts_must_begin_at_0() -> None:
    """Starts [2, 4] over 4 patch rows: the first image's run would begin at row 2."""
    cols = _cols((0, 1, 2), (1, 1, 2))
    cols["image_patch_start"] = np.array([2, 2, 4], dtype=np.int64)
    _refused(cols, r"column 'image_patch_start' \[2, 2, 4\]\.\.\. does not rise from 0 to the 4 "
                   r"rows of 'image_patches'$")


def test_patch_starts_must_not_fall() -> None:
    """Starts [0, 6, 4, 8] over 8 patch rows end right but fall between images 1 and 2."""
    cols = _cols((0, 1, 2), (0, 5, 4), (1, 1, 2))
    cols["image_patch_start"] = np.array([0, 6, 4, 8], dtype=np.int64)
    _refused(cols, r"column 'image_patch_start' \[0, 6, 4, 8\]\.\.\. does not rise")


@pytest.mark.parametrize("where", [
    ((2, 1, 2),), ((-1, 1, 2),), ((0, 10, 2),), ((0, -1, 2),), ((1, 1, 2), (0, 1, 2)),
], ids=["row 2 of 2 rows", "row -1", "token 10 of 10", "token -1", "row 1 before row 0"])
def test_images_outside_the_sequences_or_out_of_order_are_refused(
        where: tuple[tuple[int, int, int], ...]) -> None:
    """Every image's row in 0..rows-1 and token in 0..seq_tokens-1, rows not falling."""
    _refused(_cols(*where), r"columns 'image_seq' and 'image_offset' place images outside 2 "
                            r"sequences of 10 tokens or out of order$")


def test_the_five_columns_of_a_vision_recipe() -> None:
    """Patch rows of 768 bytes (patch size 16) merged 2 x 2: the columns, dtypes, widths and
    pads (0: per-image columns are never padded, but the pad is announced in the schema)."""
    assert [(c.name, c.dtype, c.pad, c.per_token, c.image, c.width, c.patches_per_token)
            for c in imagecolumns.columns(768, 2)] == [
        ("image_patches", "uint8", 0, False, "patch", 768, 4),
        ("image_grid_thw", "int32", 0, False, "image", 3, 0),
        ("image_seq", "int32", 0, False, "image", 0, 0),
        ("image_offset", "int32", 0, False, "image", 0, 0),
        ("image_patch_start", "int64", 0, False, "bound", 0, 0)]


def test_the_refusal_shows_the_first_8_patch_starts() -> None:
    """9 images of 2 patch rows whose last start is off: the message shows 8 of the 10
    starts, then '...'."""
    cols = _cols(*((k // 5, 2 * (k % 5), 2) for k in range(9)))
    cols["image_patch_start"] = cols["image_patch_start"] + 1
    _refused(cols, r"column 'image_patch_start' \[1, 3, 5, 7, 9, 11, 13, 15\]\.\.\. does not "
                   r"rise from 0 to the 18 rows")


@pytest.mark.parametrize(("grid", "rows"), [
    ((1, 2, 2), 3),   # a grid of 4 patches over 3 rows
    ((1, 1, 3), 4),   # 3 patches over 4 rows
    ((2, 1, 2), 2),   # t counts too: 4 patches over 2 rows
    ((1, 0, 2), 0),   # an empty image: a side of 0, no rows
    ((1, -1, -2), 2),  # two negative sides whose product looks right
    # sides whose product is 2**64, 0 in 64-bit integers: an empty image, in exact ones
    ((2**21, 2**21, 2**22), 0),
])
def test_an_image_s_patch_rows_are_its_grid(grid: tuple[int, int, int], rows: int) -> None:
    """Image 1 (of 3) claims ``grid`` over ``rows`` patch rows: refused by its index, with
    its rows and grid; the images around it (2 rows, grid 1 x 2 x 1) are right."""
    cols = _cols((0, 1, 2), (0, 5, 2), (1, 1, 2))
    cols["image_grid_thw"][1] = grid
    starts = [0, 2, 2 + rows, 4 + rows]
    cols["image_patch_start"] = np.array(starts, dtype=np.int64)
    cols["image_patches"] = np.zeros((starts[-1], 4), dtype=np.uint8)
    _refused(cols, rf"image 1 has {rows} patch rows in 'image_patches'; its 'image_grid_thw' "
                   rf"\[{grid[0]}, {grid[1]}, {grid[2]}\] is not a grid of that many patches")


def test_a_grid_of_t_frames_is_t_h_w_rows() -> None:
    """A grid (2, 1, 2) over 4 rows (t * h * w) is accepted."""
    cols = _cols((0, 1, 2), (1, 1, 4))
    cols["image_grid_thw"][1] = (2, 1, 2)
    imagecolumns.check(cols, ROWS, TOKENS, "mb 3")
