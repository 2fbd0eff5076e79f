"""Images for vision-language models: decode, resize, augment, patchify (docs/vlm.md).

Pure, stateless, thread-safe functions from an image's encoded bytes to the uint8 patches,
``grid_thw`` and placeholder count that TorchTitan's multimodal collator and Qwen3.5's vision
encoder expect; the image document kind, its sources and its columns plug them in.
"""

from datalane.engine.images.augment import Augment, augment
from datalane.engine.images.decode import FORMATS, BadImage, ImageLimits, decode, sniff
from datalane.engine.images.patches import (
    Patches,
    PatchRule,
    normalize,
    normalize_table,
    patchify,
    placeholders,
    unpatchify,
)
from datalane.engine.images.pipeline import ImageRule, libraries, process
from datalane.engine.images.resize import RESAMPLE, ResizeRule, resize, target_size

__all__ = [
    "FORMATS", "RESAMPLE", "Augment", "BadImage", "ImageLimits", "ImageRule", "PatchRule",
    "Patches", "ResizeRule", "augment", "decode", "libraries", "normalize", "normalize_table",
    "patchify", "placeholders", "process", "resize", "sniff", "target_size", "unpatchify",
]
