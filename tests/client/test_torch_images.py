"""The torch adapter over a vision recipe (datalane/client/torch.py): per-image columns come
as they are, int32 as int64, and the labels are -100 on the vision tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datalane.client import InProcessLoader
from datalane.spec.knobs import Knobs
from tests.support.vision import vision_recipe, write_three

torch = pytest.importorskip("torch")


def test_a_vision_microbatch_as_tensors(tmp_path: Path) -> None:
    from datalane.client.torch import to_tensors

    path, rows = write_three(tmp_path / "abc.tar")
    recipe = vision_recipe([str(path)], 255, global_batch_size=2)
    with InProcessLoader(recipe, 0, 1, 2, Knobs(workers=2)) as loader:
        batch = next(iter(loader))
    got = to_tensors(batch)
    # the three images of tests/engine/images/test_image_columns.py: A and B in row 0, C in 1
    assert got["image_grid_thw"].dtype == torch.int64
    assert got["image_grid_thw"].tolist() == [[1, 14, 20], [1, 16, 32], [1, 16, 16]]
    assert got["image_seq"].tolist() == [0, 0, 1] and got["image_offset"].tolist() == [1, 82, 1]
    assert got["image_patch_start"].tolist() == [0, 280, 792, 1048]
    assert got["image_patches"].dtype == torch.uint8
    np.testing.assert_array_equal(got["image_patches"].numpy(), np.concatenate(rows))
    # targets: label j is token j + 1; A's run is tokens 0..71 of row 0 (start, 70 pads, end)
    assert got["labels"][0, :71].tolist() == [-100] * 71
    assert got["labels"][0, 71] == batch.columns["input_ids"][0, 72]
    assert got["input_ids"].shape == (2, 255)
