"""Image-caption throughput: TorchTitan's multimodal loader, webdataset + Pillow, datalane.

Writes a JPEG image-caption corpus (datalane/testing/images.py, CC12M's WebDataset layout)
and turns every image into the vision encoder's patches (Qwen3.5's rule: patch 16, merge 2,
65,536..16,777,216 pixels) with:

* ``torchtitan``: TorchTitan 0.3.0's ``MMDataLoader`` (its ``cc12m-test`` reader over the
  local shards through HF ``datasets``, ``process_image``, the packer off, the collator with
  M-RoPE positions), ``num_workers=0`` as its configs set; needs torchvision (skipped
  without it);
* ``wds-N``: ``webdataset`` + Pillow decode, Pillow bicubic resize, torch normalise and
  patchify, in a ``torch.utils.data.DataLoader`` with N workers (0, 1, 2);
* ``datalane-N``: :func:`datalane.engine.images.process` (decode, resize, uint8 patches) and
  :func:`~datalane.engine.images.normalize` in a thread pool of N threads (1, 2): whether
  decode and resize release the GIL (2 threads at >= 1.8x one on 2 free cores).

Prints images/s, vision tokens/s (placeholder tokens: t*h*w/4) and the bytes per image of
the pixel output (float32 as TorchTitan's collator holds it; uint8 without the repeated
frame as a lane would ship it), with the machine's load average; and, before the peers, each
stage's CPU time per image and the share of it holding the GIL (py-spy, bench/scaling.py's
probe), which bounds what N threads can reach whatever the load of the machine::

    .venv/bin/python bench/images.py --quick
    PYTHONPATH=/tmp/tvpkg .venv/bin/python bench/images.py --images 256   # with torchvision

``--worst`` times one decode at the limits (an 8192 x 4096 noise JPEG, progressive JPEG, PNG
and WebP: MAX_IMAGE_PIXELS), the measured bound of docs/vlm.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from datalane.engine.images import ImageRule, PatchRule, normalize, normalize_table, process
from datalane.engine.images.resize import target_size
from datalane.testing.images import (
    VISION_TOKENS,
    ImageCorpus,
    make_image_corpus,
    write_vision_tokenizer,
)

RULE = ImageRule()
QWEN_TOKENS = list(VISION_TOKENS)


def _row(name: str, seconds: float, images: int, tokens: int, out_bytes: int) -> dict[str, object]:
    return {"peer": name, "images": images, "seconds": round(seconds, 3),
            "images_per_s": round(images / seconds, 1),
            "vision_tokens_per_s": round(tokens / seconds),
            "out_bytes_per_image": round(out_bytes / max(images, 1))}


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (DataLoader workers): the
    work a peer does per image, which the machine's load does not inflate as it does wall
    time."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _blobs(corpus: ImageCorpus) -> list[bytes]:
    import pyarrow.parquet as pq

    return [r["image"] for r in pq.read_table(corpus.parquet, columns=["image"]).to_pylist()]


def bench_datalane(blobs: list[bytes], threads: int) -> dict[str, object]:
    table = normalize_table(RULE.patches)

    def one(data: bytes) -> tuple[int, int, int]:
        p = process(data, RULE, repeat_frames=False)
        values = normalize(p.values, RULE.patches, table)
        return p.tokens, values.nbytes * RULE.patches.temporal_patch_size, p.values.nbytes

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        out = list(pool.map(one, blobs))
    seconds = time.perf_counter() - t0
    row = _row(f"datalane-{threads}", seconds, len(out), sum(o[0] for o in out),
               sum(o[1] for o in out))
    row["shipped_uint8_bytes_per_image"] = round(sum(o[2] for o in out) / len(out))
    return row


def _stages(blobs: list[bytes]) -> dict[str, Callable[[], None]]:
    """Each stage of :func:`process` over every image, its inputs prepared beforehand."""
    from datalane.engine.images import decode, patchify, resize

    table = normalize_table(RULE.patches)
    images = [decode(b, RULE.limits) for b in blobs]
    resized = [resize(im, RULE.resize) for im in images]
    pixels = [np.asarray(im) for im in resized]
    patches = [patchify(px, RULE.patches, repeat_frames=False).values for px in pixels]
    return {
        "decode": lambda: [decode(b, RULE.limits) for b in blobs] and None,
        "resize": lambda: [resize(im, RULE.resize) for im in images] and None,
        "patchify": lambda: [patchify(px, RULE.patches, repeat_frames=False)
                             for px in pixels] and None,
        "normalize": lambda: [normalize(v, RULE.patches, table) for v in patches] and None,
    }


def bench_stages(blobs: list[bytes], seconds: int = 3) -> dict[str, object]:
    """Per stage: CPU ms per image of one thread, and the share of that CPU time spent holding
    the GIL, measured by bench/scaling.py's py-spy probe (``--gil``: samples of the thread
    holding the GIL, weighted by its on-CPU share, so the machine's load does not inflate
    it). A stage holding the GIL a share g lets N threads run at most 1 / (g + (1 - g) / N)
    times one. A pure-Python loop is measured too, as the probe's calibration (about 1)."""
    from bench.scaling import GilProbe, pyspy_binary

    stages = _stages(blobs)
    stages["calibration: python loop"] = lambda: sum(i * i for i in range(200_000)) and None
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, run in stages.items():
            c0 = time.thread_time()
            run()
            row = {"cpu_ms_per_image": round((time.thread_time() - c0) * 1000 / len(blobs), 2)}
            if pyspy_binary() is not None:
                probe = GilProbe(os.getpid(), seconds, 200, Path(tmp))
                c0 = time.thread_time()
                while probe.running():
                    run()
                cpu = time.thread_time() - c0
                held = probe.result()["gil_share"] * seconds
                row["gil_held_share"] = round(min(held / cpu, 1.0), 2)
            out[name] = row
    rows = [r for n, r in out.items() if not n.startswith("calibration")]
    calib = out["calibration: python loop"].get("gil_held_share", 0.0)
    if calib > 0:
        cpu = sum(r["cpu_ms_per_image"] for r in rows)
        held = sum(r["cpu_ms_per_image"] * r["gil_held_share"] for r in rows) / cpu
        g = min(held / calib, 1.0)  # the probe's undercount, measured by the calibration
        out["process"] = {"cpu_ms_per_image": round(cpu, 2), "gil_held_share": round(g, 3),
                          "amdahl_2_threads": round(1 / (g + (1 - g) / 2), 2),
                          "amdahl_8_threads": round(1 / (g + (1 - g) / 8), 2)}
    return {"stages": out}


def bench_free_threads(threads: int) -> dict[str, object]:
    """What N threads can reach on this machine now: SHA-256 of 8 buffers of 32 MiB, which
    holds the GIL for none of its time. Under load this, not the GIL, bounds the datalane
    rows' scaling."""
    import hashlib

    buf = bytes(range(256)) * (32 << 12)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: hashlib.sha256(buf).digest(), range(8)))
    return {"peer": f"calibration-sha256-{threads}", "images": 8,
            "seconds": round(time.perf_counter() - t0, 3)}


def _wds_transform(sample: tuple[object, str]) -> tuple[object, int]:
    """A plain webdataset pipeline's per-image work, in torch."""
    import torch
    from PIL import Image

    image, _caption = sample
    assert isinstance(image, Image.Image)
    image = image.convert("RGB")
    h, w = target_size(image.height, image.width, RULE.resize)
    if (h, w) != (image.height, image.width):
        image = image.resize((w, h), Image.Resampling.BICUBIC)
    t = torch.from_numpy(np.array(image)).to(torch.float32).mul_(1.0 / 255)
    t = t.sub_(0.5).div_(0.5)  # (H, W, C)
    ps, ms = RULE.patches.patch_size, RULE.patches.merge_size
    t = t.reshape(h // ps // ms, ms, ps, w // ps // ms, ms, ps, 3).permute(0, 3, 1, 4, 6, 2, 5)
    patches = t.reshape(-1, 3, 1, ps * ps).expand(-1, 3, 2, ps * ps).reshape(-1, 3 * 2 * ps * ps)
    return patches, (h // ps // ms) * (w // ps // ms)


def bench_wds(corpus: ImageCorpus, workers: int) -> dict[str, object]:
    import torch
    import webdataset as wds

    ds = (wds.WebDataset(corpus.shards, shardshuffle=False, empty_check=False)
          .decode("pil").to_tuple("jpg", "txt").map(_wds_transform))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    n = tokens = size = 0
    t0 = time.perf_counter()
    for patches, count in loader:
        n += 1
        tokens += int(count)
        size += patches.numel() * patches.element_size()
    return _row(f"wds-{workers}", time.perf_counter() - t0, n, tokens, size)


def _qwen_tokenizer(folder: str) -> str:
    """datalane's bundled tokenizer with Qwen's five vision special tokens added."""
    write_vision_tokenizer(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "add_eos_token": False}, f)
    return folder


def bench_torchtitan(corpus: ImageCorpus, tok_dir: str) -> dict[str, object]:
    from torchtitan.components.tokenizer import MultiModalTokenizer
    from torchtitan.hf_datasets.multimodal.mm_datasets import MMDataLoader

    tokenizer = MultiModalTokenizer(MultiModalTokenizer.Config(
        image_token=QWEN_TOKENS[0], video_token=QWEN_TOKENS[1],
        vision_start_token=QWEN_TOKENS[2], vision_end_token=QWEN_TOKENS[3],
        pad_token=QWEN_TOKENS[4]), tokenizer_path=tok_dir)
    config = MMDataLoader.Config(
        dataset="cc12m-test", dataset_path=os.path.dirname(corpus.shards[0]), infinite=False,
        max_images_per_batch=128, patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
        min_pixels=RULE.resize.min_pixels, max_pixels=RULE.resize.max_pixels,
        image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), build_mrope_positions=True)
    loader = MMDataLoader(config, dp_world_size=1, dp_rank=0, tokenizer=tokenizer,
                          seq_len=4096, local_batch_size=1)
    n = tokens = size = 0
    t0 = time.perf_counter()
    for inputs, _labels in loader:
        grid = inputs["grid_thw"]
        if grid is None:
            continue
        n += int(grid.shape[0])
        tokens += int((inputs["input"] == tokenizer.image_id).sum())
        pv = inputs["pixel_values"]
        size += pv.numel() * pv.element_size()
    return _row("torchtitan", time.perf_counter() - t0, n, tokens, size)


def bench_worst(noise_level: int = 12) -> list[dict[str, object]]:
    """One decode at the pixel limit in each encoding: the bound docs/vlm.md states."""
    from PIL import Image

    from datalane.engine.images import decode
    from datalane.spec.limits import MAX_IMAGE_BYTES

    gen = np.random.default_rng(1)
    width, height = 8192, 4096  # MAX_IMAGE_PIXELS; noise on a gradient, in row blocks
    pixels = np.empty((height, width, 3), np.uint8)
    ramp = np.linspace(32, 223, width).astype(np.int16)[None, :, None]
    for y in range(0, height, 256):
        noise = gen.integers(-noise_level, noise_level + 1, (256, width, 3), dtype=np.int16)
        pixels[y:y + 256] = np.clip(ramp + noise, 0, 255).astype(np.uint8)
    rows = []
    for name, fmt, kw in (("jpeg", "JPEG", {"quality": 90}),
                          ("jpeg-progressive", "JPEG", {"quality": 90, "progressive": True}),
                          ("webp", "WEBP", {"quality": 80}),
                          ("png", "PNG", {"compress_level": 6})):
        if fmt == "PNG":  # this noise is ~70 MB of PNG: a sixteenth of it fits 32 MiB
            pixels = np.clip(ramp + (pixels.astype(np.int16) - ramp) // 16, 0, 255).astype(
                np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, fmt, **kw)
        data = buf.getvalue()
        t0, c0 = time.perf_counter(), time.thread_time()
        image = decode(data) if len(data) <= MAX_IMAGE_BYTES else None
        seconds, cpu = time.perf_counter() - t0, time.thread_time() - c0
        rows.append({"worst": name, "pixels": width * height,
                     "encoded_mb": round(len(data) / 2**20, 1), "decoded": image is not None,
                     "decode_s": round(seconds, 3), "decode_cpu_s": round(cpu, 3),
                     "load1": round(os.getloadavg()[0], 2)})
        del image
    return rows


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="48 images, one run per peer")
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many runs per peer")
    ap.add_argument("--worst", action="store_true", help="time decodes at the limits too")
    ap.add_argument("--no-torchtitan", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)
    images, repeat = (48, 1) if args.quick else (args.images, args.repeat)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="datalane-images-") as tmp:
        corpus = make_image_corpus(os.path.join(tmp, "corpus"), images=images, jpeg_only=True)
        blobs = _blobs(corpus)
        print(json.dumps({"images": images, "encoded_bytes_per_image":
                          round(corpus.encoded_bytes / images), "cpus": os.cpu_count(),
                          "load_average": [round(x, 2) for x in load0]}))
        peers: list[tuple[str, Callable[[], dict[str, object]]]] = []
        if not args.no_torchtitan:
            try:
                import torchvision  # noqa: F401

                tok = _qwen_tokenizer(tempfile.mkdtemp(dir=tmp))
                peers.append(("torchtitan", lambda: bench_torchtitan(corpus, tok)))
            except ImportError:
                print(json.dumps({"peer": "torchtitan", "skipped": "no torchvision"}))
        for w in (int(x) for x in args.workers.split(",") if x):
            peers.append((f"wds-{w}", lambda w=w: bench_wds(corpus, w)))  # type: ignore[misc]
        for k in (int(x) for x in args.threads.split(",") if x):
            peers.append((f"datalane-{k}", lambda k=k: bench_datalane(blobs, k)))  # type: ignore[misc]
        for k in (int(x) for x in args.threads.split(",") if x):
            peers.append((f"calibration-{k}", lambda k=k: bench_free_threads(k)))  # type: ignore[misc]
        print(json.dumps(bench_stages(blobs)))
        for _, run in peers:
            runs = []
            for _ in range(repeat):
                cpu0 = _cpu()
                row = run()
                row["cpu_ms_per_image"] = round((_cpu() - cpu0) * 1000 / int(row["images"]), 1)  # type: ignore[call-overload]
                runs.append(row)
            best = min(runs, key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
            best["load1"] = round(os.getloadavg()[0], 2)
            print(json.dumps(best))
    if args.worst:
        for row in bench_worst():
            print(json.dumps(row))
    print(json.dumps({"load_average_end": [round(x, 2) for x in os.getloadavg()],
                      "patch_rule": PatchRule().__dict__}))


if __name__ == "__main__":
    main()
