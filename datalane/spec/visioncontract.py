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
bounds, three finite means and three positive stds; a ``ValueError`` names the field and its
value (cut to a few dozen characters: a hostile announcement may be long).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = ["SPECIAL_TOKENS", "VisionContract"]

#: The keys of TorchTitan's ``special_tokens`` (``MultiModalTokenizer.TOKEN_FIELDS`` + ``_id``),
#: the contract's first five fields.
SPECIAL_TOKENS = ("image_id", "video_id", "vision_start_id", "vision_end_id", "pad_id")
_MAX_ID = 2 ** 31 - 1  # input_ids are int32
#: the bounds of the recipe's settings (datalane.spec.vision.ImageSettings)
_SIZES = {"patch_size": 1024, "temporal_patch_size": 16, "merge_size": 16}


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
        if not all(v > 0 for v in self.image_std):
            raise ValueError(f"image_std {self.image_std!r} has a value that is not positive")

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
