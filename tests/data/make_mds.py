"""Write the MDS test shards in tests/data/mds with MosaicML Streaming's own ``MDSWriter``.

The shards are committed (``mosaicml-streaming`` pins numpy, transformers and huggingface_hub
versions that conflict with the dev environment, so it is not a test dependency); datalane's
reader (``datalane/engine/formats/mds.py``) is tested against these bytes. To regenerate::

    pip install --no-deps --target /tmp/mds mosaicml-streaming==0.13.0 brotli python-snappy \\
        zstd xxhash catalogue torchvision cramjam
    PYTHONPATH=/tmp/mds .venv/bin/python -m tests.data.make_mds

``text/``: 240 samples in 4 uncompressed shards, columns of many encodings; ``zstd/``: 60
samples in 2 zstd-compressed shards. Every value is a function of the sample number below.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mds")
WORDS = ["river", "stone", "lamp", "orbit", "cedar", "pixel", "quartz", "meadow", "signal",
         "harbor", "violet", "ember", "tundra", "copper", "lantern", "willow"]
TEXT_SAMPLES = 240
ZSTD_SAMPLES = 60
COLUMNS = {"id": "int", "text": "str", "raw": "bytes", "meta": "json", "score": "float32",
           "ids": "ndarray:int32", "grid": "ndarray", "big": "str_int", "small": "uint16"}


def text_of(prefix: str, i: int) -> str:
    """Document ``i``: its number first, then 3-14 words (some of them non-ASCII)."""
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 12)]
    if i % 9 == 4:
        words.append("café")
    return f"{prefix} doc {i} " + " ".join(words)


def sample(i: int) -> dict[str, object]:
    return {
        "id": i,
        "text": text_of("mds", i),
        "raw": text_of("raw", i).encode(),
        "meta": {"n": i, "text": text_of("meta", i)},
        "score": np.float32(i / 4),
        "ids": np.arange(i % 5 + 1, dtype=np.int32) + i,
        "grid": np.full((2, i % 3 + 1), i, dtype=np.int64),
        "big": 10 ** 30 + i,
        "small": i,
    }


def main() -> None:
    from streaming import MDSWriter

    for name in ("text", "zstd"):
        shutil.rmtree(os.path.join(HERE, name), ignore_errors=True)
    with MDSWriter(out=os.path.join(HERE, "text"), columns=COLUMNS, size_limit=24_000) as w:
        for i in range(TEXT_SAMPLES):
            w.write(sample(i))
    with MDSWriter(out=os.path.join(HERE, "zstd"), columns={"id": "int", "text": "str"},
                   compression="zstd", size_limit=4_000) as w:
        for i in range(ZSTD_SAMPLES):
            w.write({"id": i, "text": text_of("zmds", i)})


if __name__ == "__main__":
    main()
