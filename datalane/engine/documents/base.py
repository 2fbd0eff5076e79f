"""The document-kind seam: what a source's field value becomes on its way to tokens.

A :class:`DocumentKind` turns the value a format decoded from one record (plain text, a list
of chat messages, ...) into a :class:`Rendered` document (the text filters and predicates
see) and then, a batch at a time on worker threads, into token columns: ``input_ids`` and
the kind's own columns (chat: ``loss_mask``). Kinds are listed in
:mod:`datalane.engine.documents`; a recipe's sample schema is the text columns plus every
column of the kinds its sources use. A kind is declared by its configuration field of
:class:`~datalane.spec.recipe.Source` (:func:`datalane.spec.recipe.document_kinds`) and
implemented by the class ``KIND`` of ``datalane.engine.documents.<name>``, a
:class:`KindBase`. A :class:`Doc` is one kept document on its way to the
packer, with the reference its format defines, so a packer's carry-over can name it, and
what it carries beside its tokens (:class:`Attached`: vision, its image's patches at the offset
of its first placeholder), which packers pass on without looking inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from datalane.spec.schema import Column
from datalane.spec.visioncontract import VisionContract

__all__ = ["LOSS_MASK", "Attached", "Doc", "DocKey", "DocumentKind", "KindBase", "Rendered",
           "Run", "Tokenized"]

#: The loss-mask column (chat, vision): 1 where the trainer learns the token. Documents of
#: other kinds in the same recipe get the default 1 (trained on every token); padding gets 0.
LOSS_MASK = Column("loss_mask", "uint8", pad=0, default=1)

Tokenized = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]
"""``(flat columns, offsets (n+1,), raw lengths (n,))``: document ``i`` is
``columns[name][offsets[i]:offsets[i+1]]``; its raw length (what token filters see) leaves
out the special tokens the kind added around it."""


class Rendered(NamedTuple):
    """A document ready to tokenize."""

    text: str  # what character filters and predicates see
    spans: tuple[tuple[int, int], ...] | None = None  # kind-specific (chat: trained spans)
    value: Any = None  # kind-specific payload (pre-tokenized documents: the token ids)


class DocKey(NamedTuple):
    """Where a record is, for the random draws a kind makes per document (an image's crop and
    flip): the recipe's seed, the lane reading it, its source's name and the record's file
    index and position in that file. Each is fixed by the recipe and its files alone, never by
    the world size, the worker count, the map task a record falls in or a restore: a packer's
    carry-over names a document by (source, file, position) and the lane that held it re-reads
    it with the same key. The epoch is not in it, for that reason: a record read again in a
    later epoch draws the same unless another lane reads it then (chunks are dealt to lanes
    anew each epoch)."""

    seed: int
    lane: int
    source: str
    file: int
    position: int


class DocumentKind(Protocol):
    """Renders field values and tokenizes rendered documents; thread-safe, stateless."""

    columns: tuple[Column, ...]  # columns beyond input_ids/positions that the kind fills
    bad_reasons: frozenset[str]  # reasons of render() that are bad records (policy applies)
    #: False for a kind whose documents have no text (pre-tokenized ids): the character
    #: filters and the predicate then do not apply to it (token filters do)
    has_text: bool
    #: whether :meth:`tokenize_values` checks and tokenizes a whole task's values at once
    tokenizes_values: bool
    #: whether a rendered document carries :meth:`attach` ments to the packer (kept with the
    #: map result, one tuple per document: :attr:`MapResult.attached`)
    attaches: bool
    #: a kind that renders images: the vision tokens' ids and the patch rule a trainer needs
    #: to build its model's batch (the schema carries it: spec.visioncontract); else None
    vision: VisionContract | None
    #: whether :meth:`render` draws from each record's :class:`DocKey` (an augmenting image
    #: kind); the map stage builds the keys only for such a kind
    keyed: bool

    def identity(self) -> dict[str, Any]:
        """What the fingerprint must cover beyond the recipe (a template's hash); {} if none."""
        ...

    def render(self, value: Any, key: DocKey | None = None,
               ) -> tuple[Rendered | None, str | None, str | None]:
        """``(rendered, None, None)``, or ``(None, reason, detail)`` when there is none;
        ``key`` is where the record is (given when the kind is ``keyed``)."""
        ...

    def tokenize(self, docs: list[Rendered]) -> Tokenized:
        ...

    def attach(self, doc: Rendered, ids: np.ndarray) -> tuple[Attached, ...]:
        """What the tokenized ``doc`` carries beside its tokens (only if ``attaches``);
        ``ids`` are its token ids, so offsets are found where the tokens put them."""
        ...

    def tokenize_values(self, values: list[Any]) -> Tokenized | None:
        """A whole task's decoded values as tokens at once, or None when any value is bad (the
        map stage then renders them one record at a time); only if ``tokenizes_values``."""
        ...

    def tokenize_span(self, ids: np.ndarray, lens: np.ndarray) -> Tokenized | None:
        """:meth:`tokenize_values` of values laid end to end in ``ids`` (``lens``: each one's
        length), or None: ask :meth:`tokenize_values` (:mod:`datalane.engine.tokenrecords`)."""
        ...

    def attached_bytes(self, attached: tuple[Attached, ...]) -> int:
        """The bytes a document's attachments hold (what the ``image_bytes`` knob weighs)."""
        ...

    def most_attached_bytes(self, tokens: int) -> int:
        """The most bytes the attachments of a document of ``tokens`` tokens can hold."""
        ...

    def lighten(self, doc: Rendered, most: int) -> Rendered:
        """``doc`` without the bytes of its payload when it holds more than ``most`` of them
        (more than a document of the most tokens the map stage keeps can hold: it is set aside
        after tokenizing, which needs only its token counts); otherwise ``doc`` itself."""
        ...


class KindBase:
    """The defaults of :class:`DocumentKind`'s optional parts: documents with text, rendered
    and tokenized a record at a time, no identity beyond the recipe."""

    columns: tuple[Column, ...] = ()
    has_text: bool = True
    tokenizes_values: bool = False
    attaches: bool = False
    vision: VisionContract | None = None
    keyed: bool = False

    def identity(self) -> dict[str, Any]:
        return {}

    def attach(self, doc: Rendered, ids: np.ndarray) -> tuple[Attached, ...]:
        return ()

    def tokenize_values(self, values: list[Any]) -> Tokenized | None:
        return None

    def tokenize_span(self, ids: np.ndarray, lens: np.ndarray) -> Tokenized | None:
        return None

    def attached_bytes(self, attached: tuple[Attached, ...]) -> int:
        return 0

    def most_attached_bytes(self, tokens: int) -> int:
        return 0

    def lighten(self, doc: Rendered, most: int) -> Rendered:
        return doc


@dataclass(frozen=True, slots=True)
class Attached:
    """Something a document carries beside its tokens, tied to the token at ``offset`` of the
    document (vision: the image's :class:`~datalane.engine.images.Patches`, at its first
    placeholder token). Packers carry it opaquely with the document's pieces; the piece that
    holds the token places it in its sequence (:func:`datalane.engine.packers.base.assemble`)."""

    offset: int  # token index in the document
    value: Any


@dataclass(frozen=True, slots=True)
class Doc:
    """A kept document: its source, the reference its format defines, its columns, and what
    it carries beside them (a kind that ``attaches``; re-read with the document on restore)."""

    source: int
    ref: tuple[int, ...]  # JSONL and Parquet: (file index, byte offset or row)
    columns: tuple[np.ndarray, ...]  # schema.document_columns() order; input_ids first
    attached: tuple[Attached, ...] = ()

    def __len__(self) -> int:
        return len(self.columns[0])

    def slice(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
        return tuple(c[start:stop] for c in self.columns)


@dataclass(slots=True)
class Run:
    """Consecutive kept documents of one source, as flat columns (packing in bulk).

    Document ``k`` is ``columns[c][offsets[k]:offsets[k+1]]``; ``offsets`` may repeat a value
    (a record set aside between two documents adds no token). ``last_ref`` is the reference
    of the last document, the one a packer may have to carry over. Not frozen, though never
    changed: the ordered thread makes about one per window, and a frozen dataclass's
    ``__init__`` costs several times a plain one's."""

    source: int
    columns: tuple[np.ndarray, ...]  # schema.document_columns() order; input_ids first
    offsets: Sequence[int]  # starts at 0, ends at the run's token count
    docs: int
    last_ref: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.columns[0])
