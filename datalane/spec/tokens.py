"""The tokens part of a source: documents that are token ids already, never tokenized again.

A pre-tokenized source's records hold the token ids of one document each: a Parquet column of
integer lists (``list<int32>``, ``list<int64>``, ...), a JSONL key holding a list of integers,
a Megatron-LM indexed dataset (``.idx`` + ``.bin``) or a flat token file (``flatbin``). The ids
are checked against the recipe's tokenizer (every id in ``[0, vocabulary size)``) and used as
they are: no tokenizer call on the hot path. :class:`TokensSpec` is the recipe's
``sources[i].tokens``; the engine side is :mod:`datalane.engine.documents.tokens`, the formats
that only hold token ids are :mod:`datalane.engine.formats.megatron` and
:mod:`datalane.engine.formats.flatbin`.

BOS and EOS are *not* added by default (``add_bos`` / ``add_eos`` false, unlike text's
``tokenizer.add_eos``): pre-tokenized data almost always carries its own document ends
already - Megatron's ``preprocess_data.py --append-eod``, nanoGPT's ``prepare.py`` and OLMo's
token files all end every document with EOS - and adding one more would train on doubled
EOS tokens. Data made without them sets ``add_eos: true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from datalane.spec.model import doc

__all__ = ["FLAT_DTYPES", "TokensSpec"]

FLAT_DTYPES = ("uint16", "uint32")


@dataclass(frozen=True)
class TokensSpec:
    """A pre-tokenized source: its records hold token ids, validated against the tokenizer."""

    field: str = doc(
        "Column (Parquet, a list of integers) or key (JSONL, a list of integers) holding the "
        "token ids; Megatron and flatbin files hold nothing else and have no fields.",
        default="input_ids", pattern=r".+")
    add_bos: bool = doc(
        "Prepend the tokenizer's BOS token (`tokenizer.bos_token`) to every document.",
        default=False)
    add_eos: bool = doc(
        "Append the tokenizer's EOS token (`tokenizer.eos_token`) to every document. Off by "
        "default: pre-tokenized data usually ends each document with EOS already (Megatron's "
        "`--append-eod`, nanoGPT, OLMo).", default=False)
    dtype: Literal["uint16", "uint32"] | None = doc(
        "How a `flatbin` file stores its ids (little-endian; required there). Megatron files "
        "name their type in the index, which must then be this one if it is set; Parquet and "
        "JSONL ids are checked by value whatever their integer type.", default=None)
    boundary: int | None = doc(
        "`flatbin`: the token id that ends every document (kept as its last token, like "
        "nanoGPT's `<|endoftext|>`); null: the documents are listed in the offsets file "
        "beside each flat file (`NAME.offsets.npy`, see Pre-tokenized sources).",
        default=None, ge=0)

    @property
    def document_field(self) -> str:
        """The field of a record that holds the document (its token ids)."""
        return self.field
