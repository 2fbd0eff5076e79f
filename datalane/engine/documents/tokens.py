"""Pre-tokenized documents: the field value is the document's token ids, used as they are.

The value a format decodes is a 1-D integer numpy array (Megatron, flatbin, Parquet integer
list columns) or a list of integers (JSONL). :class:`TokensKind` checks it - a sequence of
integers, every one in ``[0, V)`` where ``V`` is the recipe tokenizer's id space (one more than
its largest id, added tokens included) - and passes it on; ``tokenize`` only concatenates the
documents of a map task into ``int32`` (adding BOS / EOS when ``tokens.add_bos`` /
``add_eos`` say so). No tokenizer runs on the hot path. The documents have no text
(``has_text = False``): character filters and predicates do not apply, token filters do.

**Bad records** (the recipe's ``bad_records`` policy applies): ``not_tokens`` (not a flat
sequence of integers: a string, floats, nested lists, nulls inside), ``token_out_of_range``
(an id outside the vocabulary; the detail names the id and its index), ``empty_ids`` (no ids
at all).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from datalane.engine.documents.base import DocKey, KindBase, Rendered, Tokenized
from datalane.engine.formats.base import MISSING
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.errors import ConfigError
from datalane.spec.schema import Column
from datalane.spec.tokens import TokensSpec

__all__ = ["TokensKind", "check_ids"]

_UNSIGNED: dict[int, np.dtype[Any]] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16),
                                     4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def check_ids(value: Any, vocab: int, field: str) -> tuple[np.ndarray | None, str, str]:
    """``(ids, "", "")`` for a valid document, else ``(None, reason, detail)``."""
    if value is MISSING or value is None:
        return None, "not_tokens", f"no value in field {field!r}"
    if isinstance(value, np.ndarray):
        ids = value
    elif isinstance(value, (list, tuple)):
        if not value:
            return None, "empty_ids", f"field {field!r} holds no token ids"
        if not all(type(v) is int for v in value):  # bool, float, str, None, nested lists
            bad = next(v for v in value if type(v) is not int)
            what = "null" if bad is None else type(bad).__name__
            return None, "not_tokens", (f"field {field!r} holds a {what} among its token "
                                        f"ids, not only integers")
        try:
            ids = np.array(value, dtype=np.int64)
        except OverflowError:
            big = next(i for i, v in enumerate(value) if not -(1 << 63) <= v < 1 << 63)
            return None, "token_out_of_range", (
                f"token id {value[big]} at index {big} is outside the vocabulary [0, {vocab}) "
                f"of the tokenizer")
    else:
        return None, "not_tokens", (f"field {field!r} holds {type(value).__name__}, not a "
                                    f"list of token ids")
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        return None, "not_tokens", (f"field {field!r} holds a {ids.dtype} array of shape "
                                    f"{ids.shape}, not a list of integer token ids")
    if len(ids) == 0:
        return None, "empty_ids", f"field {field!r} holds no token ids"
    # one pass: a negative id read as unsigned is larger than any vocabulary
    flat = ids if ids.dtype.kind == "u" else ids.view(_UNSIGNED[ids.dtype.itemsize])
    if int(flat.max()) >= vocab:
        at = int(np.flatnonzero(flat >= vocab)[0])
        return None, "token_out_of_range", (
            f"token id {int(ids[at])} at index {at} is outside the vocabulary [0, {vocab}) of "
            f"the tokenizer")
    return ids, "", ""


def _widened(values: list[np.ndarray], dtype: np.dtype[Any]) -> np.ndarray:
    """``values`` (1-D arrays of ``dtype``) joined and widened to int32.

    The join is one copy that keeps the interpreter lock: ``np.concatenate`` gives it up and
    takes it back for every document of 500 ids or more, and every thread of the process waits
    behind that churn. Nothing is looked at per value (a map task holds hundreds): the join
    itself refuses a strided one."""
    try:
        joined = bytearray().join([v.data for v in values])  # (writable: no copy for int32)
    except TypeError:  # a value that is not contiguous
        return np.concatenate(values, dtype=np.int32)
    return np.frombuffer(joined, dtype=dtype).astype(np.int32, copy=False)


class TokensKind(KindBase):
    """The field value is the document's token ids; thread-safe, stateless."""

    columns: tuple[Column, ...] = ()
    bad_reasons = frozenset({"not_tokens", "token_out_of_range", "empty_ids"})
    has_text = False
    tokenizes_values = True

    def __init__(self, spec: TokensSpec, tokenizer: TokenizerHandle, where: str = "tokens") -> None:
        self.spec = spec
        self.field = spec.field
        tok = tokenizer.tokenizer
        self.vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1

        def token(flag: str, name: str) -> int:
            tid = tok.token_to_id(name)
            if tid is None:
                raise ConfigError(f"{where}.{flag} adds {name!r}, which is not in the "
                                  f"vocabulary of {tokenizer.spec.uri}")
            return int(tid)

        ts = tokenizer.spec
        self.bos_id = token("add_bos", ts.bos_token) if spec.add_bos else None
        self.eos_id = token("add_eos", ts.eos_token) if spec.add_eos else None

    def render(self, value: Any, key: DocKey | None = None,
               ) -> tuple[Rendered | None, str | None, str | None]:
        ids, reason, detail = check_ids(value, self.vocab_size, self.field)
        if ids is None:
            return None, reason, detail
        return Rendered("", None, ids), None, None

    def tokenize(self, docs: list[Rendered]) -> Tokenized:
        return self._concat([d.value for d in docs])

    def tokenize_values(self, values: list[Any]) -> Tokenized | None:
        """Check and concatenate a whole map task's values at once (the common case: every
        value a non-empty 1-D integer array, every id in range), or None when any value is
        not, so that the caller maps the records one at a time and names the bad ones."""
        if not values or set(map(type, values)) != {np.ndarray}:
            return None
        kinds = {(v.dtype, v.ndim) for v in values}
        # 1-D ids of one integer type that int32 holds (token files: uint16, uint32 not):
        # joined and widened in one pass, then checked
        one = kinds.pop()[0] if len(kinds) == 1 and values[0].ndim == 1 else None
        wide = (one is not None and one.kind in "iu" and np.can_cast(one, np.int32, "safe")
                and self.bos_id is None and self.eos_id is None)
        try:  # a 0-d array has no length; arrays of other ranks do not join 1-D ones
            lens = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
            if wide:
                flat = _widened(values, values[0].dtype)
            else:
                flat = np.concatenate(values) if len(values) > 1 else values[0]
        except (TypeError, ValueError):
            return None
        # one dtype over them all: a mix of signed and unsigned ids, or a float array, is no
        # longer an integer kind
        if flat.ndim != 1 or flat.dtype.kind not in "iu":
            return None
        unsigned = wide and one is not None and one.kind == "u"  # (widened: no id below 0)
        if not self._ids_fit(flat, lens, unsigned):
            return None
        if wide:
            offsets = np.zeros(len(values) + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            return {"input_ids": flat}, offsets, lens
        return self._concat(values, flat, lens)

    def tokenize_span(self, ids: np.ndarray, lens: np.ndarray) -> Tokenized | None:
        """:meth:`tokenize_values` of values laid end to end (a block of a token file read
        as arrays), in whole-array steps: the common case only (ids int32 holds, no BOS or
        EOS added, no empty value, every id in range); None for anything else."""
        if (not len(lens) or ids.ndim != 1 or ids.dtype.kind not in "iu"
                or not np.can_cast(ids.dtype, np.int32, "safe")
                or self.bos_id is not None or self.eos_id is not None
                or not self._ids_fit(ids, lens, False)):
            return None
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        return {"input_ids": ids.astype(np.int32)}, offsets, lens

    def _ids_fit(self, ids: np.ndarray, lens: np.ndarray, unsigned: bool) -> bool:
        """No value empty and every id (integers, end to end) in ``[0, V)``; ``unsigned``:
        none can be below 0 (widened from an unsigned type), so that pass is skipped."""
        return not (int(lens.min()) == 0
                    or (ids.dtype.kind == "i" and not unsigned and int(ids.min()) < 0)
                    or int(ids.max()) >= self.vocab_size)

    def _concat(self, values: list[Any], flat: np.ndarray | None = None,
                lens: np.ndarray | None = None) -> Tokenized:
        n = len(values)
        if lens is None:
            lens = np.fromiter((len(v) for v in values), dtype=np.int64, count=n)
        extra = (self.bos_id is not None) + (self.eos_id is not None)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens + extra, out=offsets[1:])
        if not extra:
            if flat is not None:
                return {"input_ids": flat.astype(np.int32)}, offsets, lens
            if n == 1:
                return {"input_ids": values[0].astype(np.int32)}, offsets, lens
            flat = np.concatenate(values, dtype=np.int32, casting="unsafe")
            return {"input_ids": flat}, offsets, lens
        out = np.empty(int(offsets[-1]), dtype=np.int32)
        head = 1 if self.bos_id is not None else 0
        for k, v in enumerate(values):
            lo = int(offsets[k])
            out[lo + head:lo + head + len(v)] = v
        if self.bos_id is not None:
            out[offsets[:-1]] = self.bos_id
        if self.eos_id is not None:
            out[offsets[1:] - 1] = self.eos_id
        return {"input_ids": out}, offsets, lens


KIND = TokensKind
