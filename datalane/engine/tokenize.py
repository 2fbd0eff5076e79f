"""The tokenizer stage: a ``tokenizer.json`` from any fsspec URI, batched encode, BOS/EOS.

Documents are encoded without the tokenizer's own post-processing (``add_special_tokens``
off), padding or truncation (a file's ``padding`` / ``truncation`` blocks are dropped at load:
padding to a batch's longest document would make a document's ids depend on its map task);
BOS and EOS are added here by the recipe's policy, so the result never depends on how a
tokenizer file happens to configure its template. A tokenizer's identity stays its file's
SHA-256. Called from map tasks on worker threads
(``encode_batch_fast`` releases the GIL and runs in Rust).

A valid tokenizer may still not fit the data: one whose vocabulary lacks the text's characters
maps it to its unknown token. :meth:`TokenizerHandle.check_unknown` looks at the first
``UNKNOWN_SAMPLE`` tokens of each source and logs a warning (logger ``datalane.engine``) naming
the source, the share and the token when most of them are the unknown one. It never changes
the tokens.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from datalane.engine.files import read_bytes
from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.recipe import TokenizerSpec

__all__ = ["UNKNOWN_SAMPLE", "TokenizerHandle"]

log = logging.getLogger("datalane.engine")

UNKNOWN_SAMPLE = 4096  # tokens of a source that check_unknown judges it by
UNKNOWN_WARN_SHARE = 0.5  # ... and the share of unknown tokens among them that it warns of


@dataclass
class TokenizerHandle:
    """A loaded tokenizer with its content hash and special-token ids."""

    spec: TokenizerSpec
    sha256: str
    tokenizer: Any
    bos_id: int | None
    eos_id: int | None
    pad_id: int
    unk_id: int | None = None  # the model's unknown token (None: a model without one)
    _unknown: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False,
                                                 compare=False)  # source: (tokens, unknown)
    _unknown_lock: threading.Lock = field(default_factory=threading.Lock, repr=False,
                                          compare=False)

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
        # A file's "padding" block would pad every document of a batch to its longest, and
        # "truncation" cut them: a document's tokens would depend on which map task (cut by
        # timing) it was encoded in. Documents are never padded or cut here; the packers do it.
        tok.no_padding()
        tok.no_truncation()

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
        unk_name = getattr(tok.model, "unk_token", None)
        unk = tok.token_to_id(unk_name) if isinstance(unk_name, str) else None
        return cls(spec, digest, tok, bos, eos, pad, None if unk is None else int(unk))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a plan sent to a sidecar's rank worker) without its lock; the unknown-token
        counts start again where it is loaded, as they would in a new process."""
        state = self.__dict__.copy()
        del state["_unknown_lock"]
        state["_unknown"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._unknown_lock = threading.Lock()

    def check_unknown(self, tokens: np.ndarray, source: str) -> None:
        """Count the unknown tokens among ``tokens`` (a batch of ``source``'s documents, BOS
        and EOS excluded) until the source's first ``UNKNOWN_SAMPLE`` tokens were seen; warn
        once if most of those are the unknown token. Called from map tasks on worker
        threads."""
        if self.unk_id is None or not source:
            return
        if self._unknown.get(source, (0, 0))[0] >= UNKNOWN_SAMPLE:
            return  # judged already: no lock on every later map task
        with self._unknown_lock:
            seen, unknown = self._unknown.get(source, (0, 0))
            if seen >= UNKNOWN_SAMPLE:
                return
            seen += int(tokens.size)
            unknown += int(np.count_nonzero(tokens == self.unk_id))
            self._unknown[source] = (seen, unknown)
        if seen >= UNKNOWN_SAMPLE and unknown > UNKNOWN_WARN_SHARE * seen:
            name = self.tokenizer.id_to_token(self.unk_id)
            log.warning("source %r: %d of its first %d tokens (%.0f%%) are the unknown token "
                        "%r (id %d): the tokenizer %s does not cover this text; is it the "
                        "right tokenizer.json for the data?", source, unknown, seen,
                        100 * unknown / seen, name, self.unk_id, self.spec.uri)

    def encode(self, texts: list[str], source: str = "",
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Encode a batch: ``(tokens, offsets, raw_lengths)``.

        ``tokens[offsets[i]:offsets[i+1]]`` is document ``i`` with BOS/EOS applied;
        ``raw_lengths[i]`` counts its tokens without them (what token filters see).
        ``source`` names the documents' source for :meth:`check_unknown` ("": unchecked).
        """
        encs = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        n = len(encs)
        lens = np.fromiter((len(e) for e in encs), dtype=np.int64, count=n)
        total = int(lens.sum())
        flat = np.fromiter(chain.from_iterable([e.ids for e in encs]), dtype=np.int32,
                           count=total)
        self.check_unknown(flat, source)
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
