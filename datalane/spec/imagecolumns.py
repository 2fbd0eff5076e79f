"""The per-image columns of a vision recipe, and how they follow the rows they belong to.

Every image a microbatch (a lane window, a step) holds is one row of ``image_grid_thw``,
``image_seq`` and ``image_offset``, its patch rows a run of ``image_patches``, and
``image_patch_start`` (one more row) where each run starts (docs/vlm.md, Per-image columns):

* ``image_patches`` uint8 ``(P, 3 * patch_size**2)``: every image's patch rows (one frame),
  in image order;
* ``image_grid_thw`` int32 ``(N, 3)``: each image's grid of patches;
* ``image_seq`` int32 ``(N,)``: the row (sequence) holding its placeholder run;
* ``image_offset`` int32 ``(N,)``: the token index in that row of its first placeholder;
* ``image_patch_start`` int64 ``(N + 1,)``: where each image's rows start in
  ``image_patches``, then ``P``.

Images are in ``(image_seq, image_offset)`` order. ``image_seq`` counts rows from the start of
what the columns belong to, so a lane window's images say the same whatever the world, and a
step's (lanes' windows one after another) or a microbatch's (a range of the step's rows) are
renumbered by :func:`concat` and :func:`select`. Callers: the lane (:func:`build` from the
images its packer placed), the loader (steps, microbatches), the vision kind (:func:`columns`),
the wire's layout (:func:`check` on what a client receives).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from datalane.spec.errors import MismatchError
from datalane.spec.schema import Column

__all__ = ["NAMES", "ImageRows", "build", "check", "columns", "concat", "select"]

PATCHES, GRID, SEQ, OFFSET, START = ("image_patches", "image_grid_thw", "image_seq",
                                     "image_offset", "image_patch_start")
NAMES = (PATCHES, GRID, SEQ, OFFSET, START)  # schema (and hash) order


class ImageRows(Protocol):
    """One image's rows (:class:`datalane.engine.images.Patches`)."""

    values: np.ndarray  # uint8 (patch rows, width)
    grid_thw: tuple[int, int, int]


def columns(width: int, merge_size: int) -> tuple[Column, ...]:
    """The five per-image columns of images cut into patch rows of ``width`` bytes (one frame:
    ``3 * patch_size**2``), ``merge_size**2`` patches to a placeholder token."""
    return (Column(PATCHES, "uint8", 0, per_token=False, image="patch", width=width,
                   patches_per_token=merge_size * merge_size),
            Column(GRID, "int32", 0, per_token=False, image="image", width=3),
            Column(SEQ, "int32", 0, per_token=False, image="image"),
            Column(OFFSET, "int32", 0, per_token=False, image="image"),
            Column(START, "int64", 0, per_token=False, image="bound"))


def build(images: Sequence[tuple[int, int, ImageRows]], width: int) -> dict[str, np.ndarray]:
    """The columns of ``images``, ``(row, offset of its first placeholder, rows)`` in
    ``(row, offset)`` order, with patch rows of ``width`` bytes."""
    n = len(images)
    counts = np.fromiter((len(v.values) for _, _, v in images), dtype=np.int64, count=n)
    start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    patches = (np.concatenate([v.values for _, _, v in images]) if n
               else np.zeros((0, width), dtype=np.uint8))
    return {PATCHES: patches,
            GRID: np.array([v.grid_thw for _, _, v in images], dtype=np.int32).reshape(n, 3),
            SEQ: np.array([r for r, _, _ in images], dtype=np.int32),
            OFFSET: np.array([o for _, o, _ in images], dtype=np.int32),
            START: start}


def concat(parts: Sequence[tuple[int, Mapping[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """The columns of several row ranges one after another: ``(first row, columns)`` each
    (a step's lane windows), rows and patch starts renumbered."""
    seq, starts = [], []
    at = 0
    for first, cols in parts:
        seq.append(cols[SEQ] + np.int32(first))
        starts.append(cols[START][:-1] + at)
        at += int(cols[START][-1])
    return {PATCHES: np.concatenate([c[PATCHES] for _, c in parts]),
            GRID: np.concatenate([c[GRID] for _, c in parts]),
            SEQ: np.concatenate(seq).astype(np.int32, copy=False),
            OFFSET: np.concatenate([c[OFFSET] for _, c in parts]),
            START: np.concatenate([*starts, np.array([at], dtype=np.int64)])}


def select(cols: Mapping[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    """The columns of rows ``start .. stop - 1`` (a microbatch of a step), renumbered from 0;
    the patch rows are a view."""
    seq = cols[SEQ]
    lo, hi = int(np.searchsorted(seq, start)), int(np.searchsorted(seq, stop))
    bounds = cols[START][lo:hi + 1]
    first = int(bounds[0])
    return {PATCHES: cols[PATCHES][first:int(bounds[-1])],
            GRID: cols[GRID][lo:hi],
            SEQ: seq[lo:hi] - np.int32(start),
            OFFSET: cols[OFFSET][lo:hi],
            START: bounds - first}


def check(cols: Mapping[str, np.ndarray], rows: int, seq_tokens: int, where: str) -> None:
    """Refuse per-image columns that do not describe images of ``rows`` sequences of
    ``seq_tokens`` tokens (a payload from the wire): one count of images throughout, patch
    starts from 0 rising to the patch rows, each image's patch rows its grid's ``t * h * w``
    (no side under 1), rows and offsets inside the sequences, in order.
    MismatchError naming ``where`` and the column."""
    n, start, seq = len(cols[SEQ]), cols[START], cols[SEQ]
    counts = {GRID: len(cols[GRID]), OFFSET: len(cols[OFFSET]), START: len(start) - 1}
    for name, count in counts.items():
        if count != n:
            raise MismatchError(f"{where}: column {name!r} describes {count} images; "
                                f"{SEQ!r} has {n}")
    if start[0] != 0 or start[-1] != len(cols[PATCHES]) or (np.diff(start) < 0).any():
        raise MismatchError(f"{where}: column {START!r} {start[:8].tolist()}... does not rise "
                            f"from 0 to the {len(cols[PATCHES])} rows of {PATCHES!r}")
    # each image's run of patch rows is its grid (t * h * w), never empty; in Python's
    # integers, which no hostile grid overflows into a match ((n, 3): the layout checked it)
    for i, (grid, got) in enumerate(zip(cols[GRID].tolist(), np.diff(start).tolist(),
                                        strict=True)):
        t, h, w = grid
        if min(t, h, w) < 1 or t * h * w != got:
            raise MismatchError(f"{where}: image {i} has {got} patch rows in {PATCHES!r}; its "
                                f"{GRID!r} {grid} is not a grid of that many patches "
                                f"(t * h * w, each at least 1)")
    offset = cols[OFFSET]
    if n and (seq.min() < 0 or seq.max() >= rows or offset.min() < 0
              or offset.max() >= seq_tokens or (np.diff(seq) < 0).any()):
        raise MismatchError(f"{where}: columns {SEQ!r} and {OFFSET!r} place images outside "
                            f"{rows} sequences of {seq_tokens} tokens or out of order")
