"""Building blocks of the stage tests: documents, a word-level tokenizer, tiny sources.

Every expectation in the stage tests (in ``tests/engine``) is computed by hand, so the inputs
must be countable by hand too. The tokenizer here is a word-level one: each
whitespace-separated word is exactly one token, ``x`` is token 4 and ``d<i>`` is token
``DOC0 + i``, so a document written as ``"d7 x x"`` is the tokens ``[DOC0 + 7, 4, 4]`` plus EOS
(``EOS``): four tokens, and its first token names it. :func:`make_doc` is the one place that
builds an engine document.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from datalane.engine.documents.base import Doc

PAD, EOS, BOS, UNK, X = 0, 1, 2, 3, 4
DOC0 = 5  # token of the word "d0"; "d<i>" is DOC0 + i
MAX_DOCS = 4096


def write_tokenizer(path: Path) -> str:
    """A word-level ``tokenizer.json``: ``<|pad|>`` 0, ``<|eos|>`` 1, ``<|bos|>`` 2, ``x`` 4,
    ``d0``.. ``d4095`` from 5."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|pad|>": PAD, "<|eos|>": EOS, "<|bos|>": BOS, "<|unk|>": UNK, "x": X}
    vocab.update({f"d{i}": DOC0 + i for i in range(MAX_DOCS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.write_text(tok.to_str())
    return str(path)


def text_of(doc_id: int, length: int) -> str:
    """The text of document ``doc_id`` that tokenizes to ``length`` tokens (EOS not counted)."""
    assert length >= 1
    return " ".join([f"d{doc_id}"] + ["x"] * (length - 1))


def write_jsonl(path: Path, texts: Sequence[str]) -> str:
    """One ``{"text": ...}`` line per text; returns the path."""
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def doc_ids(input_ids: np.ndarray) -> list[int]:
    """The document ids of ``d<i>`` tokens in ``input_ids``, in order."""
    flat = np.asarray(input_ids).reshape(-1)
    return [int(t) - DOC0 for t in flat if t >= DOC0]


def recipe_dict(tok: str, sources: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    """A recipe over the word-level tokenizer (EOS appended, pad ``<|pad|>``)."""
    data: dict[str, Any] = {
        "lanes": 1, "global_batch_size": 1, "seq_len": 7, "seed": 3,
        "tokenizer": {"uri": tok, "pad_token": "<|pad|>"},
        "sources": sources,
        "shuffle": {"block_size": 1},
    }
    data.update(over)
    return data


# -- engine documents ----------------------------------------------------------------------------

def make_doc(source: int, ref: tuple[int, ...], tokens: Sequence[int] | np.ndarray,
             *extra: np.ndarray) -> Doc:
    """An engine document: ``input_ids`` from ``tokens``, then the ``extra`` document columns
    (e.g. a ``loss_mask``) in schema order."""
    return Doc(source, tuple(ref), (np.asarray(tokens, dtype=np.int32), *extra))


def picked(got: Doc | None) -> tuple[int, tuple[int, ...], np.ndarray]:
    """``(source, ref, input_ids)`` of a document the mixture returned."""
    assert got is not None, "the mixture ended while its streams still had documents"
    return got.source, tuple(got.ref), np.asarray(got.columns[0])
