"""Plain text documents: the field holds a string (or UTF-8 bytes), tokenized as is.

BOS and EOS are added by the recipe's ``tokenizer.add_bos`` / ``add_eos`` (see
:mod:`datalane.engine.tokenize`); a text document has no columns of its own.
"""

from __future__ import annotations

from typing import Any

from datalane.engine.documents.base import DocKey, KindBase, Rendered, Tokenized
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.schema import Column

__all__ = ["TextKind", "text_value", "unencodable"]


def unencodable(text: str) -> str | None:
    """Why ``text`` is no Unicode text a tokenizer takes (a lone surrogate, as JSON's
    ``\\udc80`` escapes make), or None. Tokenizers refuse such text for the whole batch.
    ASCII text (a flag of the string: no scan) is answered without encoding it."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds the lone surrogate U+{ord(text[e.start]):04X} at character {e.start}"
    return None


def text_value(value: Any, label: str) -> tuple[str | None, str, str]:
    """``(text, "", "")`` for a string or UTF-8 bytes a tokenizer takes, else ``(None, reason,
    detail)`` (``non_utf8``, ``not_text``, ``invalid_unicode``), ``label`` naming the value in
    the detail (``field 'text'``). Callers: the text and vision kinds."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, "non_utf8", f"invalid UTF-8 at byte {e.start} of the value"
    if not isinstance(value, str):
        return None, "not_text", f"{label} holds {type(value).__name__}"
    if (problem := unencodable(value)) is not None:
        return None, "invalid_unicode", f"{label} {problem}"
    return value, "", ""


class TextKind(KindBase):
    """The field value is the document's text."""

    columns: tuple[Column, ...] = ()
    bad_reasons = frozenset({"non_utf8", "not_text", "empty_text", "invalid_unicode"})

    def __init__(self, tokenizer: TokenizerHandle, field: str = "text", source: str = "",
                 ) -> None:
        self.tokenizer = tokenizer
        self.field = field
        self.source = source  # its name, in the tokenizer's unknown-token warning

    def render(self, value: Any, key: DocKey | None = None,
               ) -> tuple[Rendered | None, str | None, str | None]:
        text, reason, detail = text_value(value, f"field {self.field!r}")
        if text is None:
            return None, reason, detail
        if not text:
            return None, "empty_text", f"field {self.field!r} is empty"
        return Rendered(text), None, None

    def tokenize(self, docs: list[Rendered]) -> Tokenized:
        flat, offsets, lengths = self.tokenizer.encode([d.text for d in docs], self.source)
        return {"input_ids": flat}, offsets, lengths
