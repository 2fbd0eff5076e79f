"""Image-caption throughput: datalane's lane, TorchTitan's multimodal loader, webdataset + Pillow.

Writes a JPEG image-caption corpus (datalane/testing/images.py: WebDataset tar shards in
CC12M's layout, 16 samples a shard) and has every peer read the same shards and turn each
image into the vision encoder's patches by Qwen3.5's rule (RGB, TorchTitan's ``smart_resize``
pixel budget of 65,536..16,777,216 pixels in multiples of 32, patch 16, merge 2):

* ``torchtitan-N``: TorchTitan 0.3.0's ``MMDataLoader`` (its ``cc12m-test`` reader over the
  local shards through HF ``datasets``, ``process_image``: torchvision decode and resize,
  normalise to float32, ``vision_to_patches`` with the frame repeated; the caption
  tokenized, the packer off, the collator with M-RoPE positions), ``num_workers=N`` (its
  configs set 0);
* ``wds-N``: ``webdataset`` + Pillow decode, RGB, Pillow bicubic resize, torch normalise and
  patchify with the frame repeated, in a ``torch.utils.data.DataLoader`` with N worker
  processes; ``wds-uint8-N`` the same with uint8 patches of one frame (a lane's work, less
  the tokenizer and the packer);
* ``datalane-N``: a real lane: :class:`~datalane.engine.loader.Loader` on a vision recipe over
  the shards with ``Knobs(workers=N)`` map threads (read, decode, RGB, resize, uint8
  patches of one frame, tokenize the caption, bestfit packing into 4 lanes of 4,096-token
  sequences, the per-image columns, the step hash), every step to the end of the data;
  ``datalane+to_vlm-N`` the same, each microbatch of one sequence then turned into
  TorchTitan's batch by :func:`datalane.client.torchvlm.to_vlm` (normalise, repeat the
  frame, pad, M-RoPE) on the consuming thread; ``datalane-asarray-N`` the lane with its
  pixels copied by ``np.asarray`` as before :func:`datalane.engine.images.pipeline.pixels`.

Every peer first runs once on a 4-image corpus (imports, start-up paths: not counted), then
``--rounds`` rounds run every peer once in the same order (A B C A B C: the machine's load
falls on all alike); a peer's row is its median run. Printed: images/s, vision tokens/s
(placeholder tokens: t*h*w/4; every peer must count the same, or the bench stops), CPU ms per
image (this process's and its waited-for children's), the pixel bytes each hands out per
image, the load average at each run; ``--wire``: bytes per image through a real sidecar;
``--stages``: each stage's CPU and the share of it holding the GIL (py-spy, bench/scaling.py's
probe), and the whole lane's with one worker, which bound what N map threads can reach
whatever the load of the machine (docs/benchmarks.md, Image throughput)::

    .venv/bin/python bench/images.py --quick     # tests/bench/test_images_bench.py
    .venv/bin/python bench/images.py --images 128 --rounds 5 --stages --wire --before-workers 1,2

``--worst`` times one decode at the limits (an 8192 x 4096 noise JPEG, progressive JPEG, PNG
and WebP: MAX_IMAGE_PIXELS), the measured bound of docs/vlm.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from datalane.engine.images import ImageRule, PatchRule, normalize, normalize_table
from datalane.engine.images.resize import target_size
from datalane.spec import imagecolumns
from datalane.spec.recipe import load_recipe
from datalane.testing.images import (
    VISION_TOKENS,
    ImageCorpus,
    make_image_corpus,
    write_vision_tokenizer,
)

RULE = ImageRule()
QWEN_TOKENS = list(VISION_TOKENS)
SEQ_LEN = 4096  # TorchTitan's seq_len here; a lane's sequences are SEQ_LEN tokens (+1 label)
LANES = 4


def _row(name: str, seconds: float, images: int, tokens: int, out_bytes: int) -> dict[str, object]:
    return {"peer": name, "images": images, "vision_tokens": tokens, "seconds": round(seconds, 3),
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


def _lane_recipe(corpus: ImageCorpus, lanes: int) -> dict[str, Any]:
    """The corpus's tars as one vision source (Qwen3.5's rule: the ``vision`` defaults),
    ``lanes`` lanes of one sequence of :data:`SEQ_LEN` tokens a step, bestfit, chunks of at
    most 8 samples (every lane gets some), blocks of 16."""
    chunk = max(1, min(8, len(corpus.keys) // lanes))
    return {"lanes": lanes, "global_batch_size": lanes, "seq_len": SEQ_LEN - 1,
            "tokenizer": {"uri": corpus.tokenizer}, "packing": {"algorithm": "bestfit"},
            "shuffle": {"block_size": 16},
            "sources": [{"name": "pairs", "uris": [f"{corpus.root}/*.tar"], "vision": {},
                         "chunk_rows": chunk}]}


def _special_tokens(tokenizer: str) -> dict[str, int]:
    """The five ids ``to_vlm`` takes (TorchTitan's ``MultiModalTokenizer`` names)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    names = dict(zip(("image_id", "video_id", "vision_start_id", "vision_end_id", "pad_id"),
                     QWEN_TOKENS, strict=True))
    return {k: int(tok.token_to_id(v)) for k, v in names.items()}


def bench_lane_before(corpus: ImageCorpus, workers: int) -> dict[str, object]:
    """:func:`bench_lane` with the lane's pixels taken by ``np.asarray`` (a copy through
    Pillow's ``tobytes``, holding the GIL), as before
    :func:`~datalane.engine.images.pipeline.pixels`: the before/after rows, interleaved."""
    from datalane.engine.images import pipeline

    saved = pipeline.pixels
    pipeline.pixels = np.asarray  # type: ignore[assignment]
    try:
        row = bench_lane(corpus, workers)
    finally:
        pipeline.pixels = saved
    row["peer"] = f"datalane-asarray-{workers}"
    return row


def bench_lane(corpus: ImageCorpus, workers: int, *, lanes: int = LANES,
               client: bool = False) -> dict[str, object]:
    """A real lane: :class:`~datalane.engine.loader.Loader` on the vision recipe with
    ``workers`` map threads (read the tars, decode, resize, patchify, tokenize the caption,
    bestfit packing, the per-image columns, the step hash), every step to the end of the
    data. ``client``: each microbatch of one sequence also through
    :func:`~datalane.client.torchvlm.to_vlm` (normalise, repeat the frame, pad to the row's
    longest image, M-RoPE positions) to TorchTitan's batch, on the consuming thread as a
    trainer would."""
    from datalane.engine.loader import Loader
    from datalane.spec.knobs import Knobs

    recipe = load_recipe(_lane_recipe(corpus, lanes))
    to_vlm: Callable[..., Any] | None = None
    if client:
        from datalane.client.torchvlm import to_vlm
    specials = _special_tokens(corpus.tokenizer)
    n = tokens = size = pixels = 0
    t0 = time.perf_counter()
    with Loader(recipe, 0, 1, Knobs(workers=workers)) as loader:
        while True:
            step = loader.next_step()
            grid = step.columns["image_grid_thw"]
            n += len(grid)
            tokens += int(grid.prod(axis=1).sum()) // RULE.patches.merge_size ** 2
            size += sum(v.nbytes for v in step.columns.values())
            pixels += step.columns["image_patches"].nbytes
            if to_vlm is not None:  # microbatches of one sequence (TorchTitan's batch here)
                pixels -= step.columns["image_patches"].nbytes
                for i in range(len(step.columns["positions"])):
                    batch, _labels = to_vlm(step.microbatch(i, 1).columns, specials)
                    if batch["pixel_values"] is not None:
                        pixels += batch["pixel_values"].numel() * 4
            if step.ended:
                break
    name = f"datalane{'+to_vlm' if client else ''}-{workers}"
    row = _row(name, time.perf_counter() - t0, n, tokens, pixels)
    row["step_bytes_per_image"] = round(size / max(n, 1))
    return row


def bench_wire(corpus: ImageCorpus, work: str, workers: int = 2) -> dict[str, object]:
    """Bytes per image on the wire: the vision recipe served by a real ``datalane-sidecar``
    process and read by a :class:`~datalane.client.SidecarLoader` with the ``inline``
    transport (the buffers carry the used rows only), every microbatch to the end of the
    data; and the shared-memory slot the ``shm`` transport reserves, at capacity."""
    import sys

    import yaml

    from bench import serve
    from datalane.client import SidecarLoader

    recipe = Path(work) / "vision.yaml"
    recipe.write_text(yaml.safe_dump(_lane_recipe(corpus, LANES)))
    socket = str(Path(work) / "dl.sock")
    cmd = [sys.executable, "-m", "datalane_sidecar", "serve", "--socket", socket, "--recipe",
           str(recipe), "--workers", str(workers), "--log-level", "warning"]
    n = image_bytes = token_bytes = 0
    with (serve.sidecar_process(cmd, socket, Path(work) / "sidecar.log"),
          SidecarLoader(socket, rank=0, world_size=1, microbatch_size=1,
                        transport="inline") as loader):
        for batch in loader:
            cols = batch.columns
            n += len(cols["image_seq"])
            image_bytes += sum(cols[k].nbytes for k in imagecolumns.NAMES)
            token_bytes += sum(v.nbytes for k, v in cols.items() if k not in imagecolumns.NAMES)
            if batch.ended:
                break
    return {"wire": "sidecar inline", "images": n,
            "image_column_bytes_per_image": round(image_bytes / max(n, 1)),
            "token_column_bytes_per_image": round(token_bytes / max(n, 1))}


_LANE_BEFORE = "lane, 1 worker, pixels by np.asarray (before)"
_STAGE_NAMES = ("decode", "resize", "pixels", "patchify", "normalize")


def _stages(blobs: list[bytes]) -> dict[str, Callable[[], None]]:
    """Each stage of :func:`process` over every image, its inputs prepared beforehand; and
    ``np.asarray`` in place of :func:`~datalane.engine.images.pipeline.pixels` (the copy
    through Pillow's ``tobytes`` that the lane made before)."""
    from datalane.engine.images import decode, patchify, resize
    from datalane.engine.images.pipeline import pixels

    table = normalize_table(RULE.patches)
    images = [decode(b, RULE.limits) for b in blobs]
    resized = [resize(im, RULE.resize) for im in images]
    arrays = [pixels(im) for im in resized]
    patches = [patchify(px, RULE.patches, repeat_frames=False).values for px in arrays]
    return {  # _STAGE_NAMES, then the one replaced
        "decode": lambda: [decode(b, RULE.limits) for b in blobs] and None,
        "resize": lambda: [resize(im, RULE.resize) for im in images] and None,
        "pixels": lambda: [pixels(im) for im in resized] and None,
        "patchify": lambda: [patchify(px, RULE.patches, repeat_frames=False)
                             for px in arrays] and None,
        "normalize": lambda: [normalize(v, RULE.patches, table) for v in patches] and None,
        "pixels by np.asarray (before)": lambda: [np.asarray(im) for im in resized] and None,
    }


def _gil_held(run: Callable[[], object], seconds: int, tmp: Path) -> float:
    """The share of this process's CPU time spent holding the GIL while ``run`` runs over and
    over on a thread of its own for ``seconds`` (bench/scaling.py's py-spy probe: samples of
    the thread holding the GIL, weighted by its on-CPU share, so the machine's load does not
    inflate it), not yet corrected by the calibration."""
    import threading

    from bench.scaling import GilProbe

    stop, started = threading.Event(), threading.Event()

    def loop() -> None:
        while not stop.is_set():
            run()
            started.set()

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    started.wait()  # one run done: the window sees the loop under way
    probe = GilProbe(os.getpid(), seconds, 200, tmp)
    c0 = time.process_time()
    while probe.running():
        time.sleep(0.01)
    cpu = time.process_time() - c0
    stop.set()
    held = probe.result()["gil_share"] * seconds
    worker.join()
    return min(held / cpu, 1.0)


def _steady_lane(corpus: ImageCorpus, workers: int) -> tuple[Callable[[], int], Any]:
    """A lane in steady state: the vision recipe over the corpus repeated forever
    (``epochs: null``), started; and a call that runs its next 4 steps, giving the images
    they hold (the consuming thread's work, packing, columns and the step hash, included;
    the loader's start-up, which a run over a small corpus repeats, left out)."""
    from datalane.engine.loader import Loader
    from datalane.spec.knobs import Knobs

    doc = _lane_recipe(corpus, LANES)
    doc["sources"][0]["epochs"] = None
    loader = Loader(load_recipe(doc), 0, 1, Knobs(workers=workers))

    def steps() -> int:
        return sum(len(loader.next_step().columns["image_seq"]) for _ in range(4))

    return steps, loader


def bench_stages(corpus: ImageCorpus, seconds: int = 4) -> dict[str, object]:
    """Per stage of :func:`process`, and for a lane in steady state with one map worker
    (:func:`_steady_lane`): CPU ms per image (the process's, all threads), and the share of
    that CPU time spent holding the GIL. A part holding the GIL a share g lets N threads run
    at most 1 / (g + (1 - g) / N) times one. A pure-Python loop is measured too, as the
    probe's calibration (about 1)."""
    from bench.scaling import pyspy_binary

    blobs = _blobs(corpus)
    stages: dict[str, Callable[[], int]] = {
        name: (lambda run=run: run() or len(blobs))  # type: ignore[misc]
        for name, run in _stages(blobs).items()}
    lane, loader = _steady_lane(corpus, 1)
    stages["lane, 1 worker"] = lane
    stages[_LANE_BEFORE] = lane  # with np.asarray for pixels, below
    stages["calibration: python loop"] = lambda: sum(i * i for i in range(200_000)) and 1
    out: dict[str, dict[str, float]] = {}
    from datalane.engine.images import pipeline

    pixels = pipeline.pixels
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, run in stages.items():
                if name == _LANE_BEFORE:
                    pipeline.pixels = np.asarray  # type: ignore[assignment]
                run()  # warm (a lane: the tasks in flight are the patched ones after it)
                c0 = time.process_time()
                count = run()
                row = {"cpu_ms_per_image": round((time.process_time() - c0) * 1000 / count, 2)}
                if pyspy_binary() is not None:
                    row["gil_held_share"] = round(_gil_held(run, seconds, Path(tmp)), 3)
                pipeline.pixels = pixels
                out[name] = row
    finally:
        pipeline.pixels = pixels
        loader.close()
    calib = out["calibration: python loop"].get("gil_held_share", 0.0)
    if calib > 0:
        for name in ("process", "lane, 1 worker", _LANE_BEFORE):
            if name == "process":
                rows = [r for n, r in out.items() if n in _STAGE_NAMES]
                cpu = sum(r["cpu_ms_per_image"] for r in rows)
                held = sum(r["cpu_ms_per_image"] * r["gil_held_share"] for r in rows) / cpu
                out[name] = {"cpu_ms_per_image": round(cpu, 2)}
            else:
                held = out[name]["gil_held_share"]
            g = min(held / calib, 1.0)  # the probe's undercount, measured by the calibration
            out[name].update({"gil_held_corrected": round(g, 3),
                              "amdahl_2_threads": round(1 / (g + (1 - g) / 2), 2),
                              "amdahl_8_threads": round(1 / (g + (1 - g) / 8), 2)})
    return {"stages": out}


def bench_free_threads(threads: int) -> dict[str, object]:
    """What N threads can reach on this machine now: SHA-256 of 16 buffers of 32 MiB, which
    holds the GIL for none of its time. Under load this, not the GIL, bounds the datalane
    rows' scaling."""
    import hashlib

    buf = bytes(range(256)) * (32 << 12)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: hashlib.sha256(buf).digest(), range(16)))
    return {"peer": f"calibration-sha256-{threads}", "images": 16,
            "seconds": round(time.perf_counter() - t0, 3)}


def _wds_transform(sample: tuple[object, str], uint8: bool = False) -> tuple[object, int]:
    """A plain webdataset pipeline's per-image work: Pillow's RGB conversion and bicubic
    resize to the rule's size, then in torch normalise to float32 and patchify with the frame
    repeated (TorchTitan's ``vision_to_patches`` layout) or, ``uint8``, patchify the bytes of
    one frame only (what a datalane lane does)."""
    import torch
    from PIL import Image

    image, _caption = sample
    assert isinstance(image, Image.Image)
    image = image.convert("RGB")
    h, w = target_size(image.height, image.width, RULE.resize)
    if (h, w) != (image.height, image.width):
        image = image.resize((w, h), Image.Resampling.BICUBIC)
    t = torch.from_numpy(np.array(image))  # (H, W, C) uint8
    if not uint8:
        t = t.to(torch.float32).mul_(1.0 / 255).sub_(0.5).div_(0.5)
    ps, ms = RULE.patches.patch_size, RULE.patches.merge_size
    t = t.reshape(h // ps // ms, ms, ps, w // ps // ms, ms, ps, 3).permute(0, 3, 1, 4, 6, 2, 5)
    frames = 1 if uint8 else RULE.patches.temporal_patch_size
    patches = t.reshape(-1, 3, 1, ps * ps).expand(-1, 3, frames, ps * ps).reshape(
        -1, 3 * frames * ps * ps)
    return patches, (h // ps // ms) * (w // ps // ms)


def bench_wds(corpus: ImageCorpus, workers: int, uint8: bool = False) -> dict[str, object]:
    """``webdataset`` over the shards (its ``pil`` decoder: Pillow), :func:`_wds_transform`,
    in a ``torch.utils.data.DataLoader`` with ``workers`` processes (webdataset splits the
    shards between them)."""
    import functools

    import torch
    import webdataset as wds

    ds = (wds.WebDataset(corpus.shards, shardshuffle=False, empty_check=False)
          .decode("pil").to_tuple("jpg", "txt")
          .map(functools.partial(_wds_transform, uint8=uint8)))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    n = tokens = size = 0
    t0 = time.perf_counter()
    for patches, count in loader:
        n += 1
        tokens += int(count)
        size += patches.numel() * patches.element_size()
    name = f"wds{'-uint8' if uint8 else ''}-{workers}"
    return _row(name, time.perf_counter() - t0, n, tokens, size)


def _qwen_tokenizer(folder: str) -> str:
    """datalane's bundled tokenizer with Qwen's five vision special tokens added."""
    write_vision_tokenizer(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "add_eos_token": False}, f)
    return folder


def bench_torchtitan(corpus: ImageCorpus, tok_dir: str, workers: int = 0) -> dict[str, object]:
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
        image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), build_mrope_positions=True,
        num_workers=workers)
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
    return _row(f"torchtitan-{workers}", time.perf_counter() - t0, n, tokens, size)


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


def _peers(args: argparse.Namespace, corpus: ImageCorpus,
           tok_dir: str | None) -> list[tuple[str, Callable[[], dict[str, object]]]]:
    """(name, one run over ``corpus``) of every peer asked for."""
    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    peers: list[tuple[str, Callable[[], dict[str, object]]]] = []
    if tok_dir is not None:
        peers += [(f"torchtitan-{w}", lambda w=w: bench_torchtitan(corpus, tok_dir, w))
                  for w in ints(args.titan_workers)]
    peers += [(f"wds-{w}", lambda w=w: bench_wds(corpus, w)) for w in ints(args.wds_workers)]
    peers += [(f"wds-uint8-{w}", lambda w=w: bench_wds(corpus, w, uint8=True))
              for w in ints(args.wds_uint8_workers)]
    peers += [(f"datalane-{k}", lambda k=k: bench_lane(corpus, k)) for k in ints(args.workers)]
    peers += [(f"datalane-asarray-{k}", lambda k=k: bench_lane_before(corpus, k))
              for k in ints(args.before_workers)]
    peers += [(f"datalane+to_vlm-{k}", lambda k=k: bench_lane(corpus, k, client=True))
              for k in ints(args.client_workers)]
    peers += [(f"calibration-sha256-{k}", lambda k=k: bench_free_threads(k))
              for k in ints(args.workers)]
    return peers  # type: ignore[return-value]


def _timed(run: Callable[[], dict[str, object]]) -> dict[str, object]:
    cpu0 = _cpu()
    row = run()
    row["cpu_ms_per_image"] = round((_cpu() - cpu0) * 1000 / int(row["images"]), 1)  # type: ignore[call-overload]
    row["load1"] = round(os.getloadavg()[0], 2)
    return row


def _median(runs: list[dict[str, object]]) -> dict[str, object]:
    """The run of median seconds (the lower middle of an even count), with every run's
    seconds and load average beside it."""
    ordered = sorted(runs, key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["runs_seconds"] = [r["seconds"] for r in runs]
    row["runs_load1"] = [r["load1"] for r in runs]
    row["cpu_ms_per_image"] = statistics.median(float(r["cpu_ms_per_image"]) for r in runs)  # type: ignore[arg-type]
    return row


def run_rounds(peers: list[tuple[str, Callable[[], dict[str, object]]]],
               warm: list[tuple[str, Callable[[], dict[str, object]]]],
               rounds: int) -> list[dict[str, object]]:
    """Each peer once on the warm-up corpus (imports, tokenizer, worker start-up paths), not
    counted; then ``rounds`` rounds in which every peer runs once, in the same order (A B C
    A B C: the machine's load falls on all alike); each peer's median run."""
    for name, run in warm:
        t0 = time.perf_counter()
        run()
        print(json.dumps({"warm_up": name, "seconds": round(time.perf_counter() - t0, 2)}))
    runs: dict[str, list[dict[str, object]]] = {name: [] for name, _ in peers}
    for r in range(rounds):
        for name, run in peers:
            row = _timed(run)
            row["round"] = r
            runs[name].append(row)
            print(json.dumps(row), flush=True)
    return [_median(rs) for rs in runs.values() if rs]


def same_work(rows: list[dict[str, object]]) -> None:
    """Every peer turned the same images into the same number of vision tokens (the same
    resize rule, nothing dropped), or the rates do not compare: SystemExit naming them."""
    work = {str(r["peer"]): (r["images"], r["vision_tokens"]) for r in rows
            if "vision_tokens" in r}
    if len(set(work.values())) > 1:
        raise SystemExit(f"the peers did not process the same images to the same vision "
                         f"tokens (images, tokens): {work}")


def markdown(rows: list[dict[str, object]]) -> str:
    """The throughput table of docs/benchmarks.md."""
    out = ["| peer | images/s | vision tokens/s | CPU ms / image | pixel bytes / image out "
           "| runs (s) | load1 |", "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if "images_per_s" not in r or str(r["peer"]).startswith("calibration"):
            continue
        runs = " / ".join(f"{s:.1f}" for s in r["runs_seconds"])  # type: ignore[attr-defined]
        load = "-".join(f"{x:.0f}" for x in (min(r["runs_load1"]), max(r["runs_load1"])))  # type: ignore[call-overload]
        out.append(f"| {r['peer']} | {r['images_per_s']} | {r['vision_tokens_per_s']:,} | "
                   f"{r['cpu_ms_per_image']} | {r['out_bytes_per_image']:,} | {runs} | {load} |")
    return "\n".join(out)


def main(argv: Iterable[str] | None = None) -> list[dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    ap.add_argument("--quick", action="store_true",
                    help="16 images, one round, datalane 1 and 2 workers only (tests/bench)")
    ap.add_argument("--titan-workers", default="0,2", help="TorchTitan MMDataLoader num_workers")
    ap.add_argument("--wds-workers", default="0,2", help="webdataset DataLoader num_workers")
    ap.add_argument("--wds-uint8-workers", default="2",
                    help="webdataset DataLoader num_workers, uint8 patches of one frame")
    ap.add_argument("--workers", default="1,2", help="datalane map workers (Knobs.workers)")
    ap.add_argument("--before-workers", default="",
                    help="datalane map workers, pixels by np.asarray (before/after)")
    ap.add_argument("--client-workers", default="2",
                    help="datalane map workers, each step also through to_vlm")
    ap.add_argument("--stages", action="store_true", help="each stage's GIL share (py-spy)")
    ap.add_argument("--stage-seconds", type=int, default=4, help="py-spy window per stage")
    ap.add_argument("--wire", action="store_true", help="bytes per image through a sidecar")
    ap.add_argument("--worst", action="store_true", help="time decodes at the limits too")
    ap.add_argument("--no-torchtitan", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.quick:
        args.images, args.rounds, args.no_torchtitan = 16, 1, True
        args.wds_workers, args.wds_uint8_workers, args.client_workers = "", "", "1"
    load0 = os.getloadavg()
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="datalane-images-") as tmp:
        corpus = make_image_corpus(os.path.join(tmp, "corpus"), images=args.images,
                                   jpeg_only=True)
        warm_corpus = make_image_corpus(os.path.join(tmp, "warm"), images=4, seed=3,
                                        jpeg_only=True)
        print(json.dumps({"images": args.images, "encoded_bytes_per_image":
                          round(corpus.encoded_bytes / args.images), "cpus": os.cpu_count(),
                          "load_average": [round(x, 2) for x in load0]}))
        tok: str | None = None
        if not args.no_torchtitan:
            try:
                import torchvision  # noqa: F401
                tok = _qwen_tokenizer(tempfile.mkdtemp(dir=tmp))
            except ImportError:
                print(json.dumps({"peer": "torchtitan", "skipped": "no torchvision"}))
        if args.stages:
            print(json.dumps(bench_stages(corpus, args.stage_seconds)))
        peers = _peers(args, corpus, tok)
        warm = _peers(args, warm_corpus, tok) if args.rounds else []
        results = run_rounds(peers, warm, args.rounds)
        for row in results:
            print(json.dumps(row))
        same_work(results)
        if args.wire:
            wire = bench_wire(corpus, tempfile.mkdtemp(dir=tmp))
            print(json.dumps(wire))
            results.append(wire)
    if args.worst:
        for row in bench_worst():
            print(json.dumps(row))
    print(json.dumps({"load_average_end": [round(x, 2) for x in os.getloadavg()],
                      "patch_rule": PatchRule().__dict__}))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
