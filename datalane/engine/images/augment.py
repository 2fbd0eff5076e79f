"""Optional deterministic augmentation of an image document: a random crop, a horizontal flip.

Every draw is a pure function of ``(seed, lane, document)`` through
:func:`datalane.engine.rng.words` (counter-based BLAKE2b words, integer arithmetic only), so
the same image gets the same pixels on any thread, in any order, on any machine: an augmented
stream stays byte-identical across GPU counts like any other. Applied after decoding and
before resizing (a crop changes what the pixel budget sees). Callers:
:mod:`datalane.engine.images.pipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from datalane.engine.rng import words
from datalane.spec.errors import ConfigError

__all__ = ["Augment", "augment", "crop_box"]

_STEPS = 1 << 16  # the crop scale is drawn from [crop, 1] in this many equal steps


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Augment:
    """``crop``: the smallest side fraction of a random crop (1.0: no crop); the crop keeps
    the aspect ratio, its scale uniform in ``[crop, 1]``, its place uniform in the image.
    ``flip``: the probability, in 1/65536 steps, of a horizontal flip."""

    crop: float = 1.0
    flip: float = 0.0

    def __post_init__(self) -> None:
        if not _number(self.crop) or not 0.0 < self.crop <= 1.0:
            raise ConfigError(f"images.augment.crop: {self.crop!r} is not a number in (0, 1]")
        if not _number(self.flip) or not 0.0 <= self.flip <= 1.0:
            raise ConfigError(f"images.augment.flip: {self.flip!r} is not a number in [0, 1]")

    @property
    def active(self) -> bool:
        return self.crop < 1.0 or self.flip > 0.0


def crop_box(width: int, height: int, aug: Augment, draws: list[int]) -> tuple[int, int, int, int]:
    """The (left, top, right, bottom) box of the crop, from two of the draws."""
    step = draws[0] % (_STEPS + 1)  # 0 .. _STEPS: scale = crop + (1 - crop) * step / _STEPS
    low_w = max(1, int(width * aug.crop))
    low_h = max(1, int(height * aug.crop))
    cw = low_w + (width - low_w) * step // _STEPS
    ch = low_h + (height - low_h) * step // _STEPS
    left = (draws[1] >> 32) % (width - cw + 1)
    top = (draws[1] & 0xFFFFFFFF) % (height - ch + 1)
    return left, top, left + cw, top + ch


def augment(image: Image.Image, aug: Augment, seed: int, lane: int,
            *document: object) -> Image.Image:
    """``image`` cropped and flipped as drawn for ``document`` of lane ``lane``: the words of
    ``(seed, "image-augment", lane, *document)``; a document kind gives where the image is
    (source, file, position, the image's index in its document:
    :class:`~datalane.engine.documents.base.DocKey`)."""
    if not aug.active:
        return image
    draws = words(3, seed, "image-augment", lane, *document)
    out = image
    if aug.crop < 1.0:
        box = crop_box(image.width, image.height, aug, draws)
        if box != (0, 0, image.width, image.height):
            out = out.crop(box)
    if draws[2] % _STEPS < round(aug.flip * _STEPS):
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return out
