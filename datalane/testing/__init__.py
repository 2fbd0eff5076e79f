"""``datalane.testing``: a small deterministic corpus for the demo, the tests and the docs (as
``kopf.testing`` is kopf's: what a user's own tests of a trainer need too).

``make_corpus(dir)`` writes two sources - short "web" documents in Parquet and long "code"
documents in JSONL - from a seeded generator, byte-identical for the same arguments, and
copies the bundled byte-level BPE tokenizer (vocabulary 1,024 with ``<|bos|>``, ``<|eos|>``,
``<|pad|>``) next to them. It writes a ready recipe too.

``make_chat_corpus(dir)`` writes supervised fine-tuning data: multi-turn conversations
(system prompts, several user/assistant turns, the odd empty turn) in JSONL, the same
tokenizer plus ChatML's ``<|im_start|>`` / ``<|im_end|>`` special tokens, a
``tokenizer_config.json`` carrying a ChatML chat template, and a recipe that mixes the chat
source with plain text (so both document kinds share one sample schema).

:mod:`datalane.testing.images` writes the image-caption corpus of the image tests and
bench/images.py (WebDataset shards and Parquet), and the malformed images every decoder must
set aside.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = ["ChatCorpus", "DemoCorpus", "make_chat_corpus", "make_corpus", "tokenizer_path"]

#: A ChatML chat template (the form Qwen and SmolLM ship), as ``transformers`` renders it.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def tokenizer_path() -> str:
    """Path of the bundled tokenizer.json."""
    return str(resources.files("datalane.testing").joinpath("tokenizer.json"))


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



def _write_recipe(root: str, recipe: dict[str, Any]) -> str:
    """``root/recipe.yaml`` holding ``recipe`` in key order; returns its path."""
    import yaml

    path = os.path.join(root, "recipe.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(recipe, f, sort_keys=False)
    return path

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
    path = _write_recipe(root, recipe)
    return DemoCorpus(root, os.path.join(root, "web", "*.parquet"),
                      os.path.join(root, "code", "*.jsonl"), tok, path)


@dataclass(frozen=True)
class ChatCorpus:
    root: str
    chat: str  # glob of the conversation shards (JSONL, field "messages")
    text: str  # glob of a small plain-text source (JSONL, field "text")
    tokenizer: str  # with <|im_start|> / <|im_end|>; tokenizer_config.json beside it
    recipe: str  # chat 80% + text 20%, packed with bestfit


def _conversation(rng: random.Random, vocab: list[str]) -> list[dict[str, str]]:
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": _document(rng, vocab, 20, 120)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": _document(rng, vocab, 10, 300)})
        reply = "" if rng.random() < 0.03 else _document(rng, vocab, 20, 900)
        messages.append({"role": "assistant", "content": reply})
    return messages


def make_chat_corpus(root: str, conversations: int = 800, seed: int = 23,
                     lanes: int = 8) -> ChatCorpus:
    """Write the chat corpus under ``root`` (created if needed) and return its paths."""
    from tokenizers import AddedToken, Tokenizer

    rng = random.Random(seed)
    vocab = _words(rng, 600)
    convs = [_conversation(rng, vocab) for _ in range(conversations)]
    texts = [_document(rng, vocab, 50, 2000) for _ in range(max(lanes * 4, conversations // 8))]
    for sub in ("chat", "text"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    shards = 4
    per = -(-len(convs) // shards)
    for s in range(shards):
        with open(os.path.join(root, "chat", f"shard-{s:05d}.jsonl"), "w",
                  encoding="utf-8") as f:
            for i, conv in enumerate(convs[s * per:(s + 1) * per]):
                f.write(json.dumps({"id": s * per + i, "messages": conv}) + "\n")
    with open(os.path.join(root, "text", "shard-00000.jsonl"), "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    tok = Tokenizer.from_file(tokenizer_path())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|im_start|>", "<|im_end|>")])
    tok_path = os.path.join(root, "tokenizer.json")
    tok.save(tok_path)
    with open(os.path.join(root, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"chat_template": CHATML_TEMPLATE, "bos_token": "<|bos|>",
                   "eos_token": "<|im_end|>", "pad_token": "<|pad|>"}, f, indent=1)
    recipe = {
        "lanes": lanes,
        "global_batch_size": 2 * lanes,
        "seq_len": 512,
        "seed": 99,
        "tokenizer": {"uri": "tokenizer.json", "pad_token": "<|pad|>"},
        "sources": [
            {"name": "sft", "uris": ["chat/*.jsonl"], "weight": 0.8, "epochs": None,
             "chunk_bytes": 16384, "chat": {"train_on": "assistant"}},
            {"name": "text", "uris": ["text/*.jsonl"], "weight": 0.2, "epochs": None,
             "chunk_bytes": 8192},
        ],
        "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 32},
    }
    path = _write_recipe(root, recipe)
    return ChatCorpus(root, os.path.join(root, "chat", "*.jsonl"),
                      os.path.join(root, "text", "*.jsonl"), tok_path, path)
