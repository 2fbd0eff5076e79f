"""The vision contract: what a trainer needs besides a vision recipe's columns to build its
model's batch.

A microbatch's per-image columns (:mod:`datalane.spec.imagecolumns`) hold each image's patch
rows as uint8, one frame, and where its placeholder run lies. Turning them into TorchTitan's
multimodal batch (:func:`datalane.client.torchvlm.to_vlm`) needs more, all of it decided by
the recipe: the ids of the vision tokens in its tokenizer (TorchTitan's ``special_tokens``:
the image placeholder, vision start and end, the video placeholder, the pad) and the patch
rule of its ``vision`` settings (patch, temporal and merge sizes, patch order, and the mean
and std that normalise the pixels). The plan puts them in the sample schema
(:attr:`datalane.spec.schema.SampleSchema.vision`), and a sidecar announces them beside the
columns (``VisionContract`` in the replies to Open and Health, :mod:`datalane.wire.layout`),
so a client builds the same batch in-process and through a sidecar.

A contract arrives over the wire from a sidecar, so every field is checked here
(:meth:`VisionContract.__post_init__`): ids that are token ids, sizes within the recipe's
bounds, five different ids (the video's may be absent), three finite means within
:data:`MAX_MEAN` and three stds of at least :data:`MIN_STD`; a ``ValueError`` names the field
and its value (cut to a few dozen characters: a hostile announcement may be long).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = ["MAX_MEAN", "MIN_STD", "SPECIAL_TOKENS", "VisionContract", "normalisation_problem"]

#: The keys of TorchTitan's ``special_tokens`` (``MultiModalTokenizer.TOKEN_FIELDS`` + ``_id``),
#: the contract's first five fields.
SPECIAL_TOKENS = ("image_id", "video_id", "vision_start_id", "vision_end_id", "pad_id")
_MAX_ID = 2 ** 31 - 1  # input_ids are int32
#: the bounds of the recipe's settings (datalane.spec.vision.ImageSettings)
_SIZES = {"patch_size": 1024, "temporal_patch_size": 16, "merge_size": 16}
#: the normalisation's bounds: a pixel in 0..1, less a mean within these and divided by a std of
#: at least this, stays a finite float32 (and far from the range a model was trained on)
MIN_STD = 1e-6
MAX_MEAN = 1e6


def normalisation_problem(mean: Sequence[float], std: Sequence[float]) -> str | None:
    """What is wrong with three means and stds the pixels are normalised with (a mean within
    :data:`MAX_MEAN`, a std of at least :data:`MIN_STD`), named ``image_mean``/``image_std``;
    None when nothing is. The recipe's settings and the announced contract both apply it."""
    if not all(v > 0 for v in std):
        return f"image_std {std!r} has a value that is not positive (the pixels are divided by it)"
    if not all(v >= MIN_STD for v in std):
        return f"image_std {std!r} has a value below {MIN_STD:g} (the pixels are divided by it)"
    if not all(abs(v) <= MAX_MEAN for v in mean):
        return f"image_mean {mean!r} has a value outside {-MAX_MEAN:g}..{MAX_MEAN:g}"
    return None


@dataclass(frozen=True)
class VisionContract:
    """A vision recipe's special-token ids and patch rule (the module docstring)."""

    image_id: int
    video_id: int  # -1: the vocabulary has no ``<|video_pad|>`` (videos are not carried)
    vision_start_id: int
    vision_end_id: int
    pad_id: int  # what the lanes pad ``input_ids`` with (the schema's pad)
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    order: Literal["block", "raster"]
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]

    def __post_init__(self) -> None:
        for name in SPECIAL_TOKENS:
            value = getattr(self, name)
            low = -1 if name == "video_id" else 0
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not low <= value <= _MAX_ID:
                raise ValueError(f"{name} {value!r} is not a token id (an integer in "
                                 f"{low}..{_MAX_ID})")
        vision = (self.image_id, self.vision_start_id, self.vision_end_id)
        if len(set(vision)) != 3:
            raise ValueError(f"image_id, vision_start_id and vision_end_id {vision} must be "
                             f"three different tokens")
        # a video placeholder or a pad that is also a vision token would be counted as one
        # (TorchTitan finds images by their ids); the pad may be any other token (eos)
        taken = {"image_id": self.image_id, "vision_start_id": self.vision_start_id,
                 "vision_end_id": self.vision_end_id}
        for name in ("video_id", "pad_id"):
            value = getattr(self, name)
            if value < 0:  # no <|video_pad|>
                continue
            other = next((k for k, tid in taken.items() if tid == value), None)
            if other is not None:
                raise ValueError(f"{name} {value} is also {other}: the vision tokens, the "
                                 f"video placeholder and the pad must be different tokens")
            taken[name] = value
        for name, top in _SIZES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"{name} {value!r} is not an integer in 1..{top}")
        if self.order not in ("block", "raster"):
            raise ValueError(f"order {self.order!r:.40} is not 'block' or 'raster'")
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or len(value) != 3 or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                    for v in value):
                raise ValueError(f"{name} {value!r:.80} is not three finite numbers (R, G, B)")
        wrong = normalisation_problem(self.image_mean, self.image_std)
        if wrong is not None:
            raise ValueError(wrong)

    @property
    def special_tokens(self) -> dict[str, int]:
        """TorchTitan's ``special_tokens``: the five ids by the names of :data:`SPECIAL_TOKENS`."""
        return {name: getattr(self, name) for name in SPECIAL_TOKENS}

    @property
    def patch_width(self) -> int:
        """Bytes of one patch row of ``image_patches`` (one frame: 3 x patch_size**2)."""
        return 3 * self.patch_size * self.patch_size

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (the wire's ``VisionContract`` message has the same names)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
