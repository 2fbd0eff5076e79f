"""The sample grid of docs/vlm.md: the first images of one global step as the model sees them.

``python -m datalane.demos.vlm_samples --out docs/vlm-samples.png`` writes the generated
image-caption corpus (:func:`datalane.testing.images.make_image_corpus`: JPEG, PNG and WebP
pictures of many sizes and aspect ratios, with captions) and a vision recipe into a temporary
folder, reads step 0 with the in-process loader (the lanes, the packer and the per-image
columns a trainer gets), and draws one cell for each of the step's first ``--samples`` images,
in the order of the step's rows:

* the image as the model sees it: its ``image_patches`` rows un-patchified
  (:func:`datalane.engine.images.unpatchify`) back to pixels at the resized grid, with faint
  lines around each merged patch (one placeholder token each);
* its caption, decoded from the document's ``input_ids`` after ``<|vision_end|>``, with the
  grid and the token counts;
* its mask strip: one square per token of the document, ``loss_mask`` 0 grey (the vision start,
  placeholder and end tokens, which are not trained) and 1 green (the caption and EOS).

The recipe's pixel budget is small (1,024 to 16,384 pixels an image: 1 to 16 placeholder
tokens) so the picture stays small. Runs on CPU in a few seconds; needs Pillow and the
``tokenizers`` package, not torch.
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from tokenizers import Tokenizer

from datalane.client.batch import Batch
from datalane.client.inprocess import InProcessLoader
from datalane.engine.images import PatchRule, placeholders, unpatchify
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe, load_recipe
from datalane.testing.images import make_image_corpus

__all__ = ["Sample", "collect", "draw", "main", "recipe_of", "samples"]

LANES = 4  # one sequence each a step
SEQ_LEN = 255
CELL, MARGIN, LINE, SMALL = 216, 8, 14, 12  # a cell's least width; text line heights
SQUARE, GAP = 5, 1  # a token of the mask strip
MASKED, TRAINED = (150, 150, 150), (46, 160, 67)


@dataclass(frozen=True)
class Sample:
    """One image of the step and its document."""

    row: int  # the sequence of the step holding it
    pixels: np.ndarray  # uint8 (H, W, 3): the patch rows un-patchified
    grid_thw: tuple[int, int, int]
    caption: str  # the document's text after <|vision_end|>, decoded
    mask: np.ndarray  # uint8: loss_mask of every token of the document


def recipe_of(corpus_root: Path, images: int = 24) -> Recipe:
    """The generated corpus and a recipe over it: 4 lanes of one sequence of 256 tokens a step,
    whole documents (bestfit), each image resized to 1,024 to 16,384 pixels."""
    corpus = make_image_corpus(str(corpus_root), images=images, per_shard=8)
    return load_recipe({
        "lanes": LANES, "global_batch_size": LANES, "seq_len": SEQ_LEN,
        "packing": {"algorithm": "bestfit"}, "tokenizer": {"uri": corpus.tokenizer},
        "sources": [{"name": "pairs", "uris": corpus.shards, "chunk_rows": 2,
                     "vision": {"resize": {"min_pixels": 1024, "max_pixels": 16384}}}]})


def samples(batches: Sequence[Batch], rule: PatchRule, tokenizer: Tokenizer,
            count: int) -> list[Sample]:
    """The first ``count`` images of ``batches`` (one step's microbatches, in order)."""
    out: list[Sample] = []
    rows_before = 0
    for batch in batches:
        out.extend(_images(batch, rule, tokenizer, rows_before))
        rows_before += len(batch.input_ids)
    return out[:count]


def _images(batch: Batch, rule: PatchRule, tokenizer: Tokenizer,
            rows_before: int) -> Iterator[Sample]:
    c = batch.columns
    ids, positions, mask = c["input_ids"], c["positions"], c["loss_mask"]
    start = c["image_patch_start"]
    for i, (r, offset) in enumerate(zip(c["image_seq"].tolist(), c["image_offset"].tolist(),
                                        strict=True)):
        t, h, w = (int(v) for v in c["image_grid_thw"][i])
        grid = (t, h, w)
        pixels = unpatchify(c["image_patches"][start[i]:start[i + 1]], grid, rule)
        first = offset  # the document starts where its positions do (0), before the run
        while first > 0 and positions[r, first] != 0:
            first -= 1
        end = offset + 1  # and ends where the next document or the padding starts
        while end < positions.shape[1] and positions[r, end] > 0:
            end += 1
        caption_at = offset + placeholders(grid, rule.merge_size) + 1  # after <|vision_end|>
        text = tokenizer.decode(ids[r, caption_at:end].tolist(), skip_special_tokens=True)
        yield Sample(rows_before + r, pixels, grid, text.strip(), mask[r, first:end].copy())


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size)


def draw(items: Sequence[Sample], columns: int = 4, merge_pixels: int = 32) -> Image.Image:
    """The grid: ``columns`` cells a line, each the image (at its pixels, merged patches
    outlined every ``merge_pixels``), the caption, the counts and the mask strip."""
    box_w = max(s.pixels.shape[1] for s in items)
    box_h = max(s.pixels.shape[0] for s in items)
    cell = max(CELL, box_w + 2 * MARGIN)
    per_line = (cell - 2 * MARGIN) // (SQUARE + GAP)
    strip_lines = max(-(-len(s.mask) // per_line) for s in items)
    text_at = box_h + 2 * MARGIN  # the caption's 3 lines, then 2 of counts, then the strip
    strip_at = text_at + 3 * LINE + 2 * SMALL + 4
    cell_h = strip_at + strip_lines * (SQUARE + GAP) + MARGIN
    head = 44
    lines = -(-len(items) // columns)
    canvas = Image.new("RGB", (columns * cell, head + lines * cell_h), "white")
    pen = ImageDraw.Draw(canvas)
    font, small = _font(12), _font(10)
    pen.text((MARGIN, 6), "One global step: each image as the model sees it (its patches "
             "un-patchified; a square per token), its caption, its tokens' loss_mask",
             fill="black", font=font)
    for x, color, label in ((MARGIN, MASKED, "0: vision start, placeholders, end (not trained)"),
                            (MARGIN + 330, TRAINED, "1: caption and EOS (trained)")):
        pen.rectangle((x, 26, x + 9, 35), fill=color)
        pen.text((x + 14, 24), label, fill="black", font=small)
    for k, s in enumerate(items):
        x0, y0 = (k % columns) * cell, head + (k // columns) * cell_h
        pen.rectangle((x0 + 2, y0 + 2, x0 + cell - 3, y0 + cell_h - 3), outline=(210, 210, 210))
        h, w = s.pixels.shape[:2]
        ix, iy = x0 + (cell - w) // 2, y0 + MARGIN + (box_h - h) // 2
        canvas.paste(Image.fromarray(s.pixels), (ix, iy))
        for gx in range(merge_pixels, w, merge_pixels):  # one placeholder per merged patch
            pen.line((ix + gx, iy, ix + gx, iy + h - 1), fill=(255, 255, 255))
        for gy in range(merge_pixels, h, merge_pixels):
            pen.line((ix, iy + gy, ix + w - 1, iy + gy), fill=(255, 255, 255))
        y = y0 + text_at
        for line in textwrap.wrap(f'"{s.caption}"', (cell - 2 * MARGIN) // 6,
                                  max_lines=3, placeholder=" ..."):
            pen.text((x0 + MARGIN, y), line, fill="black", font=font)
            y += LINE
        _, gh, gw = s.grid_thw
        vision = int((s.mask == 0).sum())
        for i, line in enumerate((f"row {s.row}, {w} x {h} pixels, grid 1 x {gh} x {gw}",
                                  f"{vision} vision + {len(s.mask) - vision} text tokens")):
            pen.text((x0 + MARGIN, y0 + text_at + 3 * LINE + i * SMALL), line,
                     fill=(90, 90, 90), font=small)
        for j, m in enumerate(s.mask.tolist()):
            sx = x0 + MARGIN + (j % per_line) * (SQUARE + GAP)
            sy = y0 + strip_at + (j // per_line) * (SQUARE + GAP)
            pen.rectangle((sx, sy, sx + SQUARE - 1, sy + SQUARE - 1),
                          fill=TRAINED if m else MASKED)
    return canvas


def collect(root: Path, count: int) -> tuple[Recipe, PatchRule, list[Sample]]:
    """Write the corpus under ``root``, read step 0 in-process, and take its first ``count``
    images (with the recipe and the patch rule its schema's vision contract gives)."""
    recipe = recipe_of(root)
    with InProcessLoader(recipe, 0, 1, LANES, Knobs(workers=2)) as loader:
        vision = loader.schema.vision
        assert vision is not None  # a vision recipe's schema carries its contract
        rule = PatchRule(vision.patch_size, vision.temporal_patch_size, vision.merge_size,
                         vision.order, vision.image_mean, vision.image_std)
        step = [b for b, _ in zip(loader, range(loader.per_step), strict=False)]
    tokenizer = Tokenizer.from_file(recipe.tokenizer.uri)
    return recipe, rule, samples(step, rule, tokenizer, count)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datalane.demos.vlm_samples",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/vlm-samples.png", help="the PNG to write")
    parser.add_argument("--samples", type=int, default=8, help="images to draw (default 8)")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error(f"--samples {args.samples} is not a positive count")
    with tempfile.TemporaryDirectory(prefix="vlm-samples-") as tmp:
        _, rule, items = collect(Path(tmp) / "corpus", args.samples)
    if not items:
        parser.error("step 0 holds no image")
    draw(items, merge_pixels=rule.patch_size * rule.merge_size).save(args.out, optimize=True)
    print(f"wrote {args.out}: {len(items)} images of step 0")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
