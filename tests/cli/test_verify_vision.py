"""``datalane verify`` on the vision-language recipes (image-caption pairs, interleaved
documents, LLaVA conversations): the same batches for worlds that divide the lanes and one
that does not, 1 and 2 workers and resumes on another topology; and nothing lost: every
document and image of the generated corpus is in the batches exactly once in its epoch,
counted from the batches (documents from ``positions``, images from the per-image columns).

The expected documents are rendered as TorchTitan does (the text with each image's run
``vision_start image_pad x 4 vision_end`` in its marker's place, tokenized whole), not by the
kinds under test; the expected images are each file's patch rows, processed alone."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from datalane.engine.images import ImageRule, ResizeRule, process
from datalane.engine.loader import Step
from datalane.runner import run_world
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.testing.images import (
    CHATML_TEMPLATE,
    ImageCorpus,
    make_image_corpus,
    make_llava_corpus,
)
from datalane.verify import verify
from tests.support.vision import write_interleaved

IMAGE, START, END, EOS = 1024, 1026, 1027, 1  # tests/data/vision/tokenizer.json
IMAGES = 24
RUN = "<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>"  # a 64 x 64 image's run
RESIZE = {"resize": {"size": [64, 64]}}


@dataclass(frozen=True)
class Case:
    """A recipe (4 lanes, one sequence a step, one epoch; images resized to 64 x 64: 4
    placeholders) and what its epoch holds: each document's tokens, each image's digest."""

    recipe: Path
    docs: Counter[tuple[int, ...]]
    images: Counter[str]


def _digest(data: bytes) -> str:
    rows = process(data, ImageRule(resize=ResizeRule(size=(64, 64))), repeat_frames=False)
    return hashlib.sha256(rows.values.tobytes()).hexdigest()


def _recipe(path: Path, seq_len: int, source: dict[str, Any], name: str = "docs") -> Path:
    """The recipe of one source, beside its corpus's vision tokenizer (the source's name
    seeds its shuffle)."""
    path.write_text(json.dumps({
        "lanes": 4, "global_batch_size": 4, "seq_len": seq_len,
        "packing": {"algorithm": "bestfit"},
        "tokenizer": {"uri": str(path.parent / "tokenizer.json")},
        "sources": [{"name": name, "epochs": 1, **source}]}))
    return path


def _pairs(corpus: ImageCorpus) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(corpus.parquet).to_pylist()
    return rows


def _vision(corpus: ImageCorpus) -> Case:
    """The corpus's pairs: a document is 6 vision tokens, its caption and EOS, 1-3 a
    sequence of 128: the epoch ends after 5 steps, the run goes on with padding."""
    tok = Tokenizer.from_file(corpus.tokenizer)
    docs: Counter[tuple[int, ...]] = Counter()
    images: Counter[str] = Counter()
    for row in _pairs(corpus):
        caption = tok.encode(row["caption"].rstrip(), add_special_tokens=False).ids
        docs[(START, *[IMAGE] * 4, END, *caption, EOS)] += 1
        images[_digest(row["image"])] += 1
    recipe = _recipe(Path(corpus.root) / "vision.json", 127,
                     {"uris": corpus.shards, "vision": RESIZE}, name="pairs")
    return Case(recipe, docs, images)


def _interleaved(corpus: ImageCorpus) -> Case:
    """The same pictures and captions as 13 OBELICS rows: 1, 2, 3, 1, 2, ... images each
    (the caption before its image, or after it in odd rows), then a row of text only."""
    tok = Tokenizer.from_file(corpus.tokenizer)
    pairs = _pairs(corpus)
    rows: list[tuple[list[Any], list[Any]]] = []
    docs: Counter[tuple[int, ...]] = Counter()
    taken = 0
    for k in itertools.count():
        group = pairs[taken:taken + k % 3 + 1]
        if not group:
            break
        taken += len(group)
        entries: list[tuple[str | None, bytes | None]] = []
        for p in group:
            text, image = (f" {p['caption']}. ", None), (None, p["image"])
            entries += [image, text] if k % 2 else [text, image]
        rows.append(([t for t, _ in entries], [i for _, i in entries]))
        rendered = "".join(RUN if t is None else t for t, _ in entries).strip()
        docs[(*tok.encode(rendered, add_special_tokens=False).ids, EOS)] += 1
    rows.append((["  a page without pictures  "], [None]))
    docs[(*tok.encode("a page without pictures", add_special_tokens=False).ids, EOS)] += 1
    assert len(rows) == 13 and taken == IMAGES
    path = write_interleaved(Path(corpus.root) / "interleaved.parquet", rows)
    recipe = _recipe(Path(corpus.root) / "interleaved.json", 255,
                     {"uris": [str(path)], "chunk_rows": 3, "interleaved": RESIZE})
    return Case(recipe, docs, Counter(_digest(p["image"]) for p in pairs))


def _llava(root: Path) -> Case:
    """make_llava_corpus's 24 records (i % 4 == 3 text only: 6; i % 5 == 4 otherwise two
    images: 4, 9 and 14; the other 15 one: 21 images), each rendered with the ChatML
    template."""
    import jinja2

    corpus = make_llava_corpus(str(root), records=IMAGES)
    tok = Tokenizer.from_file(corpus.tokenizer)
    template = jinja2.Template(CHATML_TEMPLATE)
    docs: Counter[tuple[int, ...]] = Counter()
    images: Counter[str] = Counter()
    for record in corpus.records:
        turns: Any = record["conversations"]
        messages = [{"role": {"human": "user", "gpt": "assistant"}[t["from"]],
                     "content": t["value"]} for t in turns]
        text = template.render(messages=messages, add_generation_prompt=False)
        docs[tuple(tok.encode(text.replace("<image>", RUN), add_special_tokens=False).ids)] += 1
        named: Any = record.get("image", [])
        for name in [named] if isinstance(named, str) else named:
            images[_digest((root / name).read_bytes())] += 1
    assert len(docs) == IMAGES and sum(images.values()) == corpus.images == 21
    llava = {"template_text": CHATML_TEMPLATE, **RESIZE}
    recipe = _recipe(root / "llava-recipe.json", 511,
                     {"uris": [corpus.json], "chunk_bytes": 1024, "llava": llava})
    return Case(recipe, docs, images)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> ImageCorpus:
    return make_image_corpus(str(tmp_path_factory.mktemp("verify-vision")), images=IMAGES,
                             per_shard=6)


@pytest.fixture(scope="module", params=["vision", "interleaved", "llava"])
def case(request: pytest.FixtureRequest, corpus: ImageCorpus,
         tmp_path_factory: pytest.TempPathFactory) -> Case:
    if request.param == "llava":
        return _llava(tmp_path_factory.mktemp("verify-llava"))
    made: Case = {"vision": _vision, "interleaved": _interleaved}[request.param](corpus)
    return made


def test_verify_agrees_across_worlds_workers_and_resumes(
        case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify(str(case.recipe), 8, [1, 2, 3, 4], [1, 2], [2, 5])
    out = capsys.readouterr().out.splitlines()
    runs = [line for line in out if "->" not in line and line.startswith("world=")]
    resumed = [line for line in out if "->" in line]
    assert len(runs) == 8 and len(resumed) == 16
    docs, images = case.docs.total(), case.images.total()
    for line in runs:  # every topology: the whole corpus, each image with its document
        assert " ok " in line and line.endswith(f"documents {docs:>7} images {images:>7}")
    assert "world=3 workers=2 -> resume@2 on world=4 workers=1" in "\n".join(resumed)
    # 8 x 8 uninterrupted, 8 x 6 resumed at 2, 8 x 3 at 5
    assert out[-1] == "OK: 24 runs, 136 step hashes compared against world=1 workers=1"


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
        case: Case, world: int, workers: int, resume: tuple[int, int] | None) -> None:
    assert set(case.docs.values()) == {1}  # the corpus's documents are distinct
    recipe = load_recipe(str(case.recipe))
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
    assert seen.docs == case.docs
    assert seen.images == case.images
