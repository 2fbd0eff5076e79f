#!/usr/bin/env python3
"""datalane on the benchmark recipe: throughput, resume point size, restore time, tokens lost.

Recipe (issue 2): the web source of ``bench/make_corpus.py``, ``wrap`` packing to
2,049 tokens (seq_len 2,048), document block shuffle of 1,024, 2 lanes, global batch 8, read
as microbatches of 4 on one rank (both lanes). Output: JSON lines on stdout.

Modes:
  throughput --workers K   every microbatch until the data ends; tokens/s counts document
                           tokens delivered (padding excluded); time includes planning,
                           reading Parquet, tokenizing, shuffling, packing and hashing.
  restore                  resume point bytes per lane, and restore-to-first-batch seconds
                           (new plan + new loader + load_state_dict + first step) at an early,
                           a middle and a late step; tokens lost against a direct count.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import numpy as np

from datalane import Knobs, Loader, load_recipe
from datalane.engine.plan import Plan
from datalane.spec.state import LaneState


def recipe_for(corpus: str):
    return load_recipe({
        "lanes": 2,
        "global_batch_size": 8,
        "seq_len": 2048,
        "seed": 1234,
        "tokenizer": {"uri": os.path.join(corpus, "tokenizer", "tokenizer.json")},
        "sources": [{"name": "web", "uris": [os.path.join(corpus, "web", "*.parquet")],
                     "epochs": 1}],
        "packing": {"algorithm": "wrap"},
        "shuffle": {"block_size": 1024},
    })


def throughput(corpus: str, workers: int) -> dict:
    t0 = time.perf_counter()
    recipe = recipe_for(corpus)
    tokens = 0
    micro = 0
    with Loader(recipe, 0, 1, Knobs(workers=workers)) as loader:
        for mb in loader.microbatches(4):
            tokens += int((mb.positions >= 0).sum())
            micro += 1
            if mb.ended and mb.index == 1:  # the last microbatch of the step where data ends
                break
        counters = loader.counters()
    seconds = time.perf_counter() - t0
    return {"name": f"datalane_workers_{workers}", "tokens": tokens, "seconds": round(seconds, 4),
            "tokens_per_s": round(tokens / seconds, 1), "microbatches": micro,
            "documents": counters.docs, "padding_tokens": counters.padding}


def _direct_token_count(corpus: str, recipe) -> tuple[int, int]:
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(recipe.tokenizer.uri)
    texts: list[str] = []
    for path in sorted(glob.glob(os.path.join(corpus, "web", "*.parquet"))):
        texts += pq.read_table(path, columns=["text"]).column("text").to_pylist()
    total = 0
    for i in range(0, len(texts), 256):
        total += sum(len(e) + 1 for e in tok.encode_batch_fast(texts[i:i + 256],
                                                               add_special_tokens=False))
    return total, len(texts)


def restore(corpus: str) -> list[dict]:
    recipe = recipe_for(corpus)
    out = []
    plan = Plan.build(recipe)
    states = {}
    steps = 0
    tokens = 0
    with Loader(recipe, 0, 1, Knobs(workers=2), plan=plan) as loader:
        while True:
            step = loader.next_step()
            tokens += int((step.positions >= 0).sum())
            steps += 1
            if step.ended:
                break
        docs = loader.counters().docs
    marks = {"early": 3, "middle": steps // 2, "late": steps - 3}
    with Loader(recipe, 0, 1, Knobs(workers=2), plan=plan) as loader:
        for s in range(max(marks.values()) + 1):
            if s in marks.values():
                states[s] = loader.state_dict()
            loader.next_step()
    sizes = [LaneState.from_json(v).encoded_size()
             for st in states.values() for v in st["lanes"].values()]
    out.append({"name": "datalane_resume_point", "bytes_per_lane_max": max(sizes),
                "bytes_per_lane_mean": round(float(np.mean(sizes)), 1)})
    for label, s in marks.items():
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:  # plans again: a new process
                loader.load_state_dict(states[s])
                loader.next_step()
            took = time.perf_counter() - t0
            best = took if best is None else min(best, took)
        out.append({"name": f"datalane_restore_{label}", "step": s, "of_steps": steps,
                    "seconds": round(best, 4)})
    expected, n_docs = _direct_token_count(corpus, recipe)
    out.append({"name": "datalane_tokens_lost", "delivered": tokens, "expected": expected,
                "lost": expected - tokens, "documents_read": docs, "documents": n_docs})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["throughput", "restore"])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.mode == "throughput":
        print(json.dumps(throughput(args.corpus, args.workers)), flush=True)
    else:
        for rec in restore(args.corpus):
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
