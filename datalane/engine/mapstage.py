"""The stateless map stages of a lane: decode, render, filter, tokenize.

The stages of docs/architecture.md, One lane.

A map task takes a slice of raw records (already in shuffled order) and returns, for each,
either its token columns or the reason it was set aside. The record's *format* decodes the
field's value (:mod:`datalane.engine.formats`), the source's *document kind* renders it
(plain text, a chat conversation: :mod:`datalane.engine.documents`), the filters look at the
rendered text, and the kind tokenizes the kept documents in one batch. A kind that draws at
random per document (``keyed``: image augmentation) is given each record's
:class:`~datalane.engine.documents.base.DocKey` (the stage's seed and source, the lane the task
is run for, the record's file and position). Tasks run on any worker thread in any order; the
results are consumed in order by :mod:`datalane.engine.docstream`, which is where counters are
kept and where the ``fail`` policy raises, so both are deterministic. A predicate is imported
only once the code policy (:mod:`datalane.spec.codepolicy`) allows its module.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from datalane.engine.documents.base import Attached, DocKey, DocumentKind, Rendered, Tokenized
from datalane.engine.documents.text import TextKind
from datalane.engine.formats import FORMATS, Format
from datalane.engine.formats.base import Decoded, TooLarge
from datalane.engine.tokenrecords import TokenRecords
from datalane.spec.codepolicy import CodePolicy
from datalane.spec.errors import ConfigError
from datalane.spec.limits import TOO_LARGE
from datalane.spec.recipe import Filters
from datalane.spec.schema import Column

__all__ = ["ALWAYS_FAIL", "BAD_RECORD_REASONS", "MapResult", "MapStage", "Record"]

#: Reasons the built-in formats and plain text give for a malformed record (the
#: ``bad_records`` policy applies to them); a stage's own set adds its kind's reasons.
BAD_RECORD_REASONS = frozenset().union({TOO_LARGE}, TextKind.bad_reasons,
                                       *(f.bad_reasons for f in FORMATS.values()))

#: Reasons that stop the stream whatever the policy: a bug in user code is not bad data.
ALWAYS_FAIL = frozenset({"predicate_error"})

Record = tuple[int, int, Any]  # (file index, position, raw value)


def _decode(fmt: Format, raw: Any, field: str) -> Decoded:
    """The field's value in a raw record; a record its reader found too large to hold is a bad
    record of reason ``too_large`` in every format."""
    if isinstance(raw, TooLarge):
        return None, TOO_LARGE, raw.detail
    return fmt.decode(raw, field)


@dataclass
class MapResult:
    """Token columns of a slice of records; ``status[i]`` is None for kept documents.

    ``columns[name][offsets[i]:offsets[i+1]]`` is record ``i``'s column ``name`` (empty for
    records set aside), for every document column of the recipe's schema."""

    columns: dict[str, np.ndarray]
    offsets: np.ndarray
    status: list[str | None]
    detail: list[str | None]
    # computed on the worker too, for the ordered thread: ``offsets`` as Python ints, and the
    # indexes of the records set aside (status not None), ascending
    bounds: list[int]
    set_aside: list[int]
    #: a kind that ``attaches``: each record's attachments (vision: its image's patches at
    #: its first placeholder), None for records set aside; None for other kinds
    attached: list[tuple[Attached, ...] | None] | None = None
    #: with ``attached``: the bytes the attachments of records ``0 .. i - 1`` hold, at ``i``
    #: (n + 1 prefix sums: what the stream weighs against the ``image_bytes`` knob)
    attached_bytes: list[int] | None = None

    @property
    def tokens(self) -> np.ndarray:
        return self.columns["input_ids"]


def _load_predicate(path: str, policy: CodePolicy) -> Callable[[str], bool]:
    policy.check("filters.predicate", path)  # before anything is imported
    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"filters.predicate {path!r} cannot be imported: {e}") from e
    if not callable(fn):
        raise ConfigError(f"filters.predicate {path!r} is not callable")
    return fn  # type: ignore[no-any-return]

_TEXT_COLUMNS = (Column("input_ids", "int32", 0),)


class MapStage:
    """Decode + render + filter + tokenize for one source; thread-safe and stateless."""

    def __init__(self, field: str, filters: Filters, kind: DocumentKind,
                 columns: Sequence[Column] = _TEXT_COLUMNS,
                 policy: CodePolicy | None = None, longest: int | None = None,
                 seed: int = 0, source: str = "") -> None:
        """``longest``: a kind whose documents are never split (vision) sets a document of
        more tokens aside as ``too_long`` (a sequence's tokens, seq_len + 1). ``seed`` and
        ``source`` (the recipe's seed, the source's name) begin each record's
        :class:`DocKey` for a ``keyed`` kind."""
        self.field = field
        self.seed = seed
        self.source = source
        self.longest = longest
        self.filters = filters
        self.kind = kind
        self.columns = tuple(columns)  # the schema's document columns, input_ids first
        self.predicate = (_load_predicate(filters.predicate, policy or CodePolicy())
                          if filters.predicate else None)
        self.bad_reasons = kind.bad_reasons | BAD_RECORD_REASONS
        #: the most bytes a kept document's attachments hold (a kind that attaches and keeps
        #: documents whole: a sequence's tokens bound them); None: not weighed
        self.most_attached_bytes = (kind.most_attached_bytes(longest)
                                    if kind.attaches and longest is not None else None)
        self.has_text = kind.has_text
        # a kind that can check and tokenize a whole task's values at once, falling back to
        # one record at a time when any value is bad (pre-tokenized ids)
        self._whole: Callable[[list[Any]], Tokenized | None] | None = (
            kind.tokenize_values if kind.tokenizes_values else None)

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

    def run(self, records: Sequence[Record], formats: Sequence[Format], lane: int = 0,
            ) -> MapResult:
        """Map a slice of records of lane ``lane``; ``formats[file]`` is the format of each
        file."""
        n = len(records)
        status: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        docs: list[Rendered] = []
        keep: list[int]
        got: Tokenized | None = None
        if self._whole is not None:  # a kind that checks a whole task at once (token ids)
            if isinstance(records, TokenRecords):
                got = self.kind.tokenize_span(*records.tokens())  # (ids end to end: at once)
            if got is None:
                got = self._whole_values(records, formats)
            if got is not None:
                keep = list(range(n))
        if got is None:
            keep = self._render(records, formats, status, detail, docs, lane)
        result = self._finish(n, keep, got, docs, status, detail)
        if self.kind.attaches:
            attached: list[tuple[Attached, ...] | None] = [None] * n
            ids, at = result.columns["input_ids"], result.offsets
            held = [0] * (n + 1)
            for k, i in enumerate(keep):
                if status[i] is None:
                    got_attached = self.kind.attach(docs[k], ids[at[i]:at[i + 1]])
                    attached[i] = got_attached
                    held[i + 1] = self.kind.attached_bytes(got_attached)
            result.attached = attached
            result.attached_bytes = list(itertools.accumulate(held))
        return result

    def _whole_values(self, records: Sequence[Record],
                      formats: Sequence[Format]) -> Tokenized | None:
        """The kind's whole-task tokens of the records' decoded values, or None: a value is
        bad, or one does not decode (mapped one record at a time, which names it)."""
        assert self._whole is not None
        if all(formats[f].passes_arrays for f in {file for file, _, _ in records}):
            # the raw records are the values if they are all arrays (the kind checks that;
            # any other raw, a TooLarge, None, is mapped one record at a time)
            return self._whole([raw for _, _, raw in records])
        values = []
        for file, _, raw in records:
            value, reason, _ = _decode(formats[file], raw, self.field)
            if reason is not None:
                return None
            values.append(value)
        return self._whole(values)

    def _render(self, records: Sequence[Record], formats: Sequence[Format],
                status: list[str | None], detail: list[str | None],
                docs: list[Rendered], lane: int) -> list[int]:
        """Decode, render and filter record by record; the indexes of the documents kept."""
        keep: list[int] = []
        keyed = self.kind.keyed
        for i, (file, pos, raw) in enumerate(records):
            value, reason, why = _decode(formats[file], raw, self.field)
            doc = None
            if reason is None:
                doc, reason, why = self.kind.render(value, DocKey(
                    self.seed, lane, self.source, file, pos) if keyed else None)
            if doc is not None and self.has_text:
                reason = self._char_filter(doc.text)
                if reason is not None and reason.startswith("predicate_error:"):
                    reason, why = "predicate_error", (
                        f"filters.predicate {self.filters.predicate!r} raised "
                        f"{reason.split(':', 1)[1].strip()}")
            if reason is not None or doc is None:
                status[i], detail[i] = reason, why
                continue
            if self.most_attached_bytes is not None:  # a too-long document's images go now
                doc = self.kind.lighten(doc, self.most_attached_bytes)
            docs.append(doc)
            keep.append(i)
        return keep

    def _finish(self, n: int, keep: list[int], got: Tokenized | None, docs: list[Rendered],
                status: list[str | None], detail: list[str | None]) -> MapResult:
        """Token filters and the flat columns of the kept documents."""
        lengths = np.zeros(n, dtype=np.int64)
        columns: dict[str, np.ndarray]
        if got is None and docs:
            got = self.kind.tokenize(docs)
        if got is not None:
            got_columns, offs, raw_lens = got
            f = self.filters
            doc_lens = np.diff(offs)
            # the documents a token filter may set aside, found at once; each then looked at
            # (the first reason that applies, in this order)
            flagged = np.asarray(raw_lens) < max(f.min_tokens, 1)
            if f.max_tokens is not None:
                flagged |= np.asarray(raw_lens) > f.max_tokens
            if self.longest is not None:
                flagged |= doc_lens > self.longest
            for k in np.flatnonzero(flagged).tolist():
                i = keep[k]
                length = int(raw_lens[k])
                if length == 0:
                    status[i] = "empty_tokens"
                elif length < f.min_tokens:
                    status[i] = "min_tokens"
                elif f.max_tokens is not None and length > f.max_tokens:
                    status[i] = "max_tokens"
                elif self.longest is not None and int(offs[k + 1] - offs[k]) > self.longest:
                    status[i] = "too_long"
                    detail[i] = (f"the document's {int(offs[k + 1] - offs[k])} tokens do not "
                                 f"fit a sequence of {self.longest}, and its kind's documents "
                                 f"are never split")
            kept = ~flagged  # (every record in keep had no status before the token filters)
            columns = {}
            for c in self.columns:
                flat = got_columns.get(c.name)
                if flat is None:  # a column this kind does not fill: its default
                    flat = np.full(int(offs[-1]), c.default, dtype=c.np_dtype)
                if not kept.all():
                    starts = offs[:-1][kept]
                    pieces = [flat[s:s + ln] for s, ln in zip(starts, doc_lens[kept],
                                                              strict=True)]
                    flat = np.concatenate(pieces) if pieces else np.zeros(0, c.np_dtype)
                columns[c.name] = flat
            if len(keep) == n and not flagged.any():
                lengths = doc_lens
            else:
                lengths[np.array(keep, dtype=np.int64)[kept]] = doc_lens[kept]
        else:
            columns = {c.name: np.zeros(0, dtype=c.np_dtype) for c in self.columns}
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return MapResult(columns, offsets, status, detail, offsets.tolist(),
                         [i for i, reason in enumerate(status) if reason is not None])
