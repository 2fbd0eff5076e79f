"""The sample grid of docs/vlm.md (datalane/demos/vlm_samples.py): run to a temporary path (the
committed docs/vlm-samples.png is left alone), and what it draws checked against the corpus:
each image un-patchified is exactly that record's image decoded and resized by the recipe's
rule, its caption is the record's caption, and its mask is 0 on the vision tokens and 1 on
the caption's."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datalane.demos import vlm_samples
from datalane.engine.documents.vision import image_rule
from datalane.engine.images import decode, placeholders, resize
from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # a corpus, a loader, twice (about 10 s)


def _records(shards: list[str]) -> dict[str, list[bytes]]:
    """caption -> the images captioned so, from the WebDataset shards."""
    out: dict[str, list[bytes]] = {}
    for shard in shards:
        with tarfile.open(shard) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar  # type: ignore[union-attr]
                       if m.isfile()}
        for name, data in members.items():
            stem, ext = name.rsplit(".", 1)
            if ext in ("jpg", "png", "webp"):
                out.setdefault(members[f"{stem}.txt"].decode().strip(), []).append(data)
    return out


def test_the_script_writes_a_small_png_elsewhere(tmp_path: Path) -> None:
    committed = (REPO / "docs" / "vlm-samples.png").read_bytes()
    out = tmp_path / "grid.png"
    assert vlm_samples.main(["--out", str(out), "--samples", "4"]) == 0
    with Image.open(out) as img:
        assert img.format == "PNG" and img.width >= 4 * vlm_samples.CELL
    assert out.stat().st_size < 300_000
    assert (REPO / "docs" / "vlm-samples.png").read_bytes() == committed
    assert len(committed) < 300_000  # the committed picture stays small too


def test_each_drawn_sample_is_its_records_image_caption_and_mask(tmp_path: Path) -> None:
    recipe, rule, items = vlm_samples.collect(tmp_path / "corpus", 8)
    assert len(items) == 8 and len({s.row for s in items}) > 1  # images of several rows
    spec = recipe.sources[0].vision
    assert spec is not None
    engine = image_rule(spec)
    records = _records(list(recipe.sources[0].uris))
    for s in items:
        candidates = records[s.caption]  # the caption decoded is a record's caption
        want = [np.asarray(resize(decode(data, engine.limits), engine.resize))
                for data in candidates]
        assert any(w.shape == s.pixels.shape and np.array_equal(w, s.pixels) for w in want)
        tokens = placeholders(s.grid_thw, rule.merge_size)
        h, w = s.pixels.shape[:2]
        assert s.grid_thw == (1, h // rule.patch_size, w // rule.patch_size)
        # <|vision_start|>, the placeholders, <|vision_end|>: 0; the caption and EOS: 1
        assert s.mask.tolist() == [0] * (tokens + 2) + [1] * (len(s.mask) - tokens - 2)
        assert len(s.mask) > tokens + 3
