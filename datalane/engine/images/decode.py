"""Decoding one encoded image into RGB pixels, within declared bounds.

The first step of an image document (docs/vlm.md, Decoding). :func:`decode` is pure and
stateless: it reads no global setting of Pillow that it could be changed by (the pixel bound is
its own, checked on the header's size after :func:`PIL.Image.open` and before a pixel is
decoded, not Pillow's process-wide ``Image.MAX_IMAGE_PIXELS``), so it gives the same pixels for
the same bytes on any thread; the two process-wide settings Pillow does read
(``ImageFile.LOAD_TRUNCATED_IMAGES``, a ``MAX_IMAGE_PIXELS`` under the bound) are refused with
a ConfigError instead of changing the result. An image that cannot be used raises
:class:`BadImage` with one of
the reasons of :data:`datalane.spec.limits.IMAGE_REASONS`; the caller (the image document kind,
the bench, the tests) turns it into a bad record. Callers: :mod:`datalane.engine.images.pipeline`,
bench/images.py.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from datalane.spec.errors import ConfigError
from datalane.spec.limits import (
    IMAGE_CORRUPT,
    IMAGE_FORMAT,
    IMAGE_TOO_LARGE,
    IMAGE_TRUNCATED,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_JPEG_SCANS,
)

__all__ = ["FORMATS", "BadImage", "ImageLimits", "decode", "sniff"]

Image.init()  # register the plugins once, at import, not racing on the first decode

FORMATS = ("JPEG", "PNG", "WEBP")
"""The encodings :func:`decode` opens (by their magic bytes, never by a file name); every
other plugin of Pillow (EPS, PSD, TIFF, ...) is closed to source bytes."""

_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"))


class BadImage(Exception):
    """An image that cannot be used: ``reason`` is one of
    :data:`~datalane.spec.limits.IMAGE_REASONS`, ``detail`` says what was wrong with it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageLimits:
    """The bounds on one image. ``max_bytes``: encoded bytes; ``max_pixels``: width x height
    declared in the header; ``max_scans``: start-of-scan markers of a JPEG (each scan of a
    progressive JPEG is another pass over every pixel). All default to the format contract's
    bounds (:mod:`datalane.spec.limits`) and may only be lowered. ``exif_transpose``: turn the image
    as its EXIF orientation says (off by default, as TorchTitan's loader: docs/vlm.md)."""

    max_bytes: int = MAX_IMAGE_BYTES
    max_pixels: int = MAX_IMAGE_PIXELS
    exif_transpose: bool = False
    max_scans: int = MAX_JPEG_SCANS

    def __post_init__(self) -> None:
        for name, value, top in (("max_bytes", self.max_bytes, MAX_IMAGE_BYTES),
                                 ("max_pixels", self.max_pixels, MAX_IMAGE_PIXELS),
                                 ("max_scans", self.max_scans, MAX_JPEG_SCANS)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
                raise ConfigError(f"images.{name}: {value!r} is not an integer in [1, {top:,}]")


def sniff(data: bytes) -> str | None:
    """The encoding of ``data`` by its magic bytes (one of :data:`FORMATS`), or None."""
    for magic, name in _MAGIC:
        if data[:len(magic)] == magic:
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def _failed(e: BaseException, when: str) -> BadImage:
    """The bad-image reason of an exception Pillow raised while ``when``."""
    if isinstance(e, Image.DecompressionBombError):  # Pillow's own (higher) global bound
        return BadImage(IMAGE_TOO_LARGE, f"{when}: {e}")
    if isinstance(e, UnidentifiedImageError):  # its text names the BytesIO's address
        return BadImage(IMAGE_CORRUPT, f"{when}: the decoder does not recognise the header")
    text = str(e) or type(e).__name__
    if isinstance(e, EOFError) or "truncated" in text.lower():
        return BadImage(IMAGE_TRUNCATED, f"{when}: {text}")
    return BadImage(IMAGE_CORRUPT, f"{when}: {type(e).__name__}: {text}")


def _to_rgb(im: Image.Image) -> Image.Image:
    """``im`` as 8-bit RGB: alpha is dropped (not composited), a palette is looked up, CMYK
    and YCbCr go through Pillow's conversion, and 16-bit grey keeps its high byte (Pillow's
    own ``convert`` would clip 16-bit values to 255)."""
    if im.mode == "RGB":
        return im
    if im.mode.startswith("I"):  # "I;16", "I;16B", "I" (16-bit PNG grey)
        grey = np.asarray(im)  # uint16, or int32 for "I"
        high = (np.clip(grey, 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(np.repeat(high[:, :, None], 3, axis=2))
    return im.convert("RGB")


def _check_pillow_globals(limits: ImageLimits) -> None:
    """Pillow reads two process-wide settings while opening and loading: with
    ``ImageFile.LOAD_TRUNCATED_IMAGES`` a truncated image decodes to grey-filled pixels
    instead of failing, and ``Image.MAX_IMAGE_PIXELS`` under ``limits.max_pixels`` drops
    (or, with warnings as errors, fails) images this bound keeps. Either would make the same
    bytes give another result in this process than in the sidecar: refused, naming it."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise ConfigError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True in this process (set by "
                          "some library or script): truncated images would decode to filled "
                          "pixels here and fail elsewhere; set it back to False")
    bound = Image.MAX_IMAGE_PIXELS
    if bound is not None and bound < limits.max_pixels:
        raise ConfigError(f"PIL.Image.MAX_IMAGE_PIXELS is {bound!r} in this process, under "
                          f"images.max_pixels {limits.max_pixels:,}: images between the two "
                          f"would be dropped here only; raise it or set it to None")


def decode(data: bytes, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """The RGB pixels of the encoded image ``data`` (JPEG, PNG or WebP; an animation's first
    frame). Raises :class:`BadImage`: ``image_too_large`` over ``limits`` (bytes checked
    first, a JPEG's scans next, then the header's width x height before decoding: a
    decompression bomb costs its header only), ``image_format`` for other magic bytes,
    ``image_truncated`` when the data ends early, ``image_corrupt`` for anything else the
    decoder rejects. Never raises another exception for any bytes
    (tests/engine/images/test_fuzz.py)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadImage(IMAGE_CORRUPT, f"a {type(data).__name__}, not bytes")
    size = len(data)
    if size > limits.max_bytes:
        raise BadImage(IMAGE_TOO_LARGE,
                       f"{size:,} encoded bytes, over the limit of {limits.max_bytes:,}")
    fmt = sniff(bytes(data[:12]))
    if fmt is None:
        head = bytes(data[:8]).hex(" ")
        raise BadImage(IMAGE_FORMAT, f"{size:,} bytes starting {head or '(empty)'} are not "
                                     f"{', '.join(FORMATS[:-1])} or {FORMATS[-1]}")
    if fmt == "JPEG":
        # every FF DA is a start-of-scan marker or inside a segment (an EXIF thumbnail's):
        # an upper bound on the scans, counted in C before any is decoded
        scans = bytes(data).count(b"\xff\xda") if isinstance(data, memoryview) else \
            data.count(b"\xff\xda")
        if scans > limits.max_scans:
            raise BadImage(IMAGE_TOO_LARGE, f"a JPEG of {scans:,} scans, over the limit of "
                                            f"{limits.max_scans:,}")
    _check_pillow_globals(limits)
    try:
        im = Image.open(io.BytesIO(data), formats=[fmt])
    except Exception as e:  # any exception on hostile bytes is a bad image, by contract
        raise _failed(e, f"reading the {fmt} header") from None
    width, height = im.size
    if width <= 0 or height <= 0:
        raise BadImage(IMAGE_CORRUPT, f"the {fmt} header says {width} x {height} pixels")
    if width * height > limits.max_pixels:
        raise BadImage(IMAGE_TOO_LARGE,
                       f"the {fmt} header says {width} x {height} = {width * height:,} "
                       f"pixels, over the limit of {limits.max_pixels:,}")
    try:
        im.load()
        turned: Image.Image = ImageOps.exif_transpose(im) if limits.exif_transpose else im
        rgb = _to_rgb(turned)
    except Exception as e:  # as above: the decoder's exceptions are the image's fault
        raise _failed(e, f"decoding the {width} x {height} {fmt} image") from None
    return rgb
