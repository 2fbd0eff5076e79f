"""Vision-language batches: a datalane microbatch with images as TorchTitan's multimodal batch.

:func:`to_vlm` turns one microbatch's columns (``input_ids``, ``positions``, ``loss_mask``
and the five per-image columns of docs/vlm.md) into exactly the ``(input_dict, labels)``
TorchTitan 0.3.0's ``MultiModalCollator`` yields for the same samples
(torchtitan/hf_datasets/multimodal/mm_collator.py), which Qwen3.5's ``forward`` takes as its
keyword arguments:

* ``input`` int64 (B, seq_len), tokens ``0..seq_len-1``; ``labels`` int64 (B, seq_len),
  tokens ``1..seq_len``, -100 where the target is not trained (padding, or a ``loss_mask`` of
  0: the vision kind's start, placeholder and end tokens), as :mod:`datalane.client.torch`
* ``positions`` int64 (B, seq_len): per-document positions, 0 on padding (the collator pads
  with 0; datalane's -1 is clamped)
* ``pixel_values`` float32 (N, max_patches, C * T * ps * ps): each image's uint8 patch rows
  (one frame, block order) normalised through :func:`~datalane.engine.images.normalize`, the
  frame repeated ``temporal_patch_size`` times as ``vision_to_patches`` pads a still image,
  zero-padded to the longest image rounded up to a multiple of ``merge_size**2``; None
  without images
* ``grid_thw`` int64 (N, 3); ``pixel_values_videos`` and ``grid_thw_videos`` None
* ``special_tokens`` ``{image_id, video_id, vision_start_id, vision_end_id, pad_id}``
* ``mrope_positions`` int64 (B, seq_len, 3), with ``mrope=True`` and at least one image:
  :func:`mrope_positions`, the collator's ``_build_mrope_positions``

The images arrive in ``(image_seq, image_offset)`` order, which is the order of their
placeholder runs in the batch and so TorchTitan's: nothing is reordered. Before building
anything :func:`check_images` proves what the model's ``get_vision_positions`` would
otherwise find in the forward pass (or never find, and scatter an image onto the wrong
tokens): every image's run is exactly its grid's token count long, in its row, inside one
document, and the placeholders of the batch are those runs and no others. A microbatch that
breaks it is a :class:`~datalane.spec.errors.DataError` naming the column, the image and the
value. Callers: a trainer's data iterator (docs/vlm.md, "The trainer side").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from datalane.engine.images import PatchRule, normalize
from datalane.engine.plan import Plan
from datalane.spec.errors import ConfigError, DataError, MismatchError
from datalane.spec.schema import SampleSchema
from datalane.spec.targets import IGNORE_INDEX, trained_targets
from datalane.spec.visioncontract import SPECIAL_TOKENS

__all__ = ["IMAGE_COLUMNS", "QWEN35", "SPECIAL_TOKENS", "Images", "VlmSettings", "check_images",
           "mrope_positions", "pixel_values", "to_vlm", "vlm_settings"]

#: The per-image columns of a microbatch (docs/vlm.md, "Per-image columns").
IMAGE_COLUMNS = ("image_patches", "image_grid_thw", "image_seq", "image_offset",
                 "image_patch_start")
#: Qwen3.5's patching and normalisation (torchtitan/models/qwen3_5/config_registry.py).
QWEN35 = PatchRule()


@dataclass(frozen=True)
class VlmSettings:
    """What :func:`to_vlm` needs besides the columns: TorchTitan's five ``special_tokens`` ids
    and the recipe's patching rule (:func:`vlm_settings` reads both from a sample schema)."""

    special_tokens: dict[str, int]
    rule: PatchRule


def vlm_settings(source: Plan | SampleSchema,
                 where: str = "the recipe's sample schema") -> VlmSettings | None:
    """The :class:`VlmSettings` of a recipe's sample schema (a plan's, or the one a sidecar
    announces) from its vision contract (:mod:`datalane.spec.visioncontract`): the ids of the
    recipe tokenizer's vision tokens, ``<|video_pad|>``'s (-1 where the vocabulary has none),
    its pad, and the ``PatchRule`` of the recipe's ``vision`` settings. None for a schema
    without per-image columns; MismatchError naming ``where`` and what is missing for per-image
    columns without a contract (a sidecar that predates it)."""
    schema = source.schema if isinstance(source, Plan) else source
    if not schema.image_columns:
        return None
    c = schema.vision
    if c is None:
        raise MismatchError(
            f"{where} has the per-image columns {[col.name for col in schema.image_columns]} "
            f"but no vision contract: the ids {', '.join(SPECIAL_TOKENS)} and the patch rule "
            f"(patch_size, temporal_patch_size, merge_size, order, image_mean, image_std) that "
            f"TorchTitan's multimodal batch needs. A sidecar that announces images without it "
            f"predates it: upgrade the sidecar (its image) to the trainer's datalane release, "
            f"or pass vlm=VlmSettings(...) to DataLaneDataset")
    rule = PatchRule(c.patch_size, c.temporal_patch_size, c.merge_size, c.order, c.image_mean,
                     c.image_std)
    return VlmSettings(c.special_tokens, rule)


@dataclass(frozen=True)
class Images:
    """A microbatch's images, checked: ``patches`` uint8 (P, 3 * ps * ps); ``grid``,
    ``seq``, ``offset``, ``start`` (N + 1) and ``tokens`` (each image's placeholder count)
    int64."""

    patches: np.ndarray
    grid: np.ndarray
    seq: np.ndarray
    offset: np.ndarray
    start: np.ndarray
    tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.grid)


def _integers(columns: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(columns[name])
    if a.dtype.kind not in "iu" or a.shape != shape:
        want = " x ".join(map(str, shape))
        raise DataError(f"{name}: {a.dtype} of shape {a.shape} is not integers of shape "
                        f"({want})")
    return a.astype(np.int64)


def check_images(columns: Mapping[str, np.ndarray], rule: PatchRule, image_id: int) -> Images:
    """The microbatch's images, once every rule of the module docstring holds on its
    ``input_ids`` and ``positions`` (rows of ``seq_len + 1`` tokens: a run must lie in the
    ``seq_len`` input tokens, and the last token, a target only, holds no placeholder);
    DataError naming the first that fails."""
    full = np.asarray(columns["input_ids"])
    positions = np.asarray(columns["positions"])
    present = [n for n in IMAGE_COLUMNS if n in columns]
    if present and len(present) != len(IMAGE_COLUMNS):
        missing = [n for n in IMAGE_COLUMNS if n not in columns]
        raise DataError(f"the microbatch has {present} but not {missing}: the per-image "
                        f"columns come together")
    if not present:
        columns = {"image_patches": np.zeros((0, 3 * rule.patch_size ** 2), np.uint8),
                   "image_grid_thw": np.zeros((0, 3), np.int32),
                   "image_seq": np.zeros(0, np.int32), "image_offset": np.zeros(0, np.int32),
                   "image_patch_start": np.zeros(1, np.int64)}
    patches = np.asarray(columns["image_patches"])
    width = 3 * rule.patch_size ** 2
    if patches.dtype != np.uint8 or patches.ndim != 2 or patches.shape[1] != width:
        raise DataError(f"image_patches: {patches.dtype} of shape {patches.shape} is not uint8 "
                        f"(P, {width}): one frame of 3 x {rule.patch_size} x "
                        f"{rule.patch_size} pixels a row")
    grid = np.asarray(columns["image_grid_thw"])
    if grid.dtype.kind not in "iu" or grid.ndim != 2 or grid.shape[1] != 3:
        raise DataError(f"image_grid_thw: {grid.dtype} of shape {grid.shape} is not integers "
                        f"of shape (N, 3)")
    n = grid.shape[0]
    grid = grid.astype(np.int64)
    seq = _integers(columns, "image_seq", (n,))
    offset = _integers(columns, "image_offset", (n,))
    start = _integers(columns, "image_patch_start", (n + 1,))
    m = rule.merge_size
    for i, (t, h, w) in enumerate(grid.tolist()):
        if t != 1 or h < m or w < m or h % m or w % m:
            raise DataError(f"image_grid_thw[{i}] = ({t}, {h}, {w}) is not a still image's "
                            f"grid: t = 1, h and w positive multiples of merge_size {m}")
    tokens = grid[:, 0] * (grid[:, 1] // m) * (grid[:, 2] // m)
    rows = np.diff(start)
    if len(rows) and rows.min() < 0:
        at = int(np.argmax(rows < 0)) + 1
        raise DataError(f"image_patch_start {start.tolist()} is not monotone: it decreases at "
                        f"index {at}")
    if start[0] != 0 or start[-1] != len(patches):
        raise DataError(f"image_patch_start runs from {start[0]} to {start[-1]}, not from 0 to "
                        f"the {len(patches)} rows of image_patches")
    wrong = np.flatnonzero(rows != grid.prod(axis=1))
    if len(wrong):
        i = int(wrong[0])
        raise DataError(f"image_patch_start[{i}:{i + 2}] = {start[i:i + 2].tolist()} gives "
                        f"image {i} {rows[i]} patch rows but its grid_thw "
                        f"{tuple(grid[i].tolist())} has {int(grid[i].prod())}")
    batch, seq_len = full.shape[0], full.shape[1] - 1
    for i in range(n):
        s, o, k = int(seq[i]), int(offset[i]), int(tokens[i])
        where = f"image {i} (image_seq {s}, image_offset {o})"
        if not 0 <= s < batch:
            raise DataError(f"image_seq[{i}] = {s} is outside the microbatch's {batch} rows")
        if not 0 <= o < seq_len or o + k > seq_len:
            raise DataError(f"image_offset[{i}] = {o}: {where}'s {k} placeholder tokens do not "
                            f"lie inside the {seq_len} input tokens of the row")
        if i and (s, o) <= (int(seq[i - 1]), int(offset[i - 1])):
            raise DataError(f"{where} comes after image {i - 1} (image_seq {int(seq[i - 1])}, "
                            f"image_offset {int(offset[i - 1])}): images go in (image_seq, "
                            f"image_offset) order")
        is_pad = full[s] == image_id
        end = o + int(np.argmin(is_pad[o:])) if not is_pad[o:].all() else seq_len + 1
        if not is_pad[o] or (o and is_pad[o - 1]) or end - o != k:
            first = o
            while first and is_pad[first - 1]:
                first -= 1
            run = end - first if is_pad[o] else 0
            raise DataError(f"{where}: its grid_thw {tuple(grid[i].tolist())} makes {k} "
                            f"placeholder tokens but the row has a run of {run} "
                            f"(token {image_id}) from token {first if run else o}")
        pos = positions[s, o:o + k]
        if k > 1 and not np.array_equal(np.diff(pos), np.ones(k - 1, pos.dtype)):
            raise DataError(f"{where}: its placeholder run crosses a document boundary (the "
                            f"positions restart inside it)")
    total = int(np.count_nonzero(full == image_id))
    if total != int(tokens.sum()):
        raise DataError(f"the microbatch holds {total} placeholder tokens (token {image_id}) "
                        f"but its {n} images account for {int(tokens.sum())}")
    return Images(patches, grid, seq, offset, start, tokens)


def pixel_values(images: Images, rule: PatchRule) -> torch.Tensor:
    """float32 (N, max_patches, 3 * T * ps * ps): the collator's ``collate_images`` of the
    images (normalised, each frame repeated ``temporal_patch_size`` times, zero-padded to the
    longest image rounded up to ``merge_size**2``)."""
    counts = np.diff(images.start)
    unit = rule.merge_size ** 2
    longest = -(-int(counts.max()) // unit) * unit
    frames, area = rule.temporal_patch_size, rule.patch_size ** 2
    values = normalize(images.patches, rule).reshape(-1, 3, 1, area)
    out = np.zeros((len(images), longest, 3, frames, area), np.float32)
    for i, (a, b) in enumerate(zip(images.start[:-1].tolist(), images.start[1:].tolist(),
                                       strict=True)):
        out[i, :b - a] = values[a:b]  # broadcast over the frames
    return torch.from_numpy(out.reshape(len(images), longest, 3 * frames * area))


def mrope_positions(positions: np.ndarray, images: Images, merge_size: int) -> np.ndarray:
    """int64 (B, seq_len, 3): the collator's ``_build_mrope_positions`` from the input
    ``positions`` (0 on padding) and the checked images. A document starts where positions
    decrease; its text tokens count on all three axes; an image's run gets ``(t, h, w)`` over
    its merged grid plus where it starts; the text after it resumes at the run's largest
    value + 1."""
    batch, seq_len = positions.shape
    out = np.zeros((batch, seq_len, 3), np.int64)
    resets = positions[:, 1:] < positions[:, :-1]
    order = 0  # images are in (row, offset) order
    for r in range(batch):
        starts = [0, *(np.flatnonzero(resets[r]) + 1).tolist()]
        for a, b in zip(starts, [*starts[1:], seq_len], strict=True):
            nxt, cursor = 0, a  # the document's next position, its next token
            while order < len(images) and images.seq[order] == r and images.offset[order] < b:
                o = int(images.offset[order])
                t, h, w = (int(images.grid[order, 0]), int(images.grid[order, 1]) // merge_size,
                           int(images.grid[order, 2]) // merge_size)
                out[r, cursor:o] = nxt + np.arange(o - cursor)[:, None]
                base = nxt + o - cursor
                thw = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w),
                                           indexing="ij"), axis=-1).reshape(-1, 3)
                out[r, o:o + t * h * w] = base + thw
                nxt, cursor = base + max(t, h, w), o + t * h * w
                order += 1
            out[r, cursor:b] = nxt + np.arange(b - cursor)[:, None]
    return out


def to_vlm(columns: Mapping[str, np.ndarray], special_tokens: Mapping[str, int],
           rule: PatchRule = QWEN35, *,
           mrope: bool = True) -> tuple[dict[str, Any], torch.Tensor]:
    """One microbatch (a :class:`~datalane.client.Batch`'s ``columns``) as TorchTitan's
    ``(input_dict, labels)`` (the module docstring). ``special_tokens`` holds the five ids of
    :data:`SPECIAL_TOKENS` (a TorchTitan ``MultiModalTokenizer``'s ``image_id``, ...);
    ``rule`` is the recipe's patching and normalisation (Qwen3.5's by default); ``mrope``:
    add ``mrope_positions`` when the batch has an image (TorchTitan's
    ``build_mrope_positions``)."""
    missing = [k for k in SPECIAL_TOKENS if k not in special_tokens]
    if missing:
        raise ConfigError(f"special_tokens {dict(special_tokens)} lacks {missing}: give the "
                          f"ids of {list(SPECIAL_TOKENS)}")
    if rule.order != "block":
        raise ConfigError(f"images.order {rule.order!r}: TorchTitan's Qwen3.5 batch (and its "
                          f"M-RoPE) needs 'block'")
    specials = {k: int(special_tokens[k]) for k in SPECIAL_TOKENS}
    ids = np.asarray(columns["input_ids"])[:, :-1].astype(np.int64)
    positions = np.maximum(np.asarray(columns["positions"])[:, :-1], 0).astype(np.int64)
    video = np.argwhere(ids == specials["video_id"])
    if len(video):
        r, c = video[0].tolist()
        raise DataError(f"input_ids[{r}, {c}] is the video placeholder {specials['video_id']}: "
                        f"videos are not carried, and TorchTitan would look for their grid")
    images = check_images(columns, rule, specials["image_id"])
    labels = torch.from_numpy(np.asarray(columns["input_ids"])[:, 1:].astype(np.int64))
    labels[torch.from_numpy(~trained_targets(columns))] = IGNORE_INDEX
    has_images = len(images) > 0
    out: dict[str, Any] = {
        "input": torch.from_numpy(ids),
        "positions": torch.from_numpy(positions),
        "pixel_values": pixel_values(images, rule) if has_images else None,
        "grid_thw": torch.from_numpy(images.grid.copy()) if has_images else None,
        "pixel_values_videos": None,
        "grid_thw_videos": None,
        "special_tokens": specials,
    }
    if mrope and has_images:
        out["mrope_positions"] = torch.from_numpy(
            mrope_positions(positions, images, rule.merge_size))
    return out, labels
