#!/usr/bin/env python3
"""The benchmark corpus: a deterministic web source, a code source and a tokenizer trained on
them, written byte-identically for the same arguments.

    python bench/make_corpus.py OUT_DIR [--docs N] [--seed S]

Layout (what ``bench/run.py``, ``bench/datalane_bench.py`` and the peer benchmarks read):

* ``web/shard-0000{0..7}.parquet`` - N short documents (50 to 5,000 characters) in column
  ``text``, row groups of 500 rows, zstd-compressed pages;
* ``code/shard-0000{0,1}.jsonl`` - N/20 long documents (2,000 to 40,000 characters), key
  ``text``; a second source with a very different length, so that mixing by tokens and by
  documents differ;
* ``tokenizer/tokenizer.json`` - byte-level BPE with a vocabulary of 8,192 trained on the
  corpus, specials ``<|bos|>``, ``<|eos|>``, ``<|pad|>``; ``tokenizer_config.json`` and
  ``special_tokens_map.json`` beside it, for loaders that want a Hugging Face directory;
* ``MANIFEST.json`` - counts, and the size and SHA-256 of every file.

Words follow a Zipf-like law (a Pareto draw over a fixed random vocabulary), which gives the
tokenizer realistic merge statistics. Needs pyarrow and tokenizers only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")
WEB_SHARDS = 8
CODE_SHARDS = 2


class Writer:
    """Seeded text: a vocabulary of random words, documents of a drawn length."""

    def __init__(self, seed: int, vocabulary: int = 5000) -> None:
        self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.vocab = ["".join(self.rng.choice(letters) for _ in range(self.rng.randint(2, 10)))
                      for _ in range(vocabulary)]

    def document(self, shortest: int, longest: int) -> str:
        length = self.rng.randint(shortest, longest)
        out: list[str] = []
        size = 0
        top = len(self.vocab) - 1
        while size < length:
            word = self.vocab[min(int(self.rng.paretovariate(1.1)) - 1, top)]
            out.append(word)
            size += len(word) + 1
        return " ".join(out)[:length]


def _split(items: list[str], parts: int) -> list[list[str]]:
    per = -(-len(items) // parts)
    return [items[i * per:(i + 1) * per] for i in range(parts)]


def make(out: Path, docs: int = 20000, seed: int = 1234) -> dict[str, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    w = Writer(seed)
    web = [w.document(50, 5000) for _ in range(docs)]
    code = [w.document(2000, 40000) for _ in range(max(1, docs // 20))]
    for sub in ("web", "code", "tokenizer"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    first = 0
    for s, part in enumerate(_split(web, WEB_SHARDS)):
        table = pa.table({"id": list(range(first, first + len(part))), "text": part})
        pq.write_table(table, out / "web" / f"shard-{s:05d}.parquet", row_group_size=500,
                       compression="zstd")
        first += len(part)
    first = 0
    for s, part in enumerate(_split(code, CODE_SHARDS)):
        lines = [json.dumps({"id": first + i, "text": t}) for i, t in enumerate(part)]
        (out / "code" / f"shard-{s:05d}.jsonl").write_text(
            "".join(line + "\n" for line in lines), encoding="utf-8")
        first += len(part)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=list(SPECIALS),
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(web[:5000] + code[:100], trainer)
    tok.save(str(out / "tokenizer" / "tokenizer.json"))
    names = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1], "pad_token": SPECIALS[2]}
    (out / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", **names, "model_max_length": 1 << 30},
        indent=1))
    (out / "tokenizer" / "special_tokens_map.json").write_text(json.dumps(names, indent=1))

    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.json"):
        data = path.read_bytes()
        files[str(path.relative_to(out))] = {"bytes": len(data),
                                             "sha256": hashlib.sha256(data).hexdigest()}
    counts = {"web_docs": len(web), "code_docs": len(code)}
    (out / "MANIFEST.json").write_text(json.dumps(
        {"seed": seed, **counts, "files": files}, indent=1, sort_keys=True))
    return {**counts, "files": len(files)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=20000, help="web documents (code: docs/20)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    print(json.dumps(make(args.out, args.docs, args.seed)))


if __name__ == "__main__":
    main()
