"""datalane.engine.images.decode: RGB pixels within bounds, or a typed bad-image reason."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from datalane.engine.images import BadImage, ImageLimits, ImageRule, decode, process, sniff
from datalane.spec.errors import ConfigError
from datalane.spec.limits import IMAGE_REASONS, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from datalane.testing.images import hostile_images, synthetic_image
from tests.engine.images.conftest import corpus_images

PIXELS = synthetic_image(7, 96, 64)  # what hostile_images(7) encodes


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("name", sorted(hostile_images()))
def test_every_hostile_sample_gets_its_reason(name: str) -> None:
    data, reason = hostile_images()[name]
    if reason is None:
        image = decode(data)
        assert (image.mode, image.size) == ("RGB", (96, 64))
        return
    with pytest.raises(BadImage) as e:
        process(data, ImageRule())
    assert e.value.reason == reason
    assert reason in IMAGE_REASONS
    assert "0x" not in e.value.detail  # no object address: the same detail on every run


def test_a_lossless_png_decodes_to_its_pixels() -> None:
    image = decode(_png(PIXELS))
    assert image.mode == "RGB"
    assert np.array_equal(np.asarray(image), PIXELS)


def test_awkward_modes_become_rgb_as_documented() -> None:
    samples = hostile_images()
    # 16-bit grey v * 257: the high byte is v again (Pillow's convert would clip to 255)
    grey16 = np.asarray(decode(samples["grey16_png"][0]))
    assert np.array_equal(grey16, np.repeat(PIXELS[:, :, :1], 3, axis=2))
    # grey with alpha: the alpha is dropped, not composited
    la = Image.fromarray(PIXELS).convert("L")
    assert np.array_equal(np.asarray(decode(samples["grey_alpha_png"][0])),
                          np.asarray(la.convert("RGB")))
    # a palette with a transparent index: looked up, transparency ignored
    pal = Image.fromarray(PIXELS).convert("P").convert("RGB")
    assert np.array_equal(np.asarray(decode(samples["palette_trns_png"][0])), np.asarray(pal))


def test_exif_orientation_is_applied_only_when_asked() -> None:
    data = hostile_images()["exif_rotated_jpeg"][0]
    plain = np.asarray(decode(data))
    assert plain.shape == (64, 96, 3)  # as stored, as TorchTitan's loader reads it
    turned = np.asarray(decode(data, ImageLimits(exif_transpose=True)))
    assert turned.shape == (96, 64, 3)
    assert np.array_equal(turned, np.rot90(plain, k=-1))  # orientation 6: 90 degrees clockwise


def test_encoded_bytes_over_the_limit_are_too_large_before_opening() -> None:
    data = _png(PIXELS)
    decode(data, ImageLimits(max_bytes=len(data)))
    with pytest.raises(BadImage) as e:
        decode(data, ImageLimits(max_bytes=len(data) - 1))
    assert e.value.reason == "image_too_large"
    assert f"{len(data):,} encoded bytes" in e.value.detail


def test_the_pixel_limit_is_checked_on_the_header_before_decoding() -> None:
    # 96 x 64 = 6,144 pixels: at the limit it decodes, one under it is too large
    data = _png(PIXELS)
    assert decode(data, ImageLimits(max_pixels=6144)).size == (96, 64)
    with pytest.raises(BadImage) as e:
        decode(data, ImageLimits(max_pixels=6143))
    assert (e.value.reason, "96 x 64 = 6,144 pixels" in e.value.detail) == (
        "image_too_large", True)
    # the bomb's data holds 8 rows of 4,097: decoding it would say truncated, not too large
    bomb = hostile_images()["bomb_header"][0]
    with pytest.raises(BadImage) as e:
        decode(bomb)
    assert e.value.reason == "image_too_large"
    assert "8193 x 4097" in e.value.detail


def test_the_pixel_limit_does_not_depend_on_pillows_global(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # a process that switched it off
    for name in ("bomb_header", "giant_header"):
        with pytest.raises(BadImage) as e:
            decode(hostile_images()[name][0])
        assert e.value.reason == "image_too_large"
        assert f"over the limit of {MAX_IMAGE_PIXELS:,}" in e.value.detail


def test_a_jpegs_scans_are_bounded_before_decoding() -> None:
    buf = io.BytesIO()
    Image.fromarray(PIXELS).save(buf, "JPEG", progressive=True)
    data = buf.getvalue()
    assert data.count(b"\xff\xda") == 10  # libjpeg's default progressive script
    assert decode(data, ImageLimits(max_scans=10)).size == (96, 64)
    with pytest.raises(BadImage) as e:
        decode(data, ImageLimits(max_scans=9))
    assert (e.value.reason, e.value.detail) == (
        "image_too_large", "a JPEG of 10 scans, over the limit of 9")


def test_only_jpeg_png_and_webp_open() -> None:
    for fmt in ("GIF", "BMP", "TIFF", "PPM"):
        buf = io.BytesIO()
        Image.fromarray(PIXELS).save(buf, fmt)
        with pytest.raises(BadImage) as e:
            decode(buf.getvalue())
        assert e.value.reason == "image_format", fmt
    assert [sniff(b"\xff\xd8\xff\xe0"), sniff(b"\x89PNG\r\n\x1a\n"),
            sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 "), sniff(b"RIFF\x00\x00\x00\x00WAVE")] == [
        "JPEG", "PNG", "WEBP", None]


@pytest.mark.parametrize("field,value", [("max_bytes", 0), ("max_bytes", MAX_IMAGE_BYTES + 1),
                                         ("max_scans", 0), ("max_scans", 101),
                                         ("max_pixels", True), ("max_pixels", 1.5),
                                         ("max_pixels", MAX_IMAGE_PIXELS + 1)])
def test_limits_may_only_be_lowered(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"images.{field}: {value!r}"):
        ImageLimits(**{field: value})  # type: ignore[arg-type]


def test_threads_decode_the_same_pixels(image_corpus) -> None:  # type: ignore[no-untyped-def]
    blobs = [data for _, data in corpus_images(image_corpus)] * 3
    serial = [np.asarray(decode(b)).tobytes() for b in blobs]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda b: np.asarray(decode(b)).tobytes(), blobs))
    assert threaded == serial
