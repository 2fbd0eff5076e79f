"""A deterministic image-caption corpus for the image tests and bench/images.py.

``make_image_corpus(dir, images=N, seed=S)`` draws N synthetic pictures (smooth gradients,
shapes and a little noise, so they compress like photographs do; sizes from thumbnails to
about 1,500 pixels a side with aspect ratios up to 6:1; every fifth a PNG and every fifth
a WebP, the rest JPEG) with a caption each, and writes them twice: as WebDataset tar shards
(``{key}.jpg|png|webp``, ``{key}.txt`` caption, ``{key}.json`` metadata; the layout of
CC12M's ``pixparse/cc12m-wds``, which TorchTitan's ``cc12m`` loader reads) and as one Parquet
file with an image-bytes column (``key``, ``image``, ``ext``, ``caption``). The same arguments
give the same bytes. :func:`hostile_images` gives the malformed images every decoder must
set aside (truncated JPEG, a decompression bomb's header, a zero-size PNG, wrong magic, ...)
with the bad-record reason each must get; ``make_image_corpus`` writes them to a shard of
their own too, in ``hostile/`` (so that ``root/*.tar`` reads valid images only).
``make_llava_corpus(dir, records=N, seed=S)`` writes a LLaVA-style corpus: ``llava.json`` (one
JSON array of records, on one line as LLaVA-Instruct-150K's), the same records as
``llava.jsonl``, and their images in ``images/`` named by paths relative to the files (a
record in four is text only, one in five has two images and two ``<image>`` markers), with
the vision tokenizer and a ChatML template (:data:`CHATML_TEMPLATE`) to read it with.
Callers: tests/engine/images, bench/images.py, docs/vlm.md.
"""

from __future__ import annotations

import io
import json
import os
import random
import struct
import tarfile
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["CHATML_TEMPLATE", "VISION_TOKENS", "ImageCorpus", "LlavaCorpus", "hostile_images",
           "make_image_corpus", "make_llava_corpus", "synthetic_image",
           "write_vision_tokenizer"]

#: Qwen's vision special tokens (torchtitan/models/qwen3_5/__init__.py), which
#: :func:`write_vision_tokenizer` adds to datalane's bundled tokenizer.
VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>",
                 "<|endoftext|>")

_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}
_WORDS = ("a", "red", "blue", "green", "small", "large", "bright", "dark", "square", "circle",
          "stripe", "sky", "over", "under", "beside", "the", "field", "street", "wall", "of",
          "with", "two", "three", "shapes", "light", "shadow", "corner", "picture", "photo")


@dataclass(frozen=True)
class ImageCorpus:
    root: str
    shards: list[str]  # WebDataset tar shards of the valid images, in order
    parquet: str  # the same images and captions in one Parquet file
    hostile: str  # a WebDataset shard of hostile images in hostile/ (reasons in hostile.json)
    tokenizer: str  # datalane's bundled tokenizer with the vision tokens (VISION_TOKENS)
    keys: list[str]
    sizes: list[tuple[int, int]]  # (width, height) of each image, in key order
    encoded_bytes: int  # the valid images' encoded bytes, in all


def _size(rng: random.Random) -> tuple[int, int]:
    """(width, height): mostly photo-like, some thumbnails, some panoramas and strips."""
    kind = rng.random()
    if kind < 0.1:
        return rng.randint(12, 64), rng.randint(12, 64)
    aspect = rng.choice((1.0, 4 / 3, 3 / 4, 16 / 9, 9 / 16, 2.0, 1 / 2, 6.0, 1 / 6))
    area = rng.randint(96, 1100) ** 2
    width = max(8, min(1536, round((area * aspect) ** 0.5)))
    height = max(8, min(1536, round(area / width)))
    return width, height


def synthetic_image(seed: int, width: int, height: int) -> np.ndarray:
    """uint8 (height, width, 3): a gradient, a few rectangles and discs, mild noise."""
    gen = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    c0, c1, c2 = (gen.uniform(0, 255, 3).astype(np.float32) for _ in range(3))
    img = c0 + (c1 - c0) * x + (c2 - c0) * y * (1 - x)
    yy, xx = np.mgrid[0:height, 0:width]
    for _ in range(int(gen.integers(1, 5))):
        color = gen.uniform(0, 255, 3).astype(np.float32)
        cx, cy = gen.uniform(0, width), gen.uniform(0, height)
        r = gen.uniform(0.05, 0.4) * min(width, height) + 1
        if gen.random() < 0.5:
            mask = (np.abs(xx - cx) < r) & (np.abs(yy - cy) < r * gen.uniform(0.3, 1.5))
        else:
            mask = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
        img[mask] = color
    img += gen.normal(0.0, 3.0, img.shape).astype(np.float32)
    out: np.ndarray = np.clip(img, 0, 255).astype(np.uint8)
    return out


def _encode(pixels: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    kw: dict[str, object] = {"quality": 90} if fmt in ("JPEG", "WEBP") else {}
    Image.fromarray(pixels).save(buf, fmt, **kw)
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_header(width: int, height: int, idat: bytes = b"") -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)
            + _png_chunk(b"IEND", b""))


def hostile_images(seed: int = 7) -> dict[str, tuple[bytes, str | None]]:
    """name -> (bytes, the bad-record reason :func:`datalane.engine.images.process` gives, or
    None for the valid but awkward ones: CMYK, 16-bit grey, palette with transparency, grey
    with alpha, an EXIF-rotated JPEG, an animated WebP)."""
    from PIL import Image

    pixels = synthetic_image(seed, 96, 64)
    jpeg = _encode(pixels, "JPEG")
    out: dict[str, tuple[bytes, str | None]] = {
        "truncated_jpeg": (jpeg[: len(jpeg) * 2 // 3], "image_truncated"),
        # 8193 x 4097 pixels: just over MAX_IMAGE_PIXELS, under Pillow's own bound, with a
        # real deflate stream of zero rows behind it (the first rows only: the header decides)
        "bomb_header": (_png_header(8193, 4097, zlib.compress(bytes(8193 * 3 + 1) * 8)),
                        "image_too_large"),
        "giant_header": (_png_header(100_000, 100_000), "image_too_large"),
        "zero_size_png": (_png_header(0, 64), "image_corrupt"),
        "wrong_magic": (b"GIF89a" + jpeg[6:], "image_format"),
        "empty": (b"", "image_format"),
        "text": (b"a caption where an image should be", "image_format"),
        "corrupt_png": (_png_header(16, 16, b"\x00not a deflate stream"), "image_corrupt"),
        "strip_201_to_1": (_encode(np.zeros((1, 201 * 32, 3), np.uint8) + 128, "PNG"),
                           "image_aspect"),
    }
    awkward: dict[str, Image.Image] = {
        "cmyk_jpeg": Image.fromarray(pixels).convert("CMYK"),
        "grey16_png": Image.fromarray(pixels[:, :, 0].astype(np.uint16) * 257),
        "palette_trns_png": Image.fromarray(pixels).convert("P"),
        "grey_alpha_png": Image.fromarray(pixels).convert("LA"),
    }
    for name, im in awkward.items():
        buf = io.BytesIO()
        fmt = "JPEG" if name.endswith("jpeg") else "PNG"
        im.save(buf, fmt, **({"transparency": 0} if name.startswith("palette") else {}))
        out[name] = (buf.getvalue(), None)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", exif=exif.tobytes())
    out["exif_rotated_jpeg"] = (buf.getvalue(), None)
    frames = [Image.fromarray(pixels), Image.fromarray(255 - pixels)]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    out["animated_webp"] = (buf.getvalue(), None)
    return out


def _tar(path: str, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))


def write_vision_tokenizer(path: str) -> str:
    """Write datalane's bundled tokenizer with :data:`VISION_TOKENS` added (as special tokens,
    never split) to ``path``; returns ``path``. The same bytes every time."""
    from tokenizers import AddedToken, Tokenizer

    from datalane.testing import tokenizer_path

    tok = Tokenizer.from_file(tokenizer_path())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in VISION_TOKENS])
    tok.save(path)
    return path


def _caption(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 24)))


def make_image_corpus(root: str, images: int = 64, seed: int = 29, per_shard: int = 16,
                      jpeg_only: bool = False) -> ImageCorpus:
    """Write the corpus under ``root`` (see the module docstring); ``jpeg_only``: every image a
    JPEG (TorchTitan's ``cc12m`` processor reads the ``jpg`` member only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(root, exist_ok=True)
    rng = random.Random(seed)
    keys: list[str] = []
    sizes: list[tuple[int, int]] = []
    rows: dict[str, list[object]] = {"key": [], "image": [], "ext": [], "caption": []}
    shards: list[str] = []
    members: list[tuple[str, bytes]] = []
    total = 0
    for i in range(images):
        width, height = _size(rng)
        fmt = "JPEG" if jpeg_only else "PNG" if i % 5 == 3 else "WEBP" if i % 5 == 4 else "JPEG"
        data = _encode(synthetic_image(rng.getrandbits(32), width, height), fmt)
        key, ext, caption = f"{i:08d}", _EXT[fmt], _caption(rng)
        meta = {"key": key, "caption": caption, "width": width, "height": height}
        members += [(f"{key}.{ext}", data), (f"{key}.json", json.dumps(meta).encode()),
                    (f"{key}.txt", caption.encode())]
        for name, value in (("key", key), ("image", data), ("ext", ext), ("caption", caption)):
            rows[name].append(value)
        keys.append(key)
        sizes.append((width, height))
        total += len(data)
        if len(keys) % per_shard == 0 or i == images - 1:
            shards.append(os.path.join(root, f"images-{len(shards):06d}.tar"))
            _tar(shards[-1], members)
            members = []
    parquet = os.path.join(root, "images.parquet")
    table = pa.table({"key": pa.array(rows["key"], pa.string()),
                      "image": pa.array(rows["image"], pa.binary()),
                      "ext": pa.array(rows["ext"], pa.string()),
                      "caption": pa.array(rows["caption"], pa.string())})
    pq.write_table(table, parquet, row_group_size=per_shard)
    os.makedirs(os.path.join(root, "hostile"), exist_ok=True)  # apart: ``root/*.tar`` is valid
    hostile = os.path.join(root, "hostile", "hostile-000000.tar")
    samples = hostile_images(seed)
    _tar(hostile, [m for n, (data, _) in samples.items()
                   for m in ((f"{n}.img", data), (f"{n}.txt", n.encode()))])
    with open(os.path.join(root, "hostile", "hostile.json"), "w") as f:
        json.dump({n: reason for n, (_, reason) in samples.items()}, f, indent=1, sort_keys=True)
    tokenizer = write_vision_tokenizer(os.path.join(root, "tokenizer.json"))
    return ImageCorpus(root, shards, parquet, hostile, tokenizer, keys, sizes, total)


#: A ChatML chat template (Qwen's turn layout, no default system prompt) for the LLaVA corpus.
CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                   "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant"
                   "\n{% endif %}")


@dataclass(frozen=True)
class LlavaCorpus:
    root: str
    json: str  # the records as one JSON array
    jsonl: str  # the same records, one a line
    tokenizer: str  # the vision tokenizer (VISION_TOKENS added)
    records: list[dict[str, object]]
    images: int  # image files referenced, in all (a record's count is its markers')


def make_llava_corpus(root: str, records: int = 24, seed: int = 31) -> LlavaCorpus:
    """Write the LLaVA corpus under ``root`` (see the module docstring); the same arguments
    give the same bytes."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    out: list[dict[str, object]] = []
    count = 0
    for i in range(records):
        n = 0 if i % 4 == 3 else 2 if i % 5 == 4 else 1
        paths = []
        for k in range(n):
            fmt = "PNG" if (i + k) % 3 == 2 else "JPEG"
            name = f"images/{i:06d}_{k}.{_EXT[fmt]}"
            width, height = rng.randint(24, 160), rng.randint(24, 160)
            with open(os.path.join(root, name), "wb") as f:
                f.write(_encode(synthetic_image(rng.getrandbits(32), width, height), fmt))
            paths.append(name)
        count += n
        question = "<image>\n" * n + _caption(rng) + "?"
        turns = [{"from": "human", "value": question}, {"from": "gpt", "value": _caption(rng)}]
        if i % 3 == 1:
            turns += [{"from": "human", "value": _caption(rng) + "?"},
                      {"from": "gpt", "value": _caption(rng) + "."}]
        record: dict[str, object] = {"id": f"{i:012d}"}
        if n:
            record["image"] = paths[0] if n == 1 else paths
        record["conversations"] = turns
        out.append(record)
    path = os.path.join(root, "llava.json")
    with open(path, "w") as f:
        json.dump(out, f)
    lines = os.path.join(root, "llava.jsonl")
    with open(lines, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in out)
    tokenizer = write_vision_tokenizer(os.path.join(root, "tokenizer.json"))
    return LlavaCorpus(root, path, lines, tokenizer, out, count)
