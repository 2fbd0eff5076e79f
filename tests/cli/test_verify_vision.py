"""``datalane verify`` on an image-text recipe: the same batches for worlds that divide the
lanes and one that does not, 1 and 2 workers and resumes on another topology; and nothing lost:
every document and image of the generated corpus is in the batches exactly once in its epoch,
counted from the batches (documents from ``positions``, images from the per-image columns)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from datalane.engine.images import ImageRule, ResizeRule, process
from datalane.engine.loader import Step
from datalane.runner import run_world
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.testing.images import ImageCorpus, make_image_corpus
from datalane.verify import verify

IMAGE, START, END, EOS = 1024, 1026, 1027, 1  # tests/data/vision/tokenizer.json
IMAGES = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> ImageCorpus:
    return make_image_corpus(str(tmp_path_factory.mktemp("verify-vision")), images=IMAGES,
                             per_shard=6)


@pytest.fixture(scope="module")
def recipe_path(corpus: ImageCorpus) -> Path:
    """4 lanes, one sequence of 128 tokens each a step, one epoch; images resized to 64 x 64
    (4 placeholders), so a document is 6 vision tokens, its caption and EOS, 1-3 a sequence:
    the epoch ends after 5 steps, the run goes on with padding."""
    path = Path(corpus.root) / "recipe.json"
    path.write_text(json.dumps({
        "lanes": 4, "global_batch_size": 4, "seq_len": 127, "packing": {"algorithm": "bestfit"},
        "tokenizer": {"uri": corpus.tokenizer},
        "sources": [{"name": "pairs", "uris": corpus.shards, "epochs": 1,
                     "vision": {"resize": {"size": [64, 64]}}}]}))
    return path


def test_verify_agrees_across_worlds_workers_and_resumes(
        recipe_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify(str(recipe_path), 8, [1, 2, 3, 4], [1, 2], [2, 5])
    out = capsys.readouterr().out.splitlines()
    runs = [line for line in out if "->" not in line and line.startswith("world=")]
    resumed = [line for line in out if "->" in line]
    assert len(runs) == 8 and len(resumed) == 16
    for line in runs:  # every topology: the whole corpus, each image with its document
        assert " ok " in line and line.endswith(f"documents {IMAGES:>7} images {IMAGES:>7}")
    assert "world=3 workers=2 -> resume@2 on world=4 workers=1" in "\n".join(resumed)
    # 8 x 8 uninterrupted, 8 x 6 resumed at 2, 8 x 3 at 5
    assert out[-1] == "OK: 24 runs, 136 step hashes compared against world=1 workers=1"


def _expected(corpus: ImageCorpus) -> tuple[Counter[tuple[int, ...]], Counter[str]]:
    """Each corpus pair's document (its tokens) and image (the digest of its patch rows)."""
    import pyarrow.parquet as pq

    tok = Tokenizer.from_file(corpus.tokenizer)
    rule = ImageRule(resize=ResizeRule(size=(64, 64)))
    docs: Counter[tuple[int, ...]] = Counter()
    images: Counter[str] = Counter()
    for row in pq.read_table(corpus.parquet).to_pylist():
        caption = tok.encode(row["caption"].rstrip(), add_special_tokens=False).ids
        docs[(START, *[IMAGE] * 4, END, *caption, EOS)] += 1
        images[hashlib.sha256(process(row["image"], rule, repeat_frames=False)
                              .values.tobytes()).hexdigest()] += 1
    return docs, images


class _Seen:
    """Documents and images read from the batches."""

    def __init__(self) -> None:
        self.docs: Counter[tuple[int, ...]] = Counter()
        self.images: Counter[str] = Counter()

    def __call__(self, rank: int, step: Step) -> None:
        ids, positions = step.columns["input_ids"], step.columns["positions"]
        for row, pos in zip(ids.tolist(), positions.tolist(), strict=True):
            starts = [j for j, p in enumerate(pos) if p == 0]
            for a, b in zip(starts, [*starts[1:], len(pos)], strict=False):
                end = next((j for j in range(a, b) if pos[j] < 0), b)
                self.docs[tuple(row[a:end])] += 1
        start = step.columns["image_patch_start"].tolist()
        patches = step.columns["image_patches"]
        assert len(start) == len(step.columns["image_grid_thw"]) + 1
        for a, b in itertools.pairwise(start):
            self.images[hashlib.sha256(patches[a:b].tobytes()).hexdigest()] += 1


@pytest.mark.parametrize(("world", "workers", "resume"), [(1, 1, None), (3, 2, None),
                                                          (3, 1, (2, 2)), (4, 2, (1, 1))])
def test_every_document_and_image_is_in_the_epoch_once(
        corpus: ImageCorpus, recipe_path: Path, world: int, workers: int,
        resume: tuple[int, int] | None) -> None:
    docs, images = _expected(corpus)
    assert len(docs) == IMAGES and len(images) == IMAGES  # the corpus's pairs are distinct
    recipe = load_recipe(str(recipe_path))
    seen = _Seen()
    if resume is None:
        run = run_world(recipe, world, Knobs(workers=workers), None, on_rank_step=seen)
        assert run.ended
    else:  # the steps before the save on `world`, the rest resumed on another world
        at, other = resume
        first = _Seen()
        saved = run_world(recipe, world, Knobs(workers=workers), 8, save_at=frozenset({at}),
                          on_rank_step=lambda r, s: first(r, s) if s.step < at else None)
        run = run_world(recipe, other, Knobs(workers=workers), None,
                        start=saved.checkpoints[at], on_rank_step=seen)
        assert run.ended
        seen.docs += first.docs
        seen.images += first.images
    assert seen.docs == docs
    assert seen.images == images
