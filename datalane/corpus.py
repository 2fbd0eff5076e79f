"""A small deterministic corpus for the demo, the tests and the docs.

``make_corpus(dir)`` writes two sources - short "web" documents in Parquet and long "code"
documents in JSONL - from a seeded generator, byte-identical for the same arguments, and
copies the bundled byte-level BPE tokenizer (vocabulary 1,024 with ``<|bos|>``, ``<|eos|>``,
``<|pad|>``) next to them. It writes a ready recipe too.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from importlib import resources

__all__ = ["DemoCorpus", "make_corpus", "tokenizer_path"]


def tokenizer_path() -> str:
    """Path of the bundled tokenizer.json."""
    return str(resources.files("datalane").joinpath("demo_data/tokenizer.json"))


def _words(rng: random.Random, n: int) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def _document(rng: random.Random, vocab: list[str], lo: int, hi: int) -> str:
    target = rng.randint(lo, hi)
    parts: list[str] = []
    n = 0
    while n < target:
        w = vocab[min(int(rng.paretovariate(1.2)) - 1, len(vocab) - 1)]
        parts.append(w)
        n += len(w) + 1
    return " ".join(parts)[:target]


@dataclass(frozen=True)
class DemoCorpus:
    root: str
    web: str  # glob of the Parquet shards
    code: str  # glob of the JSONL shards
    tokenizer: str
    recipe: str  # a two-source recipe over both


def make_corpus(root: str, web_docs: int = 2000, seed: int = 17, lanes: int = 8) -> DemoCorpus:
    """Write the corpus under ``root`` (created if needed) and return its paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    vocab = _words(rng, 800)
    web = [_document(rng, vocab, 20, 1500) for _ in range(web_docs)]
    code = [_document(rng, vocab, 1000, 6000) for _ in range(max(2, web_docs // 20))]
    os.makedirs(os.path.join(root, "web"), exist_ok=True)
    os.makedirs(os.path.join(root, "code"), exist_ok=True)
    shards = 4
    per = -(-len(web) // shards)
    for s in range(shards):
        part = web[s * per:(s + 1) * per]
        table = pa.table({"id": list(range(s * per, s * per + len(part))), "text": part})
        pq.write_table(table, os.path.join(root, "web", f"shard-{s:05d}.parquet"),
                       row_group_size=100)
    per = -(-len(code) // 2)
    for s in range(2):
        with open(os.path.join(root, "code", f"shard-{s:05d}.jsonl"), "w",
                  encoding="utf-8") as f:
            for i, text in enumerate(code[s * per:(s + 1) * per]):
                f.write(json.dumps({"id": s * per + i, "text": text}) + "\n")
    tok = os.path.join(root, "tokenizer.json")
    shutil.copyfile(tokenizer_path(), tok)
    recipe = {
        "lanes": lanes,
        "global_batch_size": 2 * lanes,
        "seq_len": 256,
        "seed": 1234,
        "tokenizer": {"uri": "tokenizer.json"},
        "sources": [
            {"name": "web", "uris": ["web/*.parquet"], "weight": 0.7, "epochs": None},
            {"name": "code", "uris": ["code/*.jsonl"], "weight": 0.3, "epochs": None,
             "chunk_bytes": 16384},
        ],
        "shuffle": {"block_size": 64},
    }
    path = os.path.join(root, "recipe.yaml")
    import yaml

    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(recipe, f, sort_keys=False)
    return DemoCorpus(root, os.path.join(root, "web", "*.parquet"),
                      os.path.join(root, "code", "*.jsonl"), tok, path)
