"""The tokenizer stage: a ``tokenizer.json`` from any fsspec URI, batched encode, BOS/EOS.

Documents are encoded without the tokenizer's own post-processing (``add_special_tokens``
off); BOS and EOS are added here by the recipe's policy, so the result never depends on how a
tokenizer file happens to configure its template. Called from map tasks on worker threads
(``encode_batch_fast`` releases the GIL and runs in Rust).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from datalane.engine.files import read_bytes
from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.recipe import TokenizerSpec

__all__ = ["TokenizerHandle"]


@dataclass
class TokenizerHandle:
    """A loaded tokenizer with its content hash and special-token ids."""

    spec: TokenizerSpec
    sha256: str
    tokenizer: Any
    bos_id: int | None
    eos_id: int | None
    pad_id: int

    @classmethod
    def load(cls, spec: TokenizerSpec) -> TokenizerHandle:
        from tokenizers import Tokenizer

        data = read_bytes(spec.uri, "tokenizer.uri")
        digest = hashlib.sha256(data).hexdigest()
        if spec.sha256 is not None and spec.sha256 != digest:
            raise MismatchError(f"tokenizer.sha256 pins {spec.sha256}, but {spec.uri} has "
                                f"SHA-256 {digest}")
        try:
            tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # tokenizers raises a plain Exception on bad JSON
            raise ConfigError(f"tokenizer.uri {spec.uri!r} is not a valid tokenizer.json: "
                              f"{e}") from e

        def token(field: str, name: str) -> int:
            tid = tok.token_to_id(name)
            if tid is None:
                raise ConfigError(f"tokenizer.{field} {name!r} is not in the vocabulary of "
                                  f"{spec.uri}")
            return int(tid)

        bos = token("bos_token", spec.bos_token) if spec.add_bos else None
        eos = token("eos_token", spec.eos_token) if spec.add_eos else None
        pad = (token("pad_token", spec.pad_token) if spec.pad_token is not None
               else token("eos_token", spec.eos_token))
        return cls(spec, digest, tok, bos, eos, pad)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Encode a batch: ``(tokens, offsets, raw_lengths)``.

        ``tokens[offsets[i]:offsets[i+1]]`` is document ``i`` with BOS/EOS applied;
        ``raw_lengths[i]`` counts its tokens without them (what token filters see).
        """
        encs = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        n = len(encs)
        lens = np.fromiter((len(e) for e in encs), dtype=np.int64, count=n)
        total = int(lens.sum())
        flat = np.fromiter(chain.from_iterable([e.ids for e in encs]), dtype=np.int32,
                           count=total)
        extra = (self.bos_id is not None) + (self.eos_id is not None)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens + extra, out=offsets[1:])
        if not extra:
            return flat, offsets, lens
        out = np.empty(int(offsets[-1]), dtype=np.int32)
        body = np.ones(out.size, dtype=bool)
        if self.bos_id is not None:
            out[offsets[:-1]] = self.bos_id
            body[offsets[:-1]] = False
        if self.eos_id is not None:
            out[offsets[1:] - 1] = self.eos_id
            body[offsets[1:] - 1] = False
        out[body] = flat
        return out, offsets, lens
