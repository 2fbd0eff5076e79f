"""Chat documents: a conversation rendered with its chat template, tokenized, loss-masked.

The field value is a list of ``{role, content}`` messages (roles ``system``, ``user``,
``assistant``, ``tool``; content a string, possibly empty; other keys are passed to the
template as they are). :class:`ChatKind` renders it with the chat template exactly as
``transformers``' ``apply_chat_template`` does (:mod:`.chat_template`), tokenizes the text
with ``add_special_tokens`` off - the template writes BOS, EOS and the turn markers itself,
so the recipe's ``tokenizer.add_bos`` / ``add_eos`` do not apply to chat documents - and
fills the ``loss_mask`` column.

**Trained spans.** Assistant turn ``i`` trains on the characters that
``render(messages[:i+1])`` adds after ``render(messages[:i], add_generation_prompt=True)``:
the turn's content and its end-of-turn marker, not its header. This needs the template to be
*prefix-consistent* (each shorter render is a prefix of the longer ones); a conversation for
which it is not (a template that rewrites earlier turns, or prints a default system prompt
only once a message exists) is a bad record with reason ``chat_template``. The tokens of a
span are those ``transformers``' ``return_assistant_tokens_mask`` marks: from the token
holding its first character through the token holding its last (``char_to_token``, on the
tokenizer's character offsets taken before any post-processor trims them), so a token across a
span's start or end is trained. ``train_on``: ``assistant`` every assistant turn,
``last_assistant`` the last one, ``all`` every token.

**Bad records** (the recipe's ``bad_records`` policy applies; each detail names the problem):
``not_messages`` (not a non-empty list of mappings with ``role`` and ``content``),
``bad_role``, ``not_text`` (content that is not a string), ``invalid_unicode`` (content, or
the rendered text, holding a lone surrogate, as JSON's ``"\\ud800"`` makes: the tokenizer
would refuse the whole batch), ``no_assistant`` (nothing to
train on under ``assistant`` / ``last_assistant``), ``chat_template`` (the template raised,
through ``raise_exception`` or otherwise, went past a bound of a render or would print a value
without a fixed text (:mod:`.template_sandbox`), or is not prefix-consistent for the
conversation).

A conversation longer than a sequence is not this kind's concern: the packers split long
documents (``wrap`` continues it in the next sequence, ``bestfit`` cuts it into full
sequences and a tail) and the mask travels with the tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import Any

import numpy as np

from datalane.engine.documents.base import LOSS_MASK, DocKey, KindBase, Rendered, Tokenized
from datalane.engine.documents.chat_template import (
    ChatTemplate,
    find_template,
    plain_message,
)
from datalane.engine.documents.text import unencodable
from datalane.engine.formats.base import MISSING
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.chat import ChatSpec
from datalane.spec.schema import Column

__all__ = ["LOSS_MASK", "ROLES", "ChatKind", "trained_mask"]

ROLES = frozenset({"system", "user", "assistant", "tool"})


class ChatKind(KindBase):
    """Renders conversations with a chat template; thread-safe, stateless after construction."""

    columns: tuple[Column, ...] = (LOSS_MASK,)
    bad_reasons = frozenset({"not_messages", "bad_role", "not_text", "invalid_unicode",
                             "no_assistant", "chat_template"})

    def __init__(self, spec: ChatSpec, tokenizer: TokenizerHandle, where: str = "chat") -> None:
        self.spec = spec
        self.where = where
        self.field = spec.messages_field
        self.template = ChatTemplate(find_template(spec, tokenizer.spec, where), spec.today)
        tok = tokenizer.tokenizer
        if spec.train_on != "all" and tok.post_processor is not None:
            # Offsets only: a post-processor adds nothing with add_special_tokens off, but
            # ByteLevel / RoBERTa ones trim whitespace off the offsets (a token "\n " would
            # hold only the newline, and a span starting at the space no token at all).
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(tok.to_str())
            tok.post_processor = None
        self._tokenizer = tok

    @property
    def offsets_tokenizer(self) -> Any:
        """The tokenizer the trained spans are mapped with (its post-processor off when it
        would trim offsets); llava tokenizes its pieces with it."""
        return self._tokenizer

    def identity(self) -> dict[str, Any]:
        """The template's content (the recipe names only its file) and what it is given."""
        return {"kind": "chat", "template_sha256": self.template.sha256,
                "special_tokens": dict(sorted(self.template.source.special_tokens.items())),
                "train_on": self.spec.train_on, "template_date": self.spec.template_date}

    # -- render ------------------------------------------------------------------------------

    def _messages(self, value: Any) -> tuple[list[dict[str, Any]] | None, str, str]:
        """The messages as the template sees them, or ``(None, reason, detail)``."""
        field = self.field
        if value is MISSING or value is None:
            return None, "not_messages", f"no value in field {field!r}"
        if not isinstance(value, (list, tuple)):
            return None, "not_messages", (f"field {field!r} holds {type(value).__name__}, not "
                                          f"a list of messages")
        if not value:
            return None, "not_messages", f"field {field!r} is an empty conversation"
        out: list[dict[str, Any]] = []
        for i, m in enumerate(value):
            if not isinstance(m, Mapping):
                return None, "not_messages", (f"{field}[{i}] is {type(m).__name__}, not a "
                                              f"mapping with role and content")
            for key in ("role", "content"):
                if key not in m:
                    return None, "not_messages", f"{field}[{i}] has no {key!r}"
            role = m["role"]
            if not isinstance(role, str) or role not in ROLES:
                return None, "bad_role", (f"{field}[{i}].role is {role!r:.40}; roles are "
                                          f"{', '.join(sorted(ROLES))}")
            content = m["content"]
            if not isinstance(content, str):
                what = "null" if content is None else type(content).__name__
                return None, "not_text", f"{field}[{i}].content is {what}, not a string"
            if (problem := unencodable(content)) is not None:
                return None, "invalid_unicode", f"{field}[{i}].content {problem}"
            out.append(plain_message(m))
        return out, "", ""

    def render(self, value: Any, key: DocKey | None = None,
               ) -> tuple[Rendered | None, str | None, str | None]:
        msgs, reason, detail = self._messages(value)
        if msgs is None:
            return None, reason, detail
        turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        if self.spec.train_on == "all":
            turns = []
        elif not turns:
            kind = self.where.rsplit(".", 1)[-1]  # chat, or llava
            return None, "no_assistant", (f"{self.field} has no assistant turn to train on "
                                          f"({kind}.train_on {self.spec.train_on!r})")
        elif self.spec.train_on == "last_assistant":
            turns = turns[-1:]
        n = len(msgs)
        step = f"messages[:{n}]"
        try:
            full = self.template.render(msgs, False)
            spans: list[tuple[int, int]] = []
            for i in turns:
                step = f"messages[:{i}] with add_generation_prompt"
                head = self.template.render(msgs[:i], True)
                step = f"messages[:{i + 1}]"
                turn = full if i + 1 == n else self.template.render(msgs[:i + 1], False)
                if not full.startswith(turn):
                    return None, "chat_template", (
                        f"the template is not prefix-consistent: the render of "
                        f"messages[:{i + 1}] is not a prefix of the whole conversation's, so "
                        f"assistant turn {i} has no place in it")
                if not turn.startswith(head):
                    return None, "chat_template", (
                        f"the template is not prefix-consistent: the render of "
                        f"messages[:{i}] with add_generation_prompt is not a prefix of "
                        f"messages[:{i + 1}]'s, so assistant turn {i} has no start")
                if len(turn) > len(head):
                    spans.append((len(head), len(turn)))
        except Exception as e:  # the template's code, on this record's data
            return None, "chat_template", (f"the chat template failed on {step}: "
                                           f"{type(e).__name__}: {e}"[:500])
        if (problem := unencodable(full)) is not None:
            # from a message's other keys (the contents are checked): a tokenizer refuses
            # the whole batch for it, so the record is set aside here
            return None, "invalid_unicode", f"the rendered conversation {problem}"
        if self.spec.train_on == "all":
            spans = [(0, len(full))]
        return Rendered(full, _merged(spans)), None, None

    # -- tokenize ----------------------------------------------------------------------------

    def tokenize(self, docs: list[Rendered]) -> Tokenized:
        n = len(docs)
        texts = [d.text for d in docs]
        trained_everywhere = self.spec.train_on == "all"
        if trained_everywhere:
            encs = self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        else:
            encs = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        lens = np.fromiter((len(e) for e in encs), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        total = int(offsets[-1])
        ids = np.fromiter(chain.from_iterable([e.ids for e in encs]), dtype=np.int32,
                          count=total)
        if trained_everywhere:
            return {"input_ids": ids, "loss_mask": np.ones(total, dtype=np.uint8)}, offsets, lens
        mask = np.zeros(total, dtype=np.uint8)
        for k, d in enumerate(docs):
            if d.spans:
                lo, hi = int(offsets[k]), int(offsets[k + 1])
                mask[lo:hi] = trained_mask(encs[k], d.spans, len(d.text))
        return {"input_ids": ids, "loss_mask": mask}, offsets, lens


def trained_mask(enc: Any, spans: tuple[tuple[int, int], ...], chars: int) -> np.ndarray:
    """The mask of one document: for each span, 1 from the token holding its first character
    through the token holding its last (``char_to_token``: the first token holding a
    character), as ``transformers``' ``return_assistant_tokens_mask`` marks them. A token
    that straddles a span's start (``"\\n "`` across a header's newline and the content's
    first space) is trained; one that straddles its end is trained too."""
    size = len(enc)
    mask = np.zeros(size, dtype=np.uint8)
    for start, stop in spans:
        first = enc.char_to_token(start) if start < chars else None
        last = enc.char_to_token(stop - 1) if stop - 1 < chars else None
        if first is None or last is None:  # a normalizer removed a boundary character
            return _overlapping(enc, spans)
        mask[first:last + 1] = 1
    return mask


def _overlapping(enc: Any, spans: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The mask when a span's first or last character is in no token: for each span, 1 from
    the first to the last token that holds one of its characters (the rule of
    :func:`trained_mask` for the characters that are in tokens)."""
    size = len(enc)
    mask = np.zeros(size, dtype=np.uint8)
    if not size:
        return mask
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(size, 2)
    starts, ends = offsets[:, 0], offsets[:, 1]
    for start, stop in spans:
        held = np.flatnonzero((starts < stop) & (ends > start))
        if held.size:
            mask[held[0]:held[-1] + 1] = 1
    return mask


def _merged(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Spans sorted and overlapping ones joined (successive turns of an odd template may
    overlap; the mask is their union). Spans that only touch stay two, as two
    ``{% generation %}`` blocks do in transformers: the end of the first is mapped to
    tokens on its own (it may end inside a character split into byte tokens)."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return tuple(out)


KIND = ChatKind
