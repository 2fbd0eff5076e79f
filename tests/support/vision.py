"""Hand-worked WebDataset shards of image-caption pairs, and the recipe that reads one
(tests/engine/images: the vision kind, its per-image columns).

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

from PIL import Image
from tokenizers import Tokenizer

from datalane.corpus_images import synthetic_image
from datalane.spec.recipe import Recipe, load_recipe
from tests.support.kinds import VISION_TOKENIZER

__all__ = ["END", "EOS", "PAD", "START", "caption", "encoded", "vision_recipe", "write_shard"]

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
