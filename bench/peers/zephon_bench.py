#!/usr/bin/env python3
"""Peer: Zephon 0.2.0 on the issue-2 benchmark recipe.

Role: the "2x Zephon" comparison of issue 2, section 11. Self-contained (no datalane import);
run it with the interpreter of the separate peers virtualenv, where zephon, transformers,
pyarrow and tokenizers are installed (see bench/peers/README.md).

Recipe, expressed in Zephon's API:
  web source only (`Dataset.from_path("web", CORPUS/web)`, Parquet, column `text`)
  StaticMixtureWorkSource(chunk_size=64, shuffle_block_size=1024, seed=0)  # document block shuffle
  .decode_text()
  .tokenize(tokenizer_id=CORPUS/tokenizer, field="text", special_tokens="eos",
            add_attention_mask=False, parallelism=2)     # text + EOS per document
  .pack_flat(2049, algorithm="wrap")                      # concatenate and cut, positions kept
  .batch(4)                                               # microbatch 4
  .options(canonical_replicas=2, max_workers=2 | 4)       # 2 lanes, one rank serves both

Measurements, one JSON line each on stdout (logs go to stderr):
  throughput   per configuration (`--max-workers 2,4`): tokens delivered as (4, 2049) int32
               numpy arrays, wall time from `iter(pipeline)` to exhaustion (includes engine start,
               tokenizer load and Parquet reads; the Pipeline object is built before the clock).
  token_loss   delivered tokens vs. the corpus's total under the same tokenization, with the
               loss split into the trailing partial chunk the work source never emits and the
               partial `wrap` bins dropped at Zephon's periodic flushes; also checks that every
               delivered token is the right token of the right document.
  checkpoint   size of `pipeline.checkpoint()` (pickle, JSON, msgpack+zstd) at an early, a
               middle and a late microbatch, total and per lane.
  restore      seconds from `restore(state)` to the first microbatch, at the same positions, and
               whether that microbatch equals the one the uninterrupted run delivered there.

Usage:
  zephon_bench.py --corpus DIR [--docs N] [--max-workers 2,4] [--repeats 1]
                  [--only throughput,loss,restore] [--chunk-size 64] [--flush-every-k-chunks K]
"""

from __future__ import annotations

import argparse
import atexit
import glob
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore", message=".*PyTorch was not found.*")

import zephon  # noqa: E402
from zephon import Pipeline  # noqa: E402
from zephon.io import Dataset  # noqa: E402
from zephon.work import MixtureSpec, StaticMixtureWorkSource  # noqa: E402

SEQ_LEN = 2048
MICROBATCH = 4
LANES = 2
BLOCK = 1024
SEED = 0


@dataclass(frozen=True)
class Config:
    """One Zephon configuration: the recipe plus the speed knobs being compared."""

    web_dir: str
    tokenizer_dir: str
    chunk_size: int
    tokenize_parallelism: int
    max_workers: int
    flush_every_k_chunks: int | None
    exhausted_policy: str | None
    drop_last: bool = True

    @property
    def name(self) -> str:
        return f"zephon_tokenize_p{self.tokenize_parallelism}_max_workers_{self.max_workers}"


def build(cfg: Config) -> Pipeline:
    ds = Dataset.from_path("web", cfg.web_dir)
    kwargs: dict[str, Any] = {}
    if cfg.exhausted_policy is not None:
        kwargs["exhausted_policy"] = cfg.exhausted_policy
    ws = StaticMixtureWorkSource(
        datasets=[ds],
        mixture=MixtureSpec({"web": 1.0}),
        chunk_size=cfg.chunk_size,
        seed=SEED,
        shuffle_block_size=BLOCK,
        **kwargs,
    )
    pipe = (
        Pipeline(ws)
        .decode_text()
        .tokenize(
            tokenizer_id=cfg.tokenizer_dir,
            field="text",
            special_tokens="eos",
            add_attention_mask=False,
            parallelism=cfg.tokenize_parallelism,
        )
        .pack_flat(SEQ_LEN + 1, algorithm="wrap", emit_positions=True)
        .batch(MICROBATCH, drop_last=cfg.drop_last)
    )
    opts: dict[str, Any] = {"canonical_replicas": LANES, "max_workers": cfg.max_workers}
    if cfg.flush_every_k_chunks is not None:
        opts["flush_every_k_chunks"] = cfg.flush_every_k_chunks
    pipe.options(**opts)
    return pipe


def to_arrays(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """What a trainer consumes: (microbatch, seq_len + 1) int32 tokens and positions."""
    ids = np.asarray([r.payload["input_ids"] for r in batch.records], dtype=np.int32)
    pos = np.stack([np.asarray(r.payload["positions"], dtype=np.int32) for r in batch.records])
    return ids, pos


class FlushDrops(logging.Handler):
    """Collects Zephon's own "PackSequences wrap: dropping N trailing token(s)" warnings."""

    PATTERN = re.compile(r"dropping (\d+) trailing token")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[int] = []  # warnings: a flush dropped a partial bin
        self.shutdown: list[int] = []  # debug: Zephon's early-close drain (not counted as loss)

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PATTERN.search(record.getMessage())
        if m:
            (self.events if record.levelno >= logging.WARNING else self.shutdown).append(
                int(m.group(1))
            )


def capture_flush_drops() -> FlushDrops:
    handler = FlushDrops()
    log = logging.getLogger("zephon._internal.ops.pack_sequences")
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return handler


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


# --------------------------------------------------------------------------- corpus


def prepare_corpus(corpus: str, docs: int | None) -> str:
    """The web directory to read: the corpus's own, or the first `docs` rows copied."""
    web = os.path.join(corpus, "web")
    if docs is None:
        return web
    out = tempfile.mkdtemp(prefix="zephon-web-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    left = docs
    for i, path in enumerate(sorted(glob.glob(os.path.join(web, "*.parquet")))):
        if left <= 0:
            break
        table = pq.read_table(path).slice(0, left)
        pq.write_table(table, os.path.join(out, f"shard-{i:05d}.parquet"), row_group_size=500)
        left -= table.num_rows
    return out


def reference_tokens(cfg: Config) -> dict[tuple[int, int], np.ndarray]:
    """Every document's expected tokens (text + EOS), keyed by Zephon's (shard, row) id."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(cfg.tokenizer_dir, "tokenizer.json"))
    eos = tok.token_to_id("<|eos|>")
    ds = Dataset.from_path("web", cfg.web_dir)
    files = sorted(glob.glob(os.path.join(cfg.web_dir, "*.parquet")))
    shard_ids = [int(s) for s in ds.ids()]
    counts = [int(c) for c in ds.counts()]
    if shard_ids != list(range(len(files))):
        raise SystemExit(f"unexpected Zephon shard ids {shard_ids} for {len(files)} files")
    out: dict[tuple[int, int], np.ndarray] = {}
    for shard, path in enumerate(files):
        texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
        if len(texts) != counts[shard]:
            raise SystemExit(f"{path}: {len(texts)} rows, Zephon counted {counts[shard]}")
        for start in range(0, len(texts), 256):
            encs = tok.encode_batch_fast(texts[start : start + 256], add_special_tokens=False)
            for j, enc in enumerate(encs):
                out[(shard, start + j)] = np.asarray([*enc.ids, eos], dtype=np.int32)
    return out


def emitted_by_work_source(cfg: Config) -> set[tuple[int, int]]:
    """Documents the work source hands out at all (the global chunk stream, lanes merged)."""
    ws = build(cfg).ws
    lane_view = ws.clone_for_lane(0, 1)  # one lane owns every chunk: the whole global stream
    seen: set[tuple[int, int]] = set()
    while (chunk := lane_view.next_chunk()) is not None:
        for ids in chunk.components.values():
            seen.update((int(s[1]), int(s[2])) for s in ids)
    return seen


# --------------------------------------------------------------------------- measurements


def measure_throughput(cfg: Config, repeat: int) -> dict[str, Any]:
    drops = capture_flush_drops()
    pipe = build(cfg)
    tokens = 0
    microbatches = 0
    digest = hashlib.sha256()
    t0 = time.perf_counter()
    first = None
    for batch in pipe:
        ids, _pos = to_arrays(batch)
        if first is None:
            first = time.perf_counter() - t0
        tokens += ids.size
        microbatches += 1
        digest.update(ids.tobytes())  # same stream for every knob? compare across lines
    seconds = time.perf_counter() - t0
    steady = seconds - (first or 0.0)
    steady_tokens = tokens - MICROBATCH * (SEQ_LEN + 1)
    return {
        "name": cfg.name,
        "measure": "throughput",
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds, 1),
        "first_batch_s": round(first or 0.0, 4),
        "tokens_per_s_after_first_batch": round(steady_tokens / steady, 1) if steady > 0 else None,
        "microbatches": microbatches,
        "flush_tail_drops": len(drops.events),
        "stream_sha256": digest.hexdigest(),
        "repeat": repeat,
        "config": config_fields(cfg),
    }


def measure_loss(cfg: Config) -> dict[str, Any]:
    ref = reference_tokens(cfg)
    total_tokens = int(sum(len(v) for v in ref.values()))
    emitted = emitted_by_work_source(cfg)
    drops = capture_flush_drops()
    delivered_per_doc: dict[tuple[int, int], list[np.ndarray]] = {}
    delivered = 0
    bad: list[str] = []
    microbatches = 0
    for batch in build(cfg):
        microbatches += 1
        for rec in batch.records:
            ids = np.asarray(rec.payload["input_ids"], dtype=np.int32)
            pos = np.asarray(rec.payload["positions"], dtype=np.int32)
            delivered += ids.size
            starts = np.flatnonzero(pos == 0).tolist()
            if not starts or starts[0] != 0:
                bad.append(f"sequence without a segment at 0: {rec.meta.sample_id}")
                continue
            bounds = [*starts, ids.size]
            contributors = rec.meta.tags["_contributors"]
            if len(contributors) != len(starts):
                bad.append(f"{len(contributors)} contributors for {len(starts)} segments")
                continue
            for c, a, b in zip(contributors, bounds[:-1], bounds[1:], strict=True):
                sid = c.cursor.sample_id
                delivered_per_doc.setdefault((int(sid[1]), int(sid[2])), []).append(ids[a:b])
    partial_docs = 0
    mismatched = 0
    for key, pieces in delivered_per_doc.items():
        got = np.concatenate(pieces)
        want = ref[key]
        if len(got) > len(want) or not np.array_equal(got, want[: len(got)]):
            mismatched += 1
        elif len(got) < len(want):
            partial_docs += 1
    never_emitted = set(ref) - emitted
    never_delivered = set(ref) - set(delivered_per_doc)
    not_emitted_tokens = int(sum(len(ref[k]) for k in never_emitted))
    lost = total_tokens - delivered
    flush_tokens = int(sum(drops.events))
    return {
        "name": "zephon",
        "measure": "token_loss",
        "total_tokens": total_tokens,
        "delivered_tokens": delivered,
        "lost_tokens": lost,
        "lost_fraction": round(lost / total_tokens, 6),
        "docs_total": len(ref),
        "docs_never_emitted_by_work_source": len(never_emitted),
        "tokens_never_emitted": not_emitted_tokens,
        "flush_tail_drops": len(drops.events),
        "flush_tail_tokens": flush_tokens,
        # The rest: whole packed sequences that batch(drop_last=True) discards when a flush
        # (or the end of the stream) leaves a lane with fewer than `microbatch` of them.
        "partial_microbatch_tokens": lost - not_emitted_tokens - flush_tokens,
        "partial_microbatch_sequences": (lost - not_emitted_tokens - flush_tokens) / (SEQ_LEN + 1),
        "shutdown_drain_events": len(drops.shutdown),
        "docs_never_delivered": len(never_delivered),
        "docs_fully_lost_in_flush_tails": len(never_delivered - never_emitted),
        "docs_cut_at_flush": partial_docs,
        "docs_with_wrong_tokens": mismatched,
        "structure_errors": bad[:5],
        "microbatches": microbatches,
        "config": config_fields(cfg),
    }


def checkpoint_sizes(state: dict[str, Any]) -> dict[str, Any]:
    from zephon._internal.checkpoint import AggregationCodec

    pickled = len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    as_json = len(json.dumps(state).encode())
    msgpack_zstd = len(AggregationCodec("msgpack", "zstd").encode(state))
    per_lane_parts = {}
    for lane in range(LANES):
        part = {
            k: (v.get(lane, v.get(str(lane))) if isinstance(v, dict) else None)
            for k, v in state.items()
            if k in ("inflight", "lane_ws_state")
        }
        per_lane_parts[str(lane)] = len(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
    inflight = state.get("inflight", {})
    return {
        "bytes_pickle": pickled,
        "bytes_json": as_json,
        "bytes_msgpack_zstd": msgpack_zstd,
        "bytes_per_lane_pickle": pickled // LANES,
        "bytes_per_lane_json": as_json // LANES,
        "bytes_per_lane_msgpack_zstd": msgpack_zstd // LANES,
        "lane_owned_bytes_pickle": per_lane_parts,
        "inflight_chunks_per_lane": {str(k): len(v) for k, v in inflight.items()},
        "top_level_keys": sorted(state),
    }


def batch_digest(batch: Any) -> str:
    ids, pos = to_arrays(batch)
    return hashlib.sha256(ids.tobytes() + pos.tobytes()).hexdigest()


class TokenizeCounter:
    """Counts documents Zephon tokenizes (wraps TokenizeText._tokenize_texts; measurement only)."""

    def __init__(self) -> None:
        from zephon._internal.ops.tokenize_text import TokenizeText

        self.docs: list[int] = []
        original = TokenizeText._tokenize_texts
        counter = self

        def counted(op: Any, texts: list[str]) -> Any:
            counter.docs.append(len(texts))
            return original(op, texts)

        setattr(TokenizeText, "_tokenize_texts", counted)  # noqa: B010  (instrumentation)

    def reset(self) -> None:
        self.docs.clear()

    @property
    def total(self) -> int:
        return sum(self.docs)


def measure_restore(cfg: Config, steps: list[int], repeats: int) -> None:
    """Emits cold_start, then checkpoint and restore lines per global step.

    A global step is one microbatch from each lane (this rank serves both lanes, and Zephon
    yields them alternately, lane 0 then lane 1), so step s is after 2*s microbatches: a
    window boundary, where Zephon's checkpoint is topology-independent.
    """
    capture_flush_drops()
    counter = TokenizeCounter()
    fields = config_fields(cfg)
    # Cold start for reference: a fresh pipeline's time to its first microbatch.
    cold_times = []
    for _ in range(repeats):
        cold = build(cfg)
        counter.reset()
        t0 = time.perf_counter()
        it: Any = iter(cold)
        next(it)
        cold_times.append(time.perf_counter() - t0)
        it.close()
    emit(
        {
            "name": cfg.name,
            "measure": "cold_start",
            "seconds": round(median(cold_times), 4),
            "all_seconds": [round(t, 4) for t in cold_times],
            "config": fields,
        }
    )

    # One uninterrupted run: a checkpoint after k microbatches, and the (k+1)-th microbatch.
    wanted = {s * LANES: s for s in steps}
    states: dict[int, tuple[dict[str, Any], str]] = {}
    pipe = build(cfg)
    it = iter(pipe)
    pending: tuple[int, dict[str, Any]] | None = None
    for consumed, batch in enumerate(it, start=1):
        if pending is not None:
            states[pending[0]] = (pending[1], batch_digest(batch))
            pending = None
        if consumed in wanted:
            pending = (consumed, pipe.checkpoint())
        elif consumed > max(wanted):
            break
    it.close()

    summary = []
    for k, step in sorted(wanted.items()):
        if k not in states:
            emit(
                {
                    "name": cfg.name,
                    "measure": "restore",
                    "step": step,
                    "error": "stream ended before this position",
                }
            )
            continue
        state, expected = states[k]
        sizes = checkpoint_sizes(state)
        emit({"name": cfg.name, "measure": "checkpoint", "step": step, "microbatches": k, **sizes})
        times, docs, matches = [], [], []
        for r in range(repeats):
            restored = build(cfg)  # object construction is not timed: a trainer builds it first
            counter.reset()
            t0 = time.perf_counter()
            restored.restore(state)
            rit: Any = iter(restored)
            first = next(rit)
            seconds = time.perf_counter() - t0
            tokenized = counter.total
            ok = batch_digest(first) == expected
            rit.close()
            times.append(seconds)
            docs.append(tokenized)
            matches.append(ok)
            emit(
                {
                    "name": cfg.name,
                    "measure": "restore",
                    "step": step,
                    "microbatches": k,
                    "repeat": r,
                    "seconds": round(seconds, 4),
                    "docs_tokenized_before_first_batch": tokenized,
                    "first_batch_matches_uninterrupted": ok,
                    "config": fields,
                }
            )
        summary.append(
            {
                "step": step,
                "microbatches": k,
                "seconds_median": round(median(times), 4),
                "seconds_all": [round(t, 4) for t in times],
                "docs_tokenized_median": median(docs),
                "all_match": all(matches),
                "bytes_per_lane_pickle": sizes["bytes_per_lane_pickle"],
                "bytes_per_lane_json": sizes["bytes_per_lane_json"],
                "bytes_per_lane_msgpack_zstd": sizes["bytes_per_lane_msgpack_zstd"],
            }
        )
    emit(
        {
            "name": cfg.name,
            "measure": "restore_summary",
            "cold_start_s": round(median(cold_times), 4),
            "positions": summary,
            "config": fields,
        }
    )


def median(xs: list[float] | list[int]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def config_fields(cfg: Config) -> dict[str, Any]:
    return {
        "chunk_size": cfg.chunk_size,
        "tokenize_parallelism": cfg.tokenize_parallelism,
        "max_workers": cfg.max_workers,
        "flush_every_k_chunks": cfg.flush_every_k_chunks or "default(8)",
        "exhausted_policy": cfg.exhausted_policy or "default(stop_after_passes=1)",
        "batch_drop_last": cfg.drop_last,
        "lanes": LANES,
        "microbatch": MICROBATCH,
        "seq_width": SEQ_LEN + 1,
        "shuffle_block_size": BLOCK,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, help="directory written by make_corpus.py")
    ap.add_argument("--docs", type=int, default=None, help="use only the first N web documents")
    ap.add_argument("--max-workers", default="2,4", help="comma list of RuntimeOptions.max_workers")
    ap.add_argument("--tokenize-parallelism", type=int, default=2)
    ap.add_argument(
        "--chunk-size",
        type=int,
        default=64,
        help="StaticMixtureWorkSource chunk_size (documents per chunk dealt to a lane)",
    )
    ap.add_argument(
        "--flush-every-k-chunks",
        type=int,
        default=None,
        help="RuntimeOptions.flush_every_k_chunks (Zephon default 8)",
    )
    ap.add_argument(
        "--exhausted-policy",
        default=None,
        choices=["stop", "redistribute"],
        help="StaticMixtureWorkSource exhausted_policy (default: stop_after_passes=1)",
    )
    ap.add_argument(
        "--keep-partial-microbatches",
        action="store_true",
        help="batch(drop_last=False): keep short microbatches at flushes/end",
    )
    ap.add_argument("--repeats", type=int, default=1, help="throughput passes per configuration")
    ap.add_argument("--restore-repeats", type=int, default=3)
    ap.add_argument(
        "--steps",
        default=None,
        help="comma list of global steps (one microbatch per lane) for checkpoint/"
        "restore (default: 5%%, 50%%, 90%% of the stream)",
    )
    ap.add_argument(
        "--only", default="throughput,loss,restore", help="comma list of: throughput, loss, restore"
    )
    args = ap.parse_args()

    only = {s.strip() for s in args.only.split(",") if s.strip()}
    web = prepare_corpus(args.corpus, args.docs)
    tokenizer_dir = os.path.join(args.corpus, "tokenizer")
    workers = [int(w) for w in args.max_workers.split(",") if w.strip()]
    configs = [
        Config(
            web,
            tokenizer_dir,
            args.chunk_size,
            args.tokenize_parallelism,
            w,
            args.flush_every_k_chunks,
            args.exhausted_policy,
            not args.keep_partial_microbatches,
        )
        for w in workers
    ]
    emit(
        {
            "name": "zephon",
            "measure": "environment",
            "zephon": zephon.__version__,
            "pyarrow": pa.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "web_dir": web,
        }
    )

    results = []
    if "throughput" in only:
        for r in range(args.repeats):
            for cfg in configs:  # interleaved, so drift of a busy machine hits each alike
                res = measure_throughput(cfg, r)
                results.append(res)
                emit(res)
        best = max(results, key=lambda x: x["tokens_per_s"])
        emit(
            {
                "name": "zephon_best",
                "measure": "throughput_best",
                "of": best["name"],
                "tokens": best["tokens"],
                "seconds": best["seconds"],
                "tokens_per_s": best["tokens_per_s"],
            }
        )
    best_cfg = configs[0]
    if results:
        best_name = max(results, key=lambda x: x["tokens_per_s"])["name"]
        best_cfg = next(c for c in configs if c.name == best_name)

    microbatches = None
    if "loss" in only:
        loss = measure_loss(best_cfg)
        microbatches = loss["microbatches"]
        emit(loss)
    if "restore" in only:
        if args.steps:
            positions = [int(s) for s in args.steps.split(",")]
        else:
            if microbatches is None:
                microbatches = results[0]["microbatches"] if results else None
            if microbatches is None:
                raise SystemExit("--steps is required with --only restore")
            total_steps = microbatches // LANES
            positions = [max(1, total_steps * p // 100) for p in (5, 50, 90)]
        measure_restore(best_cfg, positions, args.restore_repeats)


if __name__ == "__main__":
    main()
