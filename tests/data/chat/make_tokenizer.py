"""Write tests/data/chat/tokenizer.json: the demo BPE tokenizer plus the chat special tokens.

The bundled ``datalane/testing/tokenizer.json`` knows ``<|bos|>``, ``<|eos|>`` and
``<|pad|>``; the chat tests also need the control tokens of the two shipped templates
(ChatML's ``<|im_start|>`` / ``<|im_end|>``, Llama 3's header and end-of-turn tokens). They are
added as special tokens (never split, never normalized), which is how the real tokenizers of
those model families declare them. Run from the repository root after changing the list::

    .venv/bin/python tests/data/chat/make_tokenizer.py
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "datalane" / "testing" / "tokenizer.json"
OUT = Path(__file__).resolve().parent / "tokenizer.json"
SPECIAL = [
    "<|im_start|>", "<|im_end|>",  # ChatML (Qwen, SmolLM)
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eot_id|>",  # Llama 3
]


def main() -> None:
    tok = Tokenizer.from_file(str(SOURCE))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.save(str(OUT), pretty=True)
    print(f"wrote {OUT} ({tok.get_vocab_size()} tokens)")


if __name__ == "__main__":
    main()
