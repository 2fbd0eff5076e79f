"""decode() reads no process-wide Pillow setting, so the same bytes give the same result in
any process. PIL.ImageFile.LOAD_TRUNCATED_IMAGES (set to True by many VLM
codebases) and a lowered PIL.Image.MAX_IMAGE_PIXELS change its result."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFile

from datalane.engine.images import BadImage, decode
from datalane.spec.errors import ConfigError
from datalane.spec.limits import IMAGE_TRUNCATED


def _encoded(fmt: str) -> bytes:
    pixels = (np.arange(64 * 64 * 3) % 251).astype("uint8").reshape(64, 64, 3)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_image_is_never_decoded_whatever_load_truncated_images(
        fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _encoded(fmt)[:-150]
    with pytest.raises(BadImage) as e:
        decode(data)
    assert e.value.reason == IMAGE_TRUNCATED
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    # the same bytes must not turn into grey-filled pixels in a process that set the flag
    with pytest.raises((BadImage, ConfigError)) as e2:
        decode(data)
    assert "LOAD_TRUNCATED_IMAGES" in str(e2.value) or (
        isinstance(e2.value, BadImage) and e2.value.reason == IMAGE_TRUNCATED)


def test_a_lowered_pillow_pixel_bound_does_not_drop_images_silently(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = _encoded("PNG")
    assert decode(data).size == (64, 64)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 4096 px > 2 x 1000
    try:
        assert decode(data).size == (64, 64)
    except BadImage as e:  # dropped as image_too_large only in this process: not deterministic
        pytest.fail(f"the same bytes are a bad image once PIL.Image.MAX_IMAGE_PIXELS is "
                    f"lowered: {e}")
    except ConfigError as e:
        assert "MAX_IMAGE_PIXELS" in str(e)
