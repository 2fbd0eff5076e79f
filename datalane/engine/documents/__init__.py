"""The document kinds, by name, and which one a source uses.

A source is plain ``text`` unless its recipe entry sets the configuration of another kind
(``chat: {...}``). A kind is declared once, by its configuration field of
:class:`~datalane.spec.recipe.Source` (:func:`datalane.spec.recipe.document_kinds`); it is
implemented by the class ``KIND`` of the module ``datalane.engine.documents.<name>`` (a
:class:`~datalane.engine.documents.base.KindBase`), imported only when a recipe uses it (chat
brings Jinja). The table maps a kind's name to where it lives.
"""

from __future__ import annotations

import importlib
from typing import Any

from datalane.engine.documents.base import Doc, DocumentKind, Rendered
from datalane.engine.documents.text import TextKind
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.errors import ConfigError
from datalane.spec.recipe import Source, document_kinds

__all__ = ["KINDS", "Doc", "DocumentKind", "Rendered", "kind_for", "kind_name"]

#: kind name (= the ``Source`` field holding its configuration) -> "module:class"; the class
#: is built as ``cls(config, tokenizer, where)``.
KINDS: dict[str, str] = {name: f"datalane.engine.documents.{name}:KIND"
                         for name in document_kinds()}


def kind_name(source: Source) -> str:
    """``text``, or the one kind whose configuration the source sets."""
    chosen = [k for k in KINDS if getattr(source, k) is not None]
    if len(chosen) > 1:
        raise ConfigError(f"source {source.name!r} sets {' and '.join(chosen)}; a source is "
                          f"one kind of document")
    return chosen[0] if chosen else "text"


def kind_for(source: Source, tokenizer: TokenizerHandle, where: str) -> DocumentKind:
    """The document kind of ``source``, configured (templates loaded, ConfigError if bad)."""
    name = kind_name(source)
    if name == "text":
        return TextKind(tokenizer, source.text_field, source.name)
    module, _, cls = KINDS[name].partition(":")
    factory: Any = getattr(importlib.import_module(module), cls)
    kind: DocumentKind = factory(getattr(source, name), tokenizer, f"{where}.{name}")
    return kind
