"""Chaos with a vision recipe (the generated image-caption corpus of
datalane/testing/images.py): two ranks checkpoint at every step while the sidecar is killed
with kill -9, stopped with SIGTERM (some of them inside ``checkpoint()``) and started again,
and rank worker processes are killed; then a world of one rank resumes from the last
committed step, under more faults. Every microbatch is the uninterrupted run's, its per-image
columns (patch rows, grids, offsets) byte for byte; every step's global hash, which covers
them, is the uninterrupted run's; the images in all are as many; the last checkpoint counts
the records and documents an uninterrupted run counts; the ledger audits clean
(:func:`tests.sidecar.chaos.run_chaos`). The sidecar holds few decoded images
(``--image-bytes``), the reference run many: backpressure changes no byte."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from datalane.testing.images import make_image_corpus
from tests.sidecar.chaos import Phase, run_chaos

pytestmark = pytest.mark.slow  # real sidecar processes

#: the most image bytes a document of a sequence holds: 256 tokens x 2**2 patch rows of 768
#: bytes; the sidecar maps two such documents at a time at most (its ``--image-bytes``), the
#: uninterrupted in-process run as many as the default knob allows: the same bytes
DOC = 256 * 4 * 768


def _recipe(root: Path) -> str:
    """12 small generated images (160 pixels a side at most: they decode fast), repeated; 2
    lanes of 4 sequences of 256 tokens a step (an image is 64 placeholders at least, so a
    sequence holds 1 to 3 images)."""
    corpus = make_image_corpus(str(root / "images"), images=12, per_shard=6, max_side=160)
    recipe = {"lanes": 2, "global_batch_size": 8, "seq_len": 255,
              "tokenizer": {"uri": corpus.tokenizer}, "packing": {"algorithm": "bestfit"},
              "shuffle": {"block_size": 4},
              "sources": [{"name": "pairs", "uris": [f"{corpus.root}/*.tar"], "vision": {},
                           "chunk_rows": 3, "epochs": None}]}
    out = root / "vision.yaml"
    out.write_text(yaml.safe_dump(recipe))
    return str(out)


def test_an_image_stream_rides_through_kills_drains_and_a_resize(sidecar, tmp_path) -> None:
    run_chaos(sidecar, _recipe(tmp_path), tmp_path, steps=24, every=1,
              faults=["kill9", "sigterm", "sigterm-in-checkpoint", "kill9-worker",
                      "kill9-worker-in-checkpoint"], seed=2121, within=16,
              flags=("--rank-processes", "2", "--image-bytes", str(2 * DOC)),
              resize=Phase(1, 12, ["kill9", "sigterm-in-checkpoint"], within=8))
