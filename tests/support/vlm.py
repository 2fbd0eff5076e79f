"""Microbatches with images, laid out by hand, and the same samples as TorchTitan sees them.

A :class:`Doc` is one document: its tokens, its loss mask, and its images (each a token offset
in the document and datalane's :class:`~datalane.engine.images.Patches` of it).
:func:`microbatch` lays documents into rows of ``seq_len + 1`` tokens (each row's documents one
after the other, then padding) and writes the columns a datalane microbatch carries, the five
per-image columns of docs/vlm.md included. The TorchTitan side of the same documents comes
from TorchTitan's own code: :func:`titan_sample` runs its ``_process_mm_sample`` on a lossless
PNG of the very pixels datalane patched (already on the grid, so TorchTitan decodes and
normalises them without resizing) and :func:`titan_rows` merges each row's samples with
``MMSamplePacker._merge_samples``, as its packer does.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from datalane.engine.images import ImageRule, Patches, ResizeRule, decode, patchify, resize
from datalane.testing.images import VISION_TOKENS, write_vision_tokenizer

#: Small images (at most 128 placeholder tokens) keep rows and the model test small.
RULE = ImageRule(resize=ResizeRule(max_pixels=2 * 65536))


@dataclass
class Doc:
    ids: list[int]
    mask: list[int]  # loss_mask: 1 where the token is trained on as a target
    images: list[tuple[int, Patches]] = field(default_factory=list)  # (offset in doc, patches)


@dataclass
class Picture:
    patches: Patches  # datalane's, one frame (repeat_frames=False)
    png: bytes  # the resized pixels, losslessly


def picture(data: bytes, rule: ImageRule = RULE) -> Picture:
    """datalane's patches of an encoded image and a PNG of the pixels they were cut from."""
    from PIL import Image

    pixels = np.asarray(resize(decode(data, rule.limits), rule.resize))
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return Picture(patchify(pixels, rule.patches, repeat_frames=False), buf.getvalue())


def microbatch(rows: list[list[Doc]], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """The columns of one microbatch: the rows' documents, then padding (``pad_id``, position
    -1, mask 0); images in (row, offset) order."""
    b, width = len(rows), seq_len + 1
    ids = np.full((b, width), pad_id, np.int32)
    positions = np.full((b, width), -1, np.int32)
    mask = np.zeros((b, width), np.uint8)
    seq, offset, grid, patches = [], [], [], []
    for r, docs in enumerate(rows):
        at = 0
        for doc in docs:
            n = len(doc.ids)
            assert at + n <= width, f"row {r} overflows {width} tokens"
            ids[r, at:at + n] = doc.ids
            positions[r, at:at + n] = np.arange(n)
            mask[r, at:at + n] = doc.mask
            for off, p in doc.images:
                seq.append(r)
                offset.append(at + off)
                grid.append(p.grid_thw)
                patches.append(p.values)
            at += n
    counts = [len(p) for p in patches]
    return {
        "input_ids": ids, "positions": positions, "loss_mask": mask,
        "image_patches": (np.concatenate(patches) if patches
                          else np.zeros((0, 768), np.uint8)),
        "image_grid_thw": np.array(grid, np.int32).reshape(-1, 3),
        "image_seq": np.array(seq, np.int32),
        "image_offset": np.array(offset, np.int32),
        "image_patch_start": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
    }


def titan_tokenizer(folder: str) -> Any:
    """TorchTitan's ``MultiModalTokenizer`` over datalane's vision tokenizer (no BOS or EOS
    added by ``encode``: ``_process_mm_sample`` appends the EOS text itself)."""
    from torchtitan.components.tokenizer import MultiModalTokenizer

    os.makedirs(folder, exist_ok=True)
    write_vision_tokenizer(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": VISION_TOKENS[4],
                   "add_bos_token": False, "add_eos_token": False}, f)
    image, video, start, end, pad = VISION_TOKENS
    return MultiModalTokenizer(MultiModalTokenizer.Config(
        image_token=image, video_token=video, vision_start_token=start, vision_end_token=end,
        pad_token=pad), tokenizer_path=folder)


def titan_sample(tokenizer: Any, texts: list[str | None], pictures: list[Picture | None],
                 rule: ImageRule = RULE) -> dict[str, Any]:
    """TorchTitan's sample of interleaved ``texts`` and ``pictures`` (None where the other
    list has the part), by its ``_process_mm_sample`` with Qwen3.5's settings."""
    from torchtitan.hf_datasets.multimodal.mm_datasets import _process_mm_sample
    from torchtitan.hf_datasets.multimodal.utils.image import resize_to_pixel_budget

    p = rule.patches
    sample: dict[str, Any] | None = _process_mm_sample(
        texts=list(texts), images=[None if x is None else x.png for x in pictures],
        tokenizer=tokenizer, patch_size=p.patch_size, temporal_patch_size=p.temporal_patch_size,
        spatial_merge_size=p.merge_size, min_pixels=rule.resize.min_pixels,
        max_pixels=rule.resize.max_pixels, image_mean=p.mean, image_std=p.std,
        resize_fn=resize_to_pixel_budget, max_patches=4096, max_patches_per_side=512)
    assert sample is not None, "TorchTitan dropped the sample"
    return sample


def titan_rows(rows: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each row's samples merged as TorchTitan's packer merges them."""
    from torchtitan.hf_datasets.multimodal.utils.packing import MMSamplePacker

    return [MMSamplePacker._merge_samples(samples) for samples in rows]


def titan_collator(tokenizer: Any, batch_size: int, seq_len: int,
                   rule: ImageRule = RULE) -> Any:
    """TorchTitan's ``MultiModalCollator`` with Qwen3.5's settings (config_registry.py)."""
    from torchtitan.hf_datasets.multimodal.mm_collator import MultiModalCollator

    p = rule.patches
    return MultiModalCollator(
        batch_size=batch_size, seq_len=seq_len, max_images_per_batch=128,
        patch_size=p.patch_size, temporal_patch_size=p.temporal_patch_size,
        spatial_merge_size=p.merge_size, tokenizer=tokenizer, build_mrope_positions=True)
