"""The chat part of a source: conversations rendered with a chat template, with a loss mask.

A chat source's records hold a list of messages (``[{"role": ..., "content": ...}, ...]``,
OpenAI / Hugging Face style) in ``messages_field``. Each conversation is rendered with the
tokenizer's chat template (or one the recipe gives), tokenized as the template wrote it, and
given a ``loss_mask`` column: 1 on the tokens the trainer learns (by default the assistant
turns), 0 elsewhere. :class:`ChatSpec` is the recipe's ``sources[i].chat``; the engine side is
:mod:`datalane.engine.documents.chat`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Literal

from datalane.spec.errors import ConfigError
from datalane.spec.model import doc

__all__ = ["TRAIN_ON", "ChatSpec"]

TRAIN_ON = ("assistant", "all", "last_assistant")
DEFAULT_TEMPLATE_DATE = "2024-07-26"


@dataclass(frozen=True)
class ChatSpec:
    """A chat source: conversations rendered with a chat template and given a loss mask."""

    messages_field: str = doc(
        "Column (Parquet) or key (JSONL) holding the conversation: a list of "
        "`{role, content}` messages, roles system, user, assistant or tool.",
        default="messages", pattern=r".+")
    template: str | None = doc(
        "Path or fsspec URI of a Jinja chat template file; null uses `template_text` or the "
        "tokenizer config's `chat_template`.", default=None)
    template_text: str | None = doc(
        "The chat template itself (Jinja); at most one of `template` and `template_text`.",
        default=None, pattern=r"(?s).*\S.*")
    tokenizer_config: str | None = doc(
        "Path or fsspec URI of a Hugging Face `tokenizer_config.json`: its `chat_template` "
        "(a string, or the `default` of a list of named templates; else a "
        "`chat_template.jinja` beside it) and its special tokens (`bos_token`, "
        "`eos_token`, ...) are what the template sees. Null: the `tokenizer_config.json` "
        "beside `tokenizer.uri`, if there is one.", default=None)
    train_on: Literal["assistant", "all", "last_assistant"] = doc(
        "Tokens with loss mask 1: `assistant` every assistant turn (its content and "
        "end-of-turn marker, not its header), `last_assistant` only the last one, `all` every "
        "token.", default="assistant")
    template_date: str = doc(
        "The date `strftime_now` gives templates that print today's date (ISO YYYY-MM-DD), "
        "fixed so that the stream is the same on every day.",
        default=DEFAULT_TEMPLATE_DATE, pattern=r"\d{4}-\d{2}-\d{2}")

    def validate(self, where: str) -> None:
        if self.template is not None and self.template_text is not None:
            raise ConfigError(f"{_at(where, 'template')} and {_at(where, 'template_text')} are "
                              f"both set; give the template one way")
        try:
            date.fromisoformat(self.template_date)
        except ValueError as e:
            raise ConfigError(f"{_at(where, 'template_date')} {self.template_date!r} is not a "
                              f"date: {e}") from e

    @property
    def today(self) -> datetime:
        """``template_date`` at midnight: what ``strftime_now`` formats."""
        return datetime.fromisoformat(self.template_date)

    @property
    def document_field(self) -> str:
        """The field of a record that holds the document (the conversation)."""
        return self.messages_field

    def resolved(self, fix: Callable[[str], str]) -> ChatSpec:
        """A copy with the file fields passed through ``fix`` (relative paths of a recipe
        file are relative to the file)."""
        return dataclasses.replace(
            self,
            template=None if self.template is None else fix(self.template),
            tokenizer_config=None if self.tokenizer_config is None
            else fix(self.tokenizer_config))


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
