#!/usr/bin/env python3
"""Chat tokenization throughput: datalane's ChatKind against transformers, in the same run.

Both sides turn the same generated multi-turn conversations into token ids with the same chat
template and tokenizer (``tests/data/chat``: the ChatML or the Llama 3 template, the demo BPE
tokenizer with their special tokens):

* **datalane**: ``ChatKind.render`` per conversation and ``ChatKind.tokenize`` per batch of
  256, as the engine's map tasks do; this also computes the loss mask (``train_on``
  assistant: every assistant turn is located by its prefix renders).
* **transformers**: ``apply_chat_template(conversation, tokenize=False)`` and then
  ``encode(text, add_special_tokens=False)`` per conversation (also timed: the tokenizer
  ``__call__``; the faster of the two is the baseline). No mask.

The corpus is generated here, seeded and deterministic: conversations of 1 to 4 user/assistant
exchanges, half with a system prompt, messages of 4 to 160 words (some non-ASCII). Each side
is timed ``--repeats`` times, interleaved, and the best wall time kept (``ratio``: the
transformers baseline's seconds over datalane's); ``cpu_ratio`` is the same with the process's
CPU time, which counts every core ``encode_batch`` used, so it shows the work per
conversation apart from the parallelism. The token ids of both sides are checked to be
identical. One JSON line on stdout::

    .venv/bin/python bench/chat_tokenize.py [--conversations 4096] [--template chatml|llama3]
    TOKENIZERS_PARALLELISM=false .venv/bin/python bench/chat_tokenize.py   # one core for Rust

``encode_batch`` runs on every core by default (the engine calls it from worker threads);
the transformers loop encodes one conversation at a time. Goal (issue 13): ratio >= 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from datalane.engine.documents.chat import ChatKind  # noqa: E402
from datalane.engine.tokenize import TokenizerHandle  # noqa: E402
from datalane.spec.chat import ChatSpec  # noqa: E402
from datalane.spec.recipe import TokenizerSpec  # noqa: E402

DATA = ROOT / "tests" / "data" / "chat"
BATCH = 256
WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on",
         "be", "by", "this", "are", "or", "from", "at", "which", "data", "model", "train",
         "token", "batch", "step", "loss", "learning", "rate", "layer", "attention", "memory",
         "value", "function", "python", "code", "error", "file", "system", "user", "answer",
         "question", "example", "result", "because", "however", "therefore", "simple", "quick",
         "brown", "fox", "jumps", "over", "lazy", "dog", "café", "naïve", "Straße", "東京",
         "данные", "χρόνος", "🙂")
SYSTEM = ("You are a helpful assistant.", "Answer briefly and precisely.",
          "You are a senior engineer reviewing code.")


def corpus(n: int, seed: int, max_words: int = 160) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)

    def text() -> str:
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, max(4, max_words)))]
        return " ".join(words).capitalize() + rng.choice((".", "?", "!", "\n\nOk."))

    out = []
    for _ in range(n):
        conv = [{"role": "system", "content": rng.choice(SYSTEM)}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 4)):
            conv.append({"role": "user", "content": text()})
            conv.append({"role": "assistant", "content": text()})
        out.append(conv)
    return out


def trained_tokenizer(folder: str, seed: int) -> str:
    """A byte-level BPE trained on other conversations of the generator (about 4.7 characters
    per token, like a large-vocabulary tokenizer on English; the demo one makes about 1.5),
    with the chat special tokens; its path."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [m["content"] for conv in corpus(2000, seed + 1) for m in conv]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=8192, show_progress=False, special_tokens=["<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    special = json.loads((DATA / "tokenizer.json").read_text())["added_tokens"]
    tok.add_special_tokens([AddedToken(t["content"], special=True, normalized=False)
                            for t in special if t["content"] != "<|eos|>"])
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    return path


def hf_tokenizer(template: str, tokenizer: str = str(DATA / "tokenizer.json")) -> Any:
    from transformers import PreTrainedTokenizerFast

    folder = DATA / template
    config = json.loads((folder / "tokenizer_config.json").read_text())
    text = config.get("chat_template") or (folder / "chat_template.jinja").read_text()
    tokens = {k: (v["content"] if isinstance(v, dict) else v) for k, v in config.items()
              if k.endswith("_token") and v is not None}
    return PreTrainedTokenizerFast(tokenizer_file=tokenizer, chat_template=text, **tokens)


Timed = tuple[float, float, list[Any]]  # (wall seconds, CPU seconds of the process, output)


def run_datalane(kind: ChatKind, convs: list[list[dict[str, str]]]) -> Timed:
    t0, c0 = time.perf_counter(), time.process_time()
    out = []
    for b in range(0, len(convs), BATCH):
        docs = []
        for conv in convs[b:b + BATCH]:
            doc, reason, detail = kind.render(conv)
            if doc is None:
                raise SystemExit(f"a generated conversation is a bad record: {reason}: {detail}")
            docs.append(doc)
        out.append(kind.tokenize(docs))
    return time.perf_counter() - t0, time.process_time() - c0, out


def run_hf(tok: Any, convs: list[list[dict[str, str]]], call: bool) -> Timed:
    t0, c0 = time.perf_counter(), time.process_time()
    out = []
    for conv in convs:
        text = tok.apply_chat_template(conv, tokenize=False)
        ids = (tok(text, add_special_tokens=False)["input_ids"] if call
               else tok.encode(text, add_special_tokens=False))
        out.append(ids)
    return time.perf_counter() - t0, time.process_time() - c0, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=4096)
    p.add_argument("--template", choices=("chatml", "llama3"), default="chatml")
    p.add_argument("--train-on", choices=("assistant", "last_assistant", "all"),
                   default="assistant")
    p.add_argument("--max-words", type=int, default=160, help="longest message, in words")
    p.add_argument("--tokenizer", choices=("demo", "trained"), default="demo",
                   help="demo: tests/data/chat/tokenizer.json (1,031 tokens); trained: a BPE "
                        "trained here on the generator's words")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=13)
    args = p.parse_args(argv)

    convs = corpus(args.conversations, args.seed, args.max_words)
    folder = tempfile.mkdtemp(prefix="chat-bench-")
    path = (str(DATA / "tokenizer.json") if args.tokenizer == "demo"
            else trained_tokenizer(folder, args.seed))
    handle = TokenizerHandle.load(TokenizerSpec(uri=path, eos_token="<|eos|>"))
    kind = ChatKind(ChatSpec(tokenizer_config=str(DATA / args.template / "tokenizer_config.json"),
                             train_on=args.train_on), handle, "bench.chat")
    tok = hf_tokenizer(args.template, path)

    runs: dict[str, list[Timed]] = {"datalane": [], "encode": [], "call": []}
    for _ in range(args.repeats):  # interleaved, so that both sides see the same machine
        runs["datalane"].append(run_datalane(kind, convs))
        runs["encode"].append(run_hf(tok, convs, call=False))
        runs["call"].append(run_hf(tok, convs, call=True))
    best = {name: min(r, key=lambda t: t[0]) for name, r in runs.items()}
    cpu = {name: min(t[1] for t in r) for name, r in runs.items()}
    ours, encode, called = best["datalane"], best["encode"], best["call"]
    mine = [ids.tolist() for cols, offs, _ in ours[2]
            for ids in (cols["input_ids"][offs[i]:offs[i + 1]] for i in range(len(offs) - 1))]
    if mine != encode[2] or mine != called[2]:
        raise SystemExit("datalane and transformers disagree on the token ids")
    tokens = sum(len(ids) for ids in mine)
    trained = sum(int(cols["loss_mask"].sum()) for cols, _, _ in ours[2])
    base = min(encode[0], called[0])
    base_cpu = min(cpu["encode"], cpu["call"])

    def figures(name: str) -> dict[str, float]:
        seconds = best[name][0]
        return {"seconds": round(seconds, 4), "cpu_seconds": round(cpu[name], 4),
                "conversations_per_s": round(len(convs) / seconds, 1),
                "tokens_per_s": round(tokens / seconds, 1)}

    import tokenizers
    import transformers

    print(json.dumps({
        "name": "chat_tokenize", "template": args.template, "train_on": args.train_on,
        "tokenizer": args.tokenizer, "vocab": handle.tokenizer.get_vocab_size(),
        "conversations": len(convs), "max_words": args.max_words, "tokens": tokens,
        "trained_tokens": trained, "batch": BATCH, "repeats": args.repeats,
        "datalane": figures("datalane"), "transformers_encode": figures("encode"),
        "transformers_call": figures("call"),
        "ratio": round(base / ours[0], 2), "cpu_ratio": round(base_cpu / cpu["datalane"], 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default"),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
