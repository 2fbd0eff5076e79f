"""Pixels to the vision encoder's patches: TorchTitan's ``vision_to_patches`` layout.

An image of ``H x W`` RGB pixels (both multiples of ``patch_size x merge_size``) becomes
``grid_thw = (1, H / patch_size, W / patch_size)`` and ``t * h * w`` patch rows of
``C * temporal_patch_size * patch_size**2`` values, channel-first ``(c, pt, ph, pw)`` as the
Conv3d patch embedding reads them, in ``block`` order (each ``merge_size**2`` group of patches
that merge into one token adjacent: what M-RoPE needs) or ``raster`` order. A still image is
one frame repeated ``temporal_patch_size`` times, as HF's Qwen2-VL processor and TorchTitan
pad it. Its text holds ``t * h * w / merge_size**2`` placeholder tokens.

:func:`patchify` keeps the pixels as uint8 (a quarter of float32's bytes: what a lane ships);
:func:`normalize` maps them to TorchTitan's float32 values through a 256-entry table computed
with torchvision's own float32 operations (``x * (1/255)``, ``- mean``, ``/ std``), so the
values are bit-identical to TorchTitan's (tests/engine/images/test_patches.py).
:func:`unpatchify` is :func:`patchify`'s exact inverse: an image's patch rows back to its
pixels at the resized grid, as the model sees them (datalane/demos/vlm_samples.py draws them).
Pure numpy, thread-safe. Callers: :mod:`datalane.engine.images.pipeline`, bench/images.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from datalane.spec.errors import ConfigError

__all__ = ["PatchRule", "Patches", "normalize", "normalize_table", "patchify", "placeholders",
           "unpatchify"]


@dataclass(frozen=True)
class PatchRule:
    """The vision encoder's patching: TorchTitan's Qwen3.5 values by default
    (torchtitan/models/qwen3_5/config_registry.py), image mean and std included."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    order: Literal["block", "raster"] = "block"
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"images.{name}: {value!r} is not a positive integer")
        if self.order not in ("block", "raster"):
            raise ConfigError(f"images.order: {self.order!r} is not 'block' or 'raster'")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if (not isinstance(value, tuple) or len(value) != 3
                    or not all(isinstance(v, int | float) and not isinstance(v, bool)
                               for v in value)):
                raise ConfigError(f"images.{name}: {value!r} is not three numbers")
        if not all(v > 0 for v in self.std):
            raise ConfigError(f"images.std: {self.std!r} has a value that is not positive")

    @property
    def patch_dim(self) -> int:
        """Values per patch row: C * temporal_patch_size * patch_size**2."""
        return 3 * self.temporal_patch_size * self.patch_size ** 2


@dataclass(frozen=True)
class Patches:
    """One image's patches: ``values`` uint8 ``(t*h*w, patch_dim)`` (``patch_dim / T`` when
    the frame is not repeated), ``grid_thw`` ``(t, h, w)`` in patches, ``tokens`` its
    placeholder tokens."""

    values: np.ndarray
    grid_thw: tuple[int, int, int]
    tokens: int


def placeholders(grid_thw: tuple[int, int, int], merge_size: int) -> int:
    """The placeholder tokens of an image of ``grid_thw`` patches: t * h * w / merge**2."""
    t, h, w = grid_thw
    return t * (h // merge_size) * (w // merge_size)


def patchify(pixels: np.ndarray, rule: PatchRule, *, repeat_frames: bool = True) -> Patches:
    """The patches of ``pixels`` (uint8 ``(H, W, 3)``, both sides multiples of
    ``patch_size x merge_size``: :func:`~datalane.engine.images.resize.resize` makes them
    so). ``repeat_frames=False`` leaves out the ``temporal_patch_size - 1`` copies of the
    frame (rows of ``3 * patch_size**2``), for a client to repeat."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"patchify takes uint8 (H, W, 3) pixels, not {pixels.dtype} "
                         f"{pixels.shape}")
    height, width = pixels.shape[:2]
    ps, ms = rule.patch_size, rule.merge_size
    if height % (ps * ms) or width % (ps * ms):
        raise ValueError(f"{height} x {width} pixels are not multiples of {ps * ms} "
                         f"(patch_size x merge_size)")
    h, w = height // ps, width // ps
    if rule.order == "block":
        # (bh m ph) (bw n pw) c -> (bh bw m n) c (ph pw)
        grid = pixels.reshape(h // ms, ms, ps, w // ms, ms, ps, 3)
        rows = grid.transpose(0, 3, 1, 4, 6, 2, 5).reshape(h * w, 3, 1, ps * ps)
    else:
        # (h ph) (w pw) c -> (h w) c (ph pw)
        grid = pixels.reshape(h, ps, w, ps, 3)
        rows = grid.transpose(0, 2, 4, 1, 3).reshape(h * w, 3, 1, ps * ps)
    frames = rule.temporal_patch_size if repeat_frames else 1
    values = np.ascontiguousarray(np.broadcast_to(rows, (h * w, 3, frames, ps * ps)))
    grid_thw = (1, h, w)
    return Patches(values.reshape(h * w, 3 * frames * ps * ps), grid_thw,
                   placeholders(grid_thw, ms))


def unpatchify(values: np.ndarray, grid_thw: tuple[int, int, int], rule: PatchRule) -> np.ndarray:
    """The uint8 ``(H, W, 3)`` pixels whose :func:`patchify` under ``rule`` gives the patch
    rows ``values`` of grid ``grid_thw`` (one frame a row, or ``temporal_patch_size`` of
    them: the first is read); ValueError naming what does not fit."""
    t, h, w = (int(v) for v in grid_thw)
    ps, ms = rule.patch_size, rule.merge_size
    frame = 3 * ps * ps
    if t != 1 or h < 1 or w < 1 or h % ms or w % ms:
        raise ValueError(f"grid_thw {tuple(grid_thw)} is not a still image's grid (t 1, h and "
                         f"w positive multiples of merge_size {ms})")
    if values.dtype != np.uint8 or values.ndim != 2 or len(values) != h * w or \
            values.shape[1] not in (frame, frame * rule.temporal_patch_size):
        raise ValueError(f"patch rows {values.dtype} {values.shape} are not the {h * w} uint8 "
                         f"rows of {frame} or {frame * rule.temporal_patch_size} values of "
                         f"grid_thw {tuple(grid_thw)}")
    frames = values.shape[1] // frame
    rows = values.reshape(h * w, 3, frames, ps, ps)[:, :, 0]  # (patch, c, ph, pw)
    if rule.order == "block":  # (bh bw m n) c ph pw -> (bh m ph) (bw n pw) c
        grid = rows.reshape(h // ms, w // ms, ms, ms, 3, ps, ps).transpose(0, 2, 5, 1, 3, 6, 4)
    else:  # (h w) c ph pw -> (h ph) (w pw) c
        grid = rows.reshape(h, w, 3, ps, ps).transpose(0, 3, 1, 4, 2)
    return np.ascontiguousarray(grid.reshape(h * ps, w * ps, 3))


def normalize_table(rule: PatchRule) -> np.ndarray:
    """float32 ``(3, 256)``: channel c's value of byte v, as torchvision computes it
    (``to_dtype(float32, scale=True)`` is ``x * (1/255)`` in float32, ``normalize`` is
    ``(x - mean) / std`` in float32)."""
    levels = np.arange(256, dtype=np.float32) * np.float32(1.0 / 255)
    mean = np.asarray(rule.mean, dtype=np.float32)[:, None]
    std = np.asarray(rule.std, dtype=np.float32)[:, None]
    out: np.ndarray = ((levels[None, :] - mean) / std).astype(np.float32)
    return out


def normalize(values: np.ndarray, rule: PatchRule, table: np.ndarray | None = None) -> np.ndarray:
    """TorchTitan's float32 pixel values of uint8 patch rows (``(N, 3 * k)``, channel-first
    as :func:`patchify` lays them out)."""
    table = normalize_table(rule) if table is None else table
    n, dim = values.shape
    by_channel = values.reshape(n, 3, dim // 3)
    out = np.empty((n, 3, dim // 3), dtype=np.float32)
    for c in range(3):
        np.take(table[c], by_channel[:, c], out=out[:, c])
    return out.reshape(n, dim)
