"""Hand-worked WebDataset shards of image-caption pairs, and the recipe that reads one
(tests/engine/images: the vision kind, its per-image columns); Parquet files of interleaved
rows (the interleaved kind).

The ids of the vision tokens are those of tests/data/vision/tokenizer.json (datalane's bundled
tokenizer with Qwen's vision tokens added; it adds EOS, not BOS). A 96 x 64 JPEG grows to
320 x 224 by TorchTitan's rule: grid (1, 14, 20), 70 placeholders; a 512 x 256 PNG stays:
grid (1, 16, 32), 128 placeholders; a 64 x 64 one grows to 256 x 256: grid (1, 16, 16), 64.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tokenizers import Tokenizer

from datalane.engine.images import ImageRule, process
from datalane.spec.recipe import Recipe, load_recipe
from datalane.testing.images import synthetic_image
from tests.support.kinds import VISION_TOKENIZER

__all__ = ["END", "EOS", "PAD", "START", "caption", "encoded", "vision_recipe",
           "write_interleaved", "write_shard", "write_three"]

START, PAD, END, EOS = 1026, 1024, 1027, 1


def encoded(width: int, height: int, fmt: str, seed: int) -> bytes:
    """A synthetic image of ``width`` x ``height`` pixels, encoded as ``fmt``."""
    buf = io.BytesIO()
    Image.fromarray(synthetic_image(seed, width, height)).save(buf, fmt)
    return buf.getvalue()


def write_shard(path: Path, samples: list[list[tuple[str, bytes]]]) -> None:
    """A tar of samples ``000``, ``001``, ...: each a list of (extension, member bytes)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for k, members in enumerate(samples):
            for ext, data in members:
                info = tarfile.TarInfo(f"{k:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def write_interleaved(path: Path, rows: list[tuple[list[Any], list[Any]]]) -> Path:
    """A Parquet file of OBELICS-style rows: each (texts, images), two lists of one length,
    ``None`` where the other list holds the entry."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({
        "texts": pa.array([t for t, _ in rows], pa.list_(pa.string())),
        "images": pa.array([i for _, i in rows], pa.list_(pa.binary()))}), path)
    return path


def vision_recipe(uris: list[str], seq_len: int, tokenizer: str = str(VISION_TOKENIZER),
                  **extra: Any) -> Recipe:
    """One lane, one sequence a step (unless ``extra`` says more), bestfit, blocks of 1
    record (the shard's order)."""
    base: dict[str, Any] = {
        "lanes": 1, "global_batch_size": 1, "seq_len": seq_len,
        "tokenizer": {"uri": tokenizer}, "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 1},
        "sources": [{"name": "pairs", "uris": uris, "vision": {}}]}
    return load_recipe({**base, **extra})


def caption(text: str) -> list[int]:
    """The caption's token ids (tokenized alone, no special tokens)."""
    tok = Tokenizer.from_file(str(VISION_TOKENIZER))
    return list(tok.encode(text, add_special_tokens=False).ids)


def write_three(path: Path) -> tuple[Path, list[np.ndarray]]:
    """The shard of tests/engine/images/test_image_columns.py: A (a 96 x 64 JPEG, "a red
    square"), B (a 512 x 256 PNG, "two blue discs"), C (a 64 x 64 PNG, "a dark sky"); and each
    image's patch rows (one frame: 280, 512 and 256 rows of 768 bytes)."""
    images = [encoded(96, 64, "JPEG", 1), encoded(512, 256, "PNG", 2),
              encoded(64, 64, "PNG", 3)]
    write_shard(path, [[("jpg", images[0]), ("txt", b"a red square")],
                       [("png", images[1]), ("txt", b"two blue discs")],
                       [("png", images[2]), ("txt", b"a dark sky")]])
    rows = [process(data, ImageRule(), repeat_frames=False).values for data in images]
    assert [r.shape for r in rows] == [(280, 768), (512, 768), (256, 768)]
    return path, rows
