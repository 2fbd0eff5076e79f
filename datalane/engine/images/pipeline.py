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
import pyarrow as pa
from PIL import Image

from datalane.engine.images.augment import Augment, augment
from datalane.engine.images.decode import ImageLimits, decode
from datalane.engine.images.patches import Patches, PatchRule, patchify
from datalane.engine.images.resize import ResizeRule, resize
from datalane.spec.errors import ConfigError

__all__ = ["ImageRule", "libraries", "pixels", "process"]


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
    return patchify(pixels(image), rule.patches, repeat_frames=repeat_frames)


def pixels(image: Image.Image) -> np.ndarray:
    """uint8 ``(H, W, 3)`` of an RGB image: a view of Pillow's own pixel memory where Pillow
    exports it (its Arrow array of 4-byte pixels, when the image lies in one memory block:
    up to 16 MB, about 4.2 million pixels), else ``np.asarray``'s copy.

    Why not always ``np.asarray``: Pillow's ``__array_interface__`` copies the pixels through
    ``tobytes``, whose raw encoder holds the GIL (about a fifth of the GIL a lane held per
    image, bench/images.py ``--stages``); the view costs microseconds, and the one copy
    :func:`~datalane.engine.images.patches.patchify` makes from it runs in numpy with the GIL
    released. The values are the same bytes either way (the fourth byte of a pixel is
    padding, never read). The view keeps the image's memory alive for as long as it lives."""
    if image.mode == "RGB" and hasattr(image, "__arrow_c_array__"):
        try:
            flat = pa.array(image)
        except ValueError:  # rows in several blocks: "Image rows are not contiguous"
            flat = None
        if (flat is not None and isinstance(flat.type, pa.FixedSizeListType)
                and flat.type.list_size == 4 and flat.offset == 0
                and len(flat) == image.width * image.height):
            values = flat.values.to_numpy(zero_copy_only=True)
            view: np.ndarray = values.reshape(image.height, image.width, 4)[:, :, :3]
            return view
    return np.asarray(image)
