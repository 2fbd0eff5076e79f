"""Fuzzing the image decoder: any bytes give an RGB image within the limits or a typed reason.

Seeded (``derandomize``) and small, as every fuzzer here (tests/engine/formats/fuzz): random
bytes behind each format's magic, and real images of each format mutated (bytes flipped, cut,
repeated, spliced).
Each decode must also end in bounded time: no input may hang it.
"""

from __future__ import annotations

import io
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from datalane.engine.images import BadImage, ImageLimits, decode
from datalane.spec.limits import IMAGE_REASONS
from datalane.testing.images import synthetic_image

LIMITS = ImageLimits(max_bytes=1 << 20, max_pixels=1 << 20)  # small: a fuzzer's image is small


def _seeds() -> list[bytes]:
    pixels = synthetic_image(5, 40, 24)
    out = []
    for fmt, kw in (("JPEG", {"quality": 80}), ("JPEG", {"progressive": True}), ("PNG", {}),
                    ("WEBP", {"quality": 70}), ("WEBP", {"lossless": True})):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, fmt, **kw)
        out.append(buf.getvalue())
    buf = io.BytesIO()
    Image.fromarray(pixels).convert("P").save(buf, "PNG", transparency=1)
    out.append(buf.getvalue())
    return out


SEEDS = _seeds()
MAGIC = [b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"RIFF\x10\x00\x00\x00WEBPVP8 "]


def _judge(data: bytes) -> str:
    start = time.monotonic()
    try:
        image = decode(data, LIMITS)
    except BadImage as e:
        assert e.reason in IMAGE_REASONS
        outcome = e.reason
    else:
        assert image.mode == "RGB"
        assert 0 < image.width * image.height <= LIMITS.max_pixels
        assert np.asarray(image).shape == (image.height, image.width, 3)
        outcome = "ok"
    assert time.monotonic() - start < 10.0  # generous on a loaded machine: never a hang
    return outcome


@settings(max_examples=150, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(magic=st.sampled_from(MAGIC), body=st.binary(max_size=600))
def test_random_bytes_behind_a_magic(magic: bytes, body: bytes) -> None:
    _judge(magic + body)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(SEEDS[draw(st.integers(0, len(SEEDS) - 1))])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("flip", "cut", "repeat", "splice", "byte")))
        at = draw(st.integers(min(12, len(data) - 1), len(data) - 1))  # past the magic
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[at] = draw(st.sampled_from((0x00, 0xFF, 0x7F, 0x80)))
        elif op == "cut":
            del data[at:at + draw(st.integers(1, 64))]
        elif op == "repeat":
            data[at:at] = data[at:at + draw(st.integers(1, 64))] * draw(st.integers(1, 8))
        else:
            data[at:at + 4] = draw(st.binary(min_size=4, max_size=4))
        if not data:
            data = bytearray(b"\x00")
    return bytes(data)


@settings(max_examples=300, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=_mutated())
def test_mutated_real_images(data: bytes) -> None:
    _judge(data)


def test_the_seeds_decode_and_the_fuzzers_reach_bad_images() -> None:
    assert [_judge(s) for s in SEEDS] == ["ok"] * len(SEEDS)
    # a header claiming 2048 x 1024: over the fuzzers' 1 Mpx limit
    buf = io.BytesIO()
    Image.new("RGB", (2048, 1024)).save(buf, "PNG")
    assert _judge(buf.getvalue()) == "image_too_large"
