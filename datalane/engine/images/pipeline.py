"""One image, bytes to patches: decode, augment, resize, patchify.

The whole per-image work of a lane's map stage for an image document, in one pure function
that any worker thread may run (docs/vlm.md, datalane's plan). Its result depends on the
bytes, the declared :class:`ImageRule` and, when it augments, ``(seed, lane, document)``:
nothing else. Callers: the image document kinds (:mod:`datalane.engine.documents.vision`,
``interleaved``), bench/images.py, the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from datalane.engine.images.augment import Augment, augment
from datalane.engine.images.decode import ImageLimits, decode
from datalane.engine.images.patches import Patches, PatchRule, patchify
from datalane.engine.images.resize import ResizeRule, resize
from datalane.spec.errors import ConfigError

__all__ = ["ImageRule", "libraries", "process"]


def libraries() -> dict[str, str]:
    """The versions of the code that decides an image's pixel bytes beyond the rule: Pillow
    (its resampling is the resize) and the decoders whose output is not fixed by their format
    (libjpeg-turbo's IDCT, libwebp's lossy decoder; zlib's inflate is exact and left out). A
    kind that processes images puts them into the recipe's fingerprint, so that a resume on
    another Pillow is refused naming it instead of serving other pixels."""
    import PIL
    from PIL import features

    return {"pillow": PIL.__version__,
            "libjpeg_turbo": str(features.version("libjpeg_turbo")),
            "libwebp": str(features.version("webp"))}


@dataclass(frozen=True)
class ImageRule:
    """Everything that decides an image's patches (it goes whole into the recipe's
    fingerprint when a kind declares it)."""

    limits: ImageLimits = field(default_factory=ImageLimits)
    resize: ResizeRule = field(default_factory=ResizeRule)
    patches: PatchRule = field(default_factory=PatchRule)
    augment: Augment = field(default_factory=Augment)

    def __post_init__(self) -> None:
        if (self.resize.patch_size, self.resize.merge_size) != \
                (self.patches.patch_size, self.patches.merge_size):
            raise ConfigError(
                f"images: resize's patch_size x merge_size "
                f"{self.resize.patch_size} x {self.resize.merge_size} is not the patches' "
                f"{self.patches.patch_size} x {self.patches.merge_size}")


def process(data: bytes, rule: ImageRule, *, seed: int = 0, lane: int = 0,
            document: tuple[object, ...] = (), repeat_frames: bool = True) -> Patches:
    """The uint8 patches of the encoded image ``data``; raises
    :class:`~datalane.engine.images.decode.BadImage` for an image that cannot be used. An
    augmenting ``rule`` draws from ``(seed, lane, *document)``
    (:func:`~datalane.engine.images.augment.augment`)."""
    image = decode(data, rule.limits)
    image = augment(image, rule.augment, seed, lane, *document)
    image = resize(image, rule.resize)
    return patchify(np.asarray(image), rule.patches, repeat_frames=repeat_frames)
