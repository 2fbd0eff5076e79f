#!/usr/bin/env python3
"""Baseline peer: raw `tokenizers` encode_batch_fast plus numpy packing (`wrap`).

Role: the ceiling the throughput targets of issue 2 are measured against. It does the
minimum work of the benchmark recipe and nothing else: no lanes, no shuffle, no resume
points, no background threads.

What is timed: for the web texts, already loaded into memory before the clock starts,
`Tokenizer.encode_batch_fast(batch, add_special_tokens=False)` in batches of 64 documents,
one EOS appended per document, numpy concatenation with the carry-over of the previous
batch, and the cut into full `(n, seq_len + 1)` int32 sequences (`wrap` packing). The trailing
partial sequence at the very end is not delivered (it is reported as `tail_tokens`).
Reading Parquet and building the Python list of texts is not timed.

Output: one JSON line per repeat on stdout:
  {"name": "raw_encode_batch_fast", "tokens": N, "seconds": s, "tokens_per_s": x, ...}
where `tokens` counts tokens delivered in full sequences.

Self-contained on purpose (no datalane import): needs pyarrow, numpy and tokenizers.
Usage: raw_tokenizers.py --corpus DIR [--docs N] [--batch 64] [--seq-len 2048] [--repeats 1]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import numpy as np
import pyarrow.parquet as pq
from tokenizers import Tokenizer


def load_web_texts(corpus: str, limit: int | None) -> list[str]:
    """All `text` values of web/*.parquet in file order, then row order."""
    files = sorted(glob.glob(os.path.join(corpus, "web", "*.parquet")))
    if not files:
        raise SystemExit(f"no web/*.parquet under {corpus!r}; run make_corpus.py first")
    texts: list[str] = []
    for path in files:
        texts.extend(pq.read_table(path, columns=["text"]).column("text").to_pylist())
        if limit is not None and len(texts) >= limit:
            return texts[:limit]
    return texts


def run_once(tok: Tokenizer, texts: list[str], eos: int, batch: int, width: int) -> dict:
    eos_arr = np.array([eos], dtype=np.int32)
    carry = np.empty(0, dtype=np.int32)
    delivered = 0
    sequences = 0
    checksum = 0
    t0 = time.perf_counter()
    for start in range(0, len(texts), batch):
        encs = tok.encode_batch_fast(texts[start : start + batch], add_special_tokens=False)
        parts = [carry]
        for enc in encs:
            parts.append(np.asarray(enc.ids, dtype=np.int32))
            parts.append(eos_arr)
        flat = np.concatenate(parts)
        n = len(flat) // width
        if n:
            seqs = flat[: n * width].reshape(n, width)  # what a trainer would receive
            delivered += seqs.size
            sequences += n
            checksum ^= int(seqs[-1, -1])  # touch the output so nothing is optimised away
        carry = flat[n * width :]
    seconds = time.perf_counter() - t0
    return {
        "name": "raw_encode_batch_fast",
        "tokens": delivered,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(delivered / seconds, 1),
        "sequences": sequences,
        "tail_tokens": len(carry),
        "total_tokens": delivered + len(carry),
        "docs": len(texts),
        "batch_docs": batch,
        "seq_width": width,
        "texts_preloaded": True,
        "checksum": checksum,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, help="directory written by make_corpus.py")
    ap.add_argument("--docs", type=int, default=None, help="use only the first N web documents")
    ap.add_argument("--batch", type=int, default=64, help="documents per encode_batch_fast call")
    ap.add_argument("--seq-len", type=int, default=2048, help="sequences are seq_len + 1 tokens")
    ap.add_argument("--repeats", type=int, default=1, help="timed passes (one JSON line each)")
    ap.add_argument("--warmup", action="store_true", help="one untimed pass first")
    args = ap.parse_args()

    tok = Tokenizer.from_file(os.path.join(args.corpus, "tokenizer", "tokenizer.json"))
    eos = tok.token_to_id("<|eos|>")
    if eos is None:
        raise SystemExit("tokenizer has no <|eos|> token")
    texts = load_web_texts(args.corpus, args.docs)  # loaded before timing
    if args.warmup:
        run_once(tok, texts[: 64 * args.batch], eos, args.batch, args.seq_len + 1)
    for i in range(args.repeats):
        result = run_once(tok, texts, eos, args.batch, args.seq_len + 1)
        result["repeat"] = i
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
