"""The vision part of a source: image-caption pairs, each rendered as an image placeholder run
plus its caption's tokens (docs/vlm.md).

A vision source's records hold an encoded image (JPEG, PNG or WebP, recognised by its magic
bytes) and its caption: the members ``image_field`` / ``text_field`` of a WebDataset sample,
or the columns of a Parquet or Hugging Face Arrow row (binary or an ``Image`` struct).
Each image is decoded within ``limits``, resized by ``resize`` (TorchTitan's pixel budget,
Qwen3.5's values by default) and cut into patches; its document is ``vision_start_token``,
``image_token`` once per merged patch (``grid_t * grid_h * grid_w / merge_size**2``),
``vision_end_token``, then the caption (trailing whitespace stripped) with the recipe
tokenizer's BOS / EOS, as TorchTitan's ``insert_vision_placeholders`` builds it. The three
vision tokens have ``loss_mask`` 0. :class:`VisionSpec` is the recipe's ``sources[i].vision``;
the engine side is :mod:`datalane.engine.documents.vision`.

:class:`InterleavedSpec` (``sources[i].interleaved``) is the kind of OBELICS-style documents:
a row's ``texts`` and ``images`` lists, rendered in order with one placeholder run per image
(:mod:`datalane.engine.documents.interleaved`). It is a kind of its own, not a mode of
``vision``: its records are lists, not one image and one caption, so its fields, its formats
(list columns: Parquet, HF), its bound (``max_images``) and its bad records are its own; both
share :class:`ImageSettings` (the image rule and the vision tokens) and the engine's image
pipeline, token lookup and fingerprint identity.

**Whole documents.** A placeholder run must never be split across sequences (the model
requires one contiguous run per image), so a vision document is never cut: the recipe's packer
must keep documents whole (``packing.algorithm: bestfit``; ``wrap`` is refused), and a
document longer than a sequence (``seq_len + 1`` tokens) is set aside as ``too_long``, as
TorchTitan drops a sample over ``seq_len``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from datalane.spec.errors import ConfigError
from datalane.spec.limits import (
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_JPEG_SCANS,
    MAX_RESIZE_PIXELS,
)
from datalane.spec.model import doc
from datalane.spec.visioncontract import normalisation_problem

__all__ = ["AugmentSpec", "ImageLimitsSpec", "ImageSettings", "InterleavedSpec", "ResizeSpec",
           "VisionSpec"]


@dataclass(frozen=True)
class ResizeSpec:
    """How an image is sized: a fixed size, or a pixel budget (TorchTitan's rule)."""

    min_pixels: int = doc("Smallest pixel count after resizing (Qwen3.5: 65,536).",
                          default=65536, ge=1)
    max_pixels: int = doc("Largest pixel count after resizing (Qwen3.5: 16,777,216; at most "
                          "33,554,432).", default=16777216, ge=1, le=MAX_RESIZE_PIXELS)
    size: list[int] | None = doc(
        "A fixed `[height, width]` every image is resized to, both multiples of "
        "`patch_size x merge_size`, at most 33,554,432 pixels; null: the pixel budget.",
        default=None)

    def check(self, where: str, factor: int) -> None:
        if self.min_pixels > self.max_pixels:
            raise ConfigError(f"{where}.min_pixels {self.min_pixels:,} is over "
                              f"{where}.max_pixels {self.max_pixels:,}")
        if self.max_pixels < factor * factor:
            raise ConfigError(f"{where}.max_pixels {self.max_pixels:,} is under one merged "
                              f"patch of {factor} x {factor} pixels")
        if self.size is not None and (len(self.size) != 2
                                      or any(v < 1 or v % factor for v in self.size)):
            raise ConfigError(f"{where}.size {self.size!r} is not [height, width], both "
                              f"positive multiples of {factor} (patch_size x merge_size)")
        if self.size is not None and self.size[0] * self.size[1] > MAX_RESIZE_PIXELS:
            raise ConfigError(f"{where}.size {self.size!r} is {self.size[0] * self.size[1]:,} "
                              f"pixels, over the {MAX_RESIZE_PIXELS:,} an image may be resized "
                              f"to")


@dataclass(frozen=True)
class ImageLimitsSpec:
    """Bounds on one image, checked before it is decoded; only lower than the defaults."""

    max_bytes: int = doc("Most encoded bytes of one image.", default=MAX_IMAGE_BYTES, ge=1,
                         le=MAX_IMAGE_BYTES)
    max_pixels: int = doc("Most pixels (width x height) an image's header may declare.",
                          default=MAX_IMAGE_PIXELS, ge=1, le=MAX_IMAGE_PIXELS)
    max_scans: int = doc("Most scans of a (progressive) JPEG.", default=MAX_JPEG_SCANS, ge=1,
                         le=MAX_JPEG_SCANS)


@dataclass(frozen=True)
class AugmentSpec:
    """A random crop and a horizontal flip of each image, drawn from the recipe's seed, the
    lane and where the image is in the corpus (docs/vlm.md, Augmentation); off by default."""

    crop: float = doc(
        "The smallest side fraction of a random crop, in (0, 1]; 1: no crop. The crop keeps "
        "the aspect ratio, its scale uniform in `[crop, 1]`, its place uniform in the image; "
        "applied after decoding, before the resize.", default=1.0, gt=0, le=1)
    flip: float = doc("The probability of a horizontal flip, in [0, 1] (in 1/65,536 steps).",
                      default=0.0, ge=0, le=1)


@dataclass(frozen=True)
class ImageSettings:
    """What a kind that renders images shares (``vision``, ``interleaved``): the patch
    geometry, the resize rule, the bounds on one image, the augmentation and the vision
    tokens."""

    #: the kind's documents may never be split across sequences (spec.recipe checks the packer)
    whole_documents: ClassVar[bool] = True
    #: the formats that can read the kind's parts (None: every format declaring ``parts``)
    formats: ClassVar[tuple[str, ...] | None] = None

    patch_size: int = doc("Side of a vision patch in pixels (Qwen3.5: 16).", default=16,
                          ge=1, le=1024)
    temporal_patch_size: int = doc("Frames per patch; a still image is repeated to fill them "
                                   "(Qwen3.5: 2).", default=2, ge=1, le=16)
    merge_size: int = doc("Patches merged per side into one token (Qwen3.5: 2).", default=2,
                          ge=1, le=16)
    order: Literal["block", "raster"] = doc(
        "Patch order: `block` (the merge_size**2 patches of a token adjacent, as Qwen3.5 "
        "reads them) or `raster`.", default="block")
    resize: ResizeSpec = doc("The resize rule.", factory=ResizeSpec)
    limits: ImageLimitsSpec = doc("Bounds on one image.", factory=ImageLimitsSpec)
    exif_transpose: bool = doc(
        "Turn each image as its EXIF orientation says (off, as TorchTitan's loader).",
        default=False)
    augment: AugmentSpec = doc(
        "Deterministic augmentation: each image's crop and flip are drawn from `(seed, lane, "
        "source, file, position, image)`, the same for any world size, worker count or "
        "restore. Off by default; a recipe that leaves it off (or declares only `crop: 1` and "
        "`flip: 0`) keeps its fingerprint.", factory=AugmentSpec, omit_default=True)
    image_token: str = doc("The placeholder token, repeated once per merged patch.",
                           default="<|image_pad|>", pattern=r".+")
    vision_start_token: str = doc("The token before an image's placeholders.",
                                  default="<|vision_start|>", pattern=r".+")
    vision_end_token: str = doc("The token after an image's placeholders.",
                                default="<|vision_end|>", pattern=r".+")
    image_mean: list[float] = doc(
        "The per-channel (R, G, B) mean the trainer's client subtracts from the pixel values "
        "(scaled to 0..1) before dividing by `image_std` (Qwen3.5: 0.5 each). The lanes carry "
        "the uint8 pixels; this is the model's normalisation, announced to the client. Each "
        "within -1e6..1e6.",
        factory=lambda: [0.5, 0.5, 0.5], omit_default=True)
    image_std: list[float] = doc(
        "The per-channel (R, G, B) standard deviation the client divides by, each at least "
        "1e-6 (Qwen3.5: 0.5 each).", factory=lambda: [0.5, 0.5, 0.5], omit_default=True)

    def validate(self, where: str) -> None:
        at = where or "vision"
        self.resize.check(f"{at}.resize", self.patch_size * self.merge_size)
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if len(value) != 3:
                raise ConfigError(f"{at}.{name} {value!r} is not three numbers (R, G, B)")
        wrong = normalisation_problem(self.image_mean, self.image_std)
        if wrong is not None:
            raise ConfigError(f"{at}.{wrong}")
        names = (self.image_token, self.vision_start_token, self.vision_end_token)
        if len(set(names)) != 3:
            raise ConfigError(f"{at}: image_token, vision_start_token and vision_end_token "
                              f"{names!r} must be three different tokens")


@dataclass(frozen=True)
class VisionSpec(ImageSettings):
    """An image-caption source: each record's image becomes a run of placeholder tokens before
    its caption; the image's patches travel with the document."""

    image_field: list[str] = doc(
        "WebDataset: the extensions of the member holding the image (a sample has exactly one "
        "of them); Parquet, HF: the columns holding it (binary, or an `Image` struct "
        "`{bytes, path}`; a row has a value in exactly one of them). The bytes are decoded by "
        "their magic bytes (JPEG, PNG, WebP), never by the name (default: jpg, jpeg, png, "
        "webp).", factory=lambda: ["jpg", "jpeg", "png", "webp"], min_items=1)
    text_field: str = doc("WebDataset: the extension of the member holding the caption "
                          "(UTF-8 text); Parquet, HF: its column (string).", default="txt",
                          pattern=r"[^.|+]+")

    def validate(self, where: str) -> None:
        super().validate(where)
        at = where or "vision"
        for i, ext in enumerate(self.image_field):
            if not ext or any(c in ext for c in "./|+") or ext != ext.lower():
                raise ConfigError(f"{at}.image_field[{i}] {ext!r} is not a lowercase member "
                                  f"extension without '.', '/', '|' or '+'")
        if len(set(self.image_field)) != len(self.image_field) or \
                self.text_field in self.image_field:
            raise ConfigError(f"{at}.image_field {self.image_field!r} names an extension twice "
                              f"or the text_field {self.text_field!r}")

    @property
    def document_field(self) -> str:
        """The fields a record's document is in, as errors name them (``jpg|png+txt``)."""
        return "|".join(self.image_field) + "+" + self.text_field

    @property
    def document_parts(self) -> dict[str, tuple[str, ...]]:
        """The parts a format reads together for one document: part -> the fields it may be
        in (one of them per record)."""
        return {"image": tuple(self.image_field), "text": (self.text_field,)}


@dataclass(frozen=True)
class InterleavedSpec(ImageSettings):
    """Interleaved image-text documents (OBELICS): each row holds a list of texts and a list of
    images of equal length, each position one text or one image (the other null); the document
    is the texts in order with each image's placeholder run in its place, as TorchTitan's
    ``_process_mm_sample`` renders them."""

    #: list columns: Parquet and Hugging Face Arrow files
    formats: ClassVar[tuple[str, ...] | None] = ("hf", "parquet")

    texts_field: str = doc("The column holding the texts: a list of strings, null where an "
                           "image stands (OBELICS: `texts`).", default="texts",
                           pattern=r"[^|+]+")
    images_field: str = doc(
        "The column holding the images: a list of encoded images (binary, or `Image` structs "
        "`{bytes, path}`), null where a text stands (OBELICS: `images`).", default="images",
        pattern=r"[^|+]+")
    max_images: int = doc(
        "Most images of one document; a document with more is set aside as `too_many_images` "
        "before any is decoded (each image of a document is processed on one map task).",
        default=16, ge=1, le=128)

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.texts_field == self.images_field:
            raise ConfigError(f"{where or 'interleaved'}.texts_field and images_field both name "
                              f"the column {self.texts_field!r}")

    @property
    def document_field(self) -> str:
        """The columns a record's document is in, as errors name them (``texts+images``)."""
        return f"{self.texts_field}+{self.images_field}"

    @property
    def document_parts(self) -> dict[str, tuple[str, ...]]:
        """The parts a format reads together for one document (the lists)."""
        return {"texts": (self.texts_field,), "images": (self.images_field,)}
