"""The five paths of the node benchmarks (issue 19) and their corpora and recipes.

Callers: ``bench/scaling.py`` (the cost model), ``bench/feed.py`` (the feed test) and
``bench/device/run.sh`` (through them). Every path is served with the same shape - 8 lanes (one
per rank of an 8-GPU node), global batch 64 of 2,048 tokens, repeating sources (the stream never
ends) - so their costs per token compare:

* ``text_jsonl`` / ``text_parquet``: the same web documents (``bench/make_corpus.py``'s
  generator: 50-5,000 characters, Zipf words) as JSONL and as Parquet, tokenized by the BPE of
  8,192 tokens that script trains on them, ``wrap`` packing;
* ``chat``: ``datalane.corpus.make_chat_corpus`` conversations (ChatML template, loss mask on
  the assistant turns), ``bestfit`` packing;
* ``megatron`` / ``flat``: ``bench/pretokenized.py``'s token ids (lognormal lengths, median
  about 600 tokens) as a Megatron indexed dataset and as a flat ``.u16`` file with a boundary
  id, ``wrap`` packing.

``make(root, quick)`` writes every corpus under ``root`` (once: a folder with ``READY`` is
reused) and returns each path's recipe file. ``quick`` is the CI size (seconds to make).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

PATHS = ("text_jsonl", "text_parquet", "chat", "megatron", "flat")
#: the feed test's three recipes (text, chat, pre-tokenized) -> the path serving each
FEED_RECIPES = {"text": "text_parquet", "chat": "chat", "pretokenized": "megatron"}
LANES = 8
GLOBAL_BATCH = 64  # 8 sequences per lane and step
SEQ_LEN = 2047  # seq_len + 1 = 2,048 tokens per sequence
#: corpus sizes: (web documents, conversations, pre-tokenized ids)
SIZES = {False: (8000, 3000, 4_000_000), True: (400, 200, 300_000)}


def _base(tokenizer: str, sources: list[dict[str, Any]], packing: str) -> dict[str, Any]:
    return {"lanes": LANES, "global_batch_size": GLOBAL_BATCH, "seq_len": SEQ_LEN, "seed": 19,
            "tokenizer": {"uri": tokenizer}, "sources": sources,
            "packing": {"algorithm": packing}, "shuffle": {"block_size": 256}}


def _text(root: Path, docs: int) -> dict[str, dict[str, Any]]:
    import make_corpus
    import pyarrow.parquet as pq

    out = root / "text"
    if not (out / "MANIFEST.json").exists():
        make_corpus.make(out, docs)
    jsonl = out / "web-jsonl"
    jsonl.mkdir(exist_ok=True)
    for shard in sorted((out / "web").glob("*.parquet")):  # the same documents, as JSONL
        target = jsonl / (shard.stem + ".jsonl")
        if not target.exists():
            rows = pq.read_table(shard, columns=["id", "text"]).to_pylist()
            target.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tok = str(out / "tokenizer" / "tokenizer.json")
    return {
        "text_jsonl": _base(tok, [{"name": "web", "uris": [str(jsonl / "*.jsonl")],
                                   "epochs": None, "chunk_bytes": 65536}], "wrap"),
        "text_parquet": _base(tok, [{"name": "web", "uris": [str(out / "web" / "*.parquet")],
                                     "epochs": None, "chunk_rows": 100}], "wrap"),
    }


def _chat(root: Path, conversations: int) -> dict[str, dict[str, Any]]:
    from datalane.corpus import make_chat_corpus

    corpus = make_chat_corpus(str(root / "chat"), conversations=conversations)
    recipe = _base(corpus.tokenizer, [{"name": "sft", "uris": [corpus.chat], "epochs": None,
                                       "chunk_bytes": 65536, "chat": {"train_on": "assistant"}}],
                   "bestfit")
    recipe["tokenizer"]["pad_token"] = "<|pad|>"
    return {"chat": recipe}


def _tokens(root: Path, tokens: int) -> dict[str, dict[str, Any]]:
    import pretokenized

    out = root / "tokens"
    if not (out / "MANIFEST.json").exists():
        pretokenized.make_corpus(out, tokens)
    tok = str(out / "tokenizer.json")
    return {
        "megatron": _base(tok, [{"name": "ids", "uris": [str(out / "corpus.idx")],
                                 "epochs": None, "chunk_bytes": 65536, "tokens": {}}], "wrap"),
        "flat": _base(tok, [{"name": "ids", "uris": [str(out / "corpus.u16")], "epochs": None,
                             "chunk_bytes": 65536, "tokens": {"boundary": pretokenized.EOS}}],
                      "wrap"),
    }


def make(root: Path, quick: bool = False) -> dict[str, Path]:
    """Every path's corpus under ``root`` and its recipe file (``<path>.yaml``)."""
    root.mkdir(parents=True, exist_ok=True)
    recipes = {path: root / f"{path}.yaml" for path in PATHS}
    if (root / "READY").exists():
        return recipes
    docs, conversations, tokens = SIZES[quick]
    made = {**_text(root, docs), **_chat(root, conversations), **_tokens(root, tokens)}
    for path, recipe in made.items():
        recipes[path].write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    (root / "READY").write_text("ok\n")
    return recipes


def default_root(quick: bool) -> Path:
    """``~/.cache/datalane/node-bench[-quick]-<key>``, keyed by the generators' sources."""
    import hashlib

    key = hashlib.sha256(b"".join((HERE / name).read_bytes() for name in
                                  ("node_paths.py", "make_corpus.py", "pretokenized.py")))
    return (Path.home() / ".cache" / "datalane"
            / f"node-bench{'-quick' if quick else ''}-{key.hexdigest()[:12]}")


if __name__ == "__main__":  # bench/device/run.sh makes the corpora before it measures
    import argparse

    ap = argparse.ArgumentParser(description="write every path's corpus and recipe")
    ap.add_argument("root", type=Path)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    for name, recipe in make(a.root, a.quick).items():
        print(f"{name}: {recipe}")
