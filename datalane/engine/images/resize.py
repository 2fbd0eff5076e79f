"""The declared resize rule of an image document: a fixed size, or a pixel budget.

:func:`target_size` is TorchTitan's ``resize_to_pixel_budget`` (the Qwen-VL ``smart_resize``
rule with its small-image pre-scale: torchtitan/hf_datasets/multimodal/utils/image.py),
computed with the same Python arithmetic, so the grid of every image, and so its number of
placeholder tokens, is TorchTitan's (tests/engine/images/test_resize.py compares them on many
sizes). :func:`resize` applies it with Pillow's bicubic filter (antialiased when shrinking, as
TorchTitan's ``antialias=True``); Pillow's resampling is integer fixed-point C, the same bytes
on every CPU (docs/vlm.md, Resizing, says how far it is from torchvision's). Pure and
thread-safe; Pillow releases the GIL while it resamples. Callers:
:mod:`datalane.engine.images.pipeline`, bench/images.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PIL import Image

from datalane.engine.images.decode import BadImage
from datalane.spec.errors import ConfigError
from datalane.spec.limits import IMAGE_ASPECT, IMAGE_TOO_LARGE, MAX_RESIZE_PIXELS

__all__ = ["MAX_ASPECT", "RESAMPLE", "ResizeRule", "resize", "target_size"]

RESAMPLE = "bicubic"
"""The resampling filter (Pillow's ``Resampling.BICUBIC``, a = -0.5, as HF's Qwen2-VL image
processor and TorchTitan's ``InterpolationMode.BICUBIC``)."""

MAX_ASPECT = 200
"""The largest ratio of an image's longer side to its shorter one (TorchTitan's bound)."""


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"images.{name}: {value!r} is not a positive integer")
    return value


@dataclass(frozen=True)
class ResizeRule:
    """How an image is sized for a vision encoder of patches ``patch_size`` merged
    ``merge_size`` x ``merge_size``: both sides end as multiples of ``factor`` (their
    product). ``size`` (height, width) fixes the size; otherwise the pixel count lands in
    ``[min_pixels, max_pixels]`` with the aspect ratio kept as closely as the grid allows.
    The defaults are TorchTitan's Qwen3.5 loader's (torchtitan/models/qwen3_5/
    config_registry.py)."""

    patch_size: int = 16
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        _positive("patch_size", self.patch_size)
        _positive("merge_size", self.merge_size)
        _positive("min_pixels", self.min_pixels)
        _positive("max_pixels", self.max_pixels)
        if self.min_pixels > self.max_pixels:
            raise ConfigError(f"images.min_pixels: {self.min_pixels:,} is over "
                              f"images.max_pixels {self.max_pixels:,}")
        if self.max_pixels > MAX_RESIZE_PIXELS:
            raise ConfigError(f"images.max_pixels: {self.max_pixels:,} is over the "
                              f"{MAX_RESIZE_PIXELS:,} an image may be resized to")
        if self.max_pixels < self.factor ** 2:
            raise ConfigError(f"images.max_pixels: {self.max_pixels:,} is under one "
                              f"{self.factor} x {self.factor} merged patch")
        if self.size is not None and (
                not isinstance(self.size, tuple) or len(self.size) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                       or v % self.factor for v in self.size)):
            raise ConfigError(f"images.size: {self.size!r} is not (height, width), both "
                              f"positive multiples of {self.factor} (patch_size x merge_size)")
        if self.size is not None and self.size[0] * self.size[1] > MAX_RESIZE_PIXELS:
            raise ConfigError(f"images.size: {self.size!r} is over the {MAX_RESIZE_PIXELS:,} "
                              f"pixels an image may be resized to")

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def target_size(height: int, width: int, rule: ResizeRule) -> tuple[int, int]:
    """The (height, width) an image of ``height`` x ``width`` pixels is resized to. Raises
    :class:`BadImage` (``image_aspect``) for a side over :data:`MAX_ASPECT` times the other,
    where TorchTitan drops the sample."""
    if rule.size is not None:
        return rule.size
    factor = rule.factor
    if height < factor or width < factor:  # TorchTitan scales a thin image up first
        scale = max(factor / width, factor / height)
        width, height = int(width * scale), int(height * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise BadImage(IMAGE_ASPECT, f"{width} x {height} pixels: the longer side is over "
                                     f"{MAX_ASPECT} times the shorter")
    h_bar = max(round(height / factor) * factor, factor)
    w_bar = max(round(width / factor) * factor, factor)
    if h_bar * w_bar > rule.max_pixels:
        beta = math.sqrt((height * width) / rule.max_pixels)
        h_bar = max(math.floor(height / beta / factor) * factor, factor)
        w_bar = max(math.floor(width / beta / factor) * factor, factor)
    elif h_bar * w_bar < rule.min_pixels:
        beta = math.sqrt(rule.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize(image: Image.Image, rule: ResizeRule) -> Image.Image:
    """``image`` resized by ``rule`` (itself when it already has the target size). Raises
    :class:`BadImage` (``image_too_large``) for a target over
    :data:`~datalane.spec.limits.MAX_RESIZE_PIXELS` before any pixel is made."""
    height, width = image.height, image.width
    th, tw = target_size(height, width, rule)
    if th * tw > MAX_RESIZE_PIXELS:
        raise BadImage(IMAGE_TOO_LARGE, f"{width} x {height} pixels would be resized to {tw} x "
                                        f"{th}, over the {MAX_RESIZE_PIXELS:,} pixels an image "
                                        f"may be resized to")
    if (th, tw) == (height, width):
        return image
    return image.resize((tw, th), Image.Resampling.BICUBIC)
