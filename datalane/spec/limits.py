"""Bounds on what one record of a source file may cost, shared by every format's reader.

A source file is hostile until checked: a header may claim a 4 GiB member, a line may never
end, a compressed frame may expand a thousandfold. A reader that would hold more than
:data:`MAX_RECORD_BYTES` for one record (a JSONL line, a tar member, an MDS sample, an Arrow
value) does not read it: the record is a bad record of reason :data:`TOO_LARGE`, counted under
``bad_records: skip`` and named with its file and offset under ``fail``. The bound is part of
the format contract (the same for every recipe), so it never changes which documents a valid
corpus yields. Callers: the readers in :mod:`datalane.engine.formats`.
"""

from __future__ import annotations

__all__ = [
    "IMAGE_ASPECT", "IMAGE_CORRUPT", "IMAGE_FORMAT", "IMAGE_REASONS", "IMAGE_TOO_LARGE",
    "IMAGE_TRUNCATED", "MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS", "MAX_JPEG_SCANS", "MAX_RECORD_BYTES",
    "MAX_RESIZE_PIXELS", "TOO_LARGE",
]

MAX_RECORD_BYTES = 64 << 20
"""The most bytes one raw record may hold, after decompression (64 MiB)."""

TOO_LARGE = "too_large"
"""The bad-record reason of a record over :data:`MAX_RECORD_BYTES`."""

# Images (datalane.engine.images): the bounds on one encoded image and its decoded pixels, and
# the bad-record reasons of an image that cannot be used. Like MAX_RECORD_BYTES they are part of
# the format contract; a recipe may only lower them (docs/vlm.md, Decoding).

MAX_IMAGE_BYTES = 32 << 20
"""The most encoded bytes one image may have (32 MiB), checked before it is opened."""

MAX_IMAGE_PIXELS = 1 << 25
"""The most pixels (width x height) one image may declare in its header (33,554,432: 8192 x
4096), checked before a pixel is decoded; it bounds a decode's memory (docs/vlm.md)."""

MAX_RESIZE_PIXELS = MAX_IMAGE_PIXELS
"""The most pixels an image may be resized to (33,554,432, as many as one may decode): a recipe's
fixed ``resize.size`` and its budget's ``max_pixels`` are refused over it when the recipe loads,
and an image whose target the rule puts over it (the budget's rule keeps a side at least one
merged patch, so a 200:1 image may land above ``max_pixels``) is ``image_too_large``. It bounds
the resized image's memory (4 bytes a pixel in Pillow, 3 more in its patches) and its
placeholder run (``MAX_RESIZE_PIXELS / factor**2`` tokens)."""

MAX_JPEG_SCANS = 100
"""The most scans one JPEG may have. Each scan of a progressive JPEG is another pass over every
pixel, so scans, not bytes, bound its decode time; encoders write about 10 (libjpeg's default
progressive script has 10), libjpeg-turbo itself sets no limit (its ``djpeg -maxscans``)."""

IMAGE_CORRUPT = "image_corrupt"
"""An image whose header or data the decoder rejects (wrong checksum, bad marker, zero size)."""

IMAGE_TRUNCATED = "image_truncated"
"""An image whose data ends before its pixels do."""

IMAGE_TOO_LARGE = "image_too_large"
"""An image over :data:`MAX_IMAGE_BYTES` encoded, :data:`MAX_IMAGE_PIXELS` declared or
:data:`MAX_JPEG_SCANS` scans (or a recipe's lower bounds): a decompression bomb is one."""

IMAGE_FORMAT = "image_format"
"""Bytes that are not one of the decoded formats (JPEG, PNG, WebP): wrong magic."""

IMAGE_ASPECT = "image_aspect"
"""An image whose longer side is over 200 times its shorter one (TorchTitan's bound)."""

IMAGE_REASONS = frozenset({IMAGE_CORRUPT, IMAGE_TRUNCATED, IMAGE_TOO_LARGE, IMAGE_FORMAT,
                           IMAGE_ASPECT})
"""Every bad-record reason of an image; the ``bad_records`` policy applies to all of them."""
