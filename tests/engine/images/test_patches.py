"""datalane.engine.images.patches: TorchTitan's patch layout and pixel values, bit for bit."""

from __future__ import annotations

import io
import types

import numpy as np
import pytest
from PIL import Image

from datalane.engine.images import (
    ImageRule,
    PatchRule,
    decode,
    normalize,
    normalize_table,
    patchify,
    placeholders,
    process,
    target_size,
)
from datalane.testing.images import synthetic_image
from tests.engine.images.conftest import corpus_images

torch = pytest.importorskip("torch")

CLIP = PatchRule(patch_size=14, merge_size=2, mean=(0.48145466, 0.4578275, 0.40821073),
                 std=(0.26862954, 0.26130258, 0.27577711))


def _titan_values(pixels: np.ndarray, rule: PatchRule) -> torch.Tensor:
    """TorchTitan's process_image normalisation (torchvision's to_dtype and normalize, whose
    operations these are) of (H, W, 3) uint8 pixels, as (1, H, W, C) float32."""
    t = torch.from_numpy(pixels).permute(2, 0, 1).to(torch.float32).mul_(1.0 / 255)
    t = t.sub_(torch.tensor(rule.mean).view(-1, 1, 1)).div_(torch.tensor(rule.std).view(-1, 1, 1))
    return t.permute(1, 2, 0).unsqueeze(0)


def test_the_tiny_block_order_of_torchtitans_docstring() -> None:
    # a 2 x 4 grid of 1-pixel patches, merge 2: block order 0 1 4 5 2 3 6 7
    pixels = np.repeat(np.arange(8, dtype=np.uint8).reshape(2, 4, 1), 3, axis=2)
    rule = PatchRule(patch_size=1, temporal_patch_size=2, merge_size=2)
    p = patchify(pixels, rule)
    assert p.grid_thw == (1, 2, 4)
    assert p.tokens == 2
    # each row: (c, pt, ph, pw) = 3 channels x 2 frames of the one pixel
    assert p.values.tolist() == [[v] * 6 for v in (0, 1, 4, 5, 2, 3, 6, 7)]
    raster = patchify(pixels, PatchRule(patch_size=1, merge_size=2, order="raster"))
    assert raster.values[:, 0].tolist() == list(range(8))
    single = patchify(pixels, rule, repeat_frames=False)
    assert single.values.tolist() == [[v] * 3 for v in (0, 1, 4, 5, 2, 3, 6, 7)]


@pytest.mark.parametrize("rule", [PatchRule(), PatchRule(order="raster"), CLIP,
                                  PatchRule(patch_size=14, temporal_patch_size=1, merge_size=1)])
@pytest.mark.parametrize("bh,bw", [(1, 1), (2, 3), (5, 2)])
def test_patches_equal_torchtitans_vision_to_patches(titan_image: types.ModuleType,
                                                     rule: PatchRule, bh: int, bw: int) -> None:
    f = rule.patch_size * rule.merge_size
    pixels = np.random.default_rng(bh * 7 + bw).integers(0, 256, (bh * f, bw * f, 3), np.uint8)
    p = patchify(pixels, rule)
    theirs, grid = titan_image.vision_to_patches(
        _titan_values(pixels, rule), rule.patch_size, rule.temporal_patch_size,
        rule.merge_size, patch_order=rule.order)
    ours = normalize(p.values, rule)
    assert ours.dtype == np.float32 and ours.shape == tuple(theirs.shape)
    assert ours.tobytes() == theirs.numpy().tobytes()
    assert p.grid_thw == tuple(grid.tolist())
    tokens, _, _ = titan_image.calculate_vision_tokens(1, bh * f, bw * f, rule.patch_size,
                                                       rule.merge_size, 1)
    assert p.tokens == tokens == placeholders(p.grid_thw, rule.merge_size)


@pytest.mark.parametrize("rule", [PatchRule(), CLIP])
def test_the_table_is_torchvisions_arithmetic_for_every_byte(rule: PatchRule) -> None:
    levels = np.repeat(np.arange(256, dtype=np.uint8).reshape(1, 256, 1), 3, axis=2)
    theirs = _titan_values(levels, rule)[0, 0].numpy().T  # (3, 256)
    assert normalize_table(rule).tobytes() == theirs.tobytes()


def test_the_pipeline_equals_torchtitans_process_image(titan_image: types.ModuleType,
                                                       image_corpus) -> None:  # type: ignore[no-untyped-def]
    """Decoding is byte-equal to torchvision's (libjpeg-turbo, libpng, libwebp); the size
    and grid always equal; the pixels are byte-equal where no resize happens and within a
    few levels where one does (Pillow's fixed-point bicubic vs torch's int16 AVX kernel:
    docs/vlm.md, Resizing)."""
    pytest.importorskip("torchvision")
    rule = ImageRule()
    exact = resized = 0
    worst = 0.0
    on_grid = []  # already multiples of 32 and in the budget: no resize on either side
    for fmt, (w, h) in (("PNG", (640, 480)), ("JPEG", (512, 512)), ("WEBP", (320, 960))):
        buf = io.BytesIO()
        Image.fromarray(synthetic_image(w + h, w, h)).save(buf, fmt)
        on_grid.append(buf.getvalue())
    for data in [d for _, d in corpus_images(image_corpus)] + on_grid:
        theirs_img = titan_image.process_image(data)
        assert theirs_img is not None
        theirs, grid = titan_image.vision_to_patches(theirs_img, 16, 2, 2)
        p = process(data, rule)
        ours = normalize(p.values, rule.patches)
        assert p.grid_thw == tuple(grid.tolist())
        assert ours.shape == tuple(theirs.shape)
        decoded = np.asarray(decode(data))
        raw = titan_image._decode_image(data).permute(1, 2, 0).numpy()
        assert decoded.tobytes() == raw.tobytes()
        h, w = decoded.shape[:2]
        if target_size(h, w, rule.resize) == (h, w):
            assert ours.tobytes() == theirs.numpy().tobytes()
            exact += 1
            continue
        levels = np.abs(ours - theirs.numpy()) * 127.5  # std 0.5: one level is 2/255
        assert levels.max() <= 16.5 and levels.mean() < 0.25, (h, w, levels.max())
        worst = max(worst, float(levels.max()))
        resized += 1
    assert (exact, resized) == (3, 20)
