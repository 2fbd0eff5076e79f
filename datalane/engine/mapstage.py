"""The stateless map stages of a lane: decode, filter, tokenize (DESIGN section 3.3).

A map task takes a slice of raw records (already in shuffled order) and returns, for each,
either its tokens or the reason it was set aside. Tasks run on any worker thread in any order;
the results are consumed in order by :mod:`datalane.engine.docstream`, which is where counters
are kept and where the ``fail`` policy raises, so both are deterministic.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from datalane.engine.chunks import MISSING
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.errors import ConfigError
from datalane.spec.recipe import Filters

__all__ = ["BAD_RECORD_REASONS", "MapResult", "MapStage", "Record"]

#: Reasons a record is malformed (``bad_records`` policy applies); other reasons are filters.
BAD_RECORD_REASONS = frozenset(
    {"malformed_json", "non_utf8", "missing_field", "not_text", "empty_text"})

#: Reasons that stop the stream whatever the policy: a bug in user code is not bad data.
ALWAYS_FAIL = frozenset({"predicate_error"})

Record = tuple[int, int, Any]  # (file index, position, raw value)


@dataclass
class MapResult:
    """Tokens of a slice of records; ``status[i]`` is None for kept documents."""

    tokens: np.ndarray
    offsets: np.ndarray
    status: list[str | None]
    detail: list[str | None]


def _load_predicate(path: str) -> Callable[[str], bool]:
    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"filters.predicate {path!r} cannot be imported: {e}") from e
    if not callable(fn):
        raise ConfigError(f"filters.predicate {path!r} is not callable")
    return fn  # type: ignore[no-any-return]


class MapStage:
    """Decode + filter + tokenize for one source; thread-safe and stateless."""

    def __init__(self, text_field: str, filters: Filters, tokenizer: TokenizerHandle) -> None:
        self.field = text_field
        self.filters = filters
        self.tokenizer = tokenizer
        self.predicate = _load_predicate(filters.predicate) if filters.predicate else None

    def decode(self, raw: Any) -> tuple[str | None, str | None, str | None]:
        """``(text, reason, detail)``: the text, or why there is none."""
        if raw is MISSING or raw is None:
            return None, "missing_field", f"no value in field {self.field!r}"
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return None, "non_utf8", f"invalid UTF-8 at byte {e.start} of the value"
        if not isinstance(raw, str):
            return None, "not_text", f"field {self.field!r} holds {type(raw).__name__}"
        if not raw:
            return None, "empty_text", f"field {self.field!r} is empty"
        return raw, None, None

    def _decode_json(self, line: bytes) -> tuple[str | None, str | None, str | None]:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, "non_utf8", f"invalid UTF-8 at byte {e.start} of the line"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            return None, "malformed_json", f"malformed JSON ({e.msg}: column {e.colno})"
        if not isinstance(obj, dict):
            return None, "malformed_json", f"a JSON {type(obj).__name__}, not an object"
        if self.field not in obj or obj[self.field] is None:
            return None, "missing_field", f"no field {self.field!r}"
        value = obj[self.field]
        if not isinstance(value, str):
            return None, "not_text", f"field {self.field!r} holds {type(value).__name__}"
        if not value:
            return None, "empty_text", f"field {self.field!r} is empty"
        return value, None, None

    def _char_filter(self, text: str) -> str | None:
        f = self.filters
        if len(text) < f.min_chars:
            return "min_chars"
        if f.max_chars is not None and len(text) > f.max_chars:
            return "max_chars"
        if self.predicate is not None:
            try:
                keep = self.predicate(text)
            except Exception as e:  # user code: reported with the record, never swallowed
                return f"predicate_error:{type(e).__name__}: {e}"
            if not keep:
                return "predicate"
        return None

    def run(self, records: list[Record], jsonl: list[bool]) -> MapResult:
        """Map a slice of records; ``jsonl[file]`` says whether a file's records are lines."""
        n = len(records)
        status: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        texts: list[str] = []
        keep: list[int] = []
        for i, (file, _, raw) in enumerate(records):
            if jsonl[file]:
                text, reason, why = self._decode_json(raw)
            else:
                text, reason, why = self.decode(raw)
            if text is not None:
                reason = self._char_filter(text)
                if reason is not None and reason.startswith("predicate_error:"):
                    reason, why = "predicate_error", (
                        f"filters.predicate {self.filters.predicate!r} raised "
                        f"{reason.split(':', 1)[1].strip()}")
            if reason is not None or text is None:
                status[i], detail[i] = reason, why
                continue
            texts.append(text)
            keep.append(i)
        lengths = np.zeros(n, dtype=np.int64)
        if texts:
            flat, offs, raw_lens = self.tokenizer.encode(texts)
            f = self.filters
            for k, i in enumerate(keep):
                length = int(raw_lens[k])
                if length == 0:
                    status[i] = "empty_tokens"
                elif length < f.min_tokens:
                    status[i] = "min_tokens"
                elif f.max_tokens is not None and length > f.max_tokens:
                    status[i] = "max_tokens"
            kept = np.array([status[i] is None for i in keep], dtype=bool)
            doc_lens = np.diff(offs)
            if not kept.all():
                starts = offs[:-1][kept]
                pieces = [flat[s:s + ln] for s, ln in zip(starts, doc_lens[kept], strict=True)]
                flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
            lengths[np.array(keep, dtype=np.int64)[kept]] = doc_lens[kept]
        else:
            flat = np.zeros(0, dtype=np.int32)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return MapResult(flat, offsets, status, detail)
