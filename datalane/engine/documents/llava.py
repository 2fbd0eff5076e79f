"""LLaVA documents: a conversation rendered with its chat template, each ``<image>`` marker
replaced by the vision run of the next image (docs/vlm.md, LLaVA JSON).

The field value is what :class:`~datalane.engine.formats.llavajson.LlavaJson` decodes:
``{"conversations": [{"from", "value"}, ...], "images": (bytes, ...), "paths": (str, ...)}``.
:class:`LlavaKind` maps the turns to messages (``from`` human / user: ``user``; gpt /
assistant: ``assistant``; system: ``system``; ``value`` the content), checks that the
conversation holds exactly one ``image_marker`` per image, renders it with the chat kind's
template machinery (the bounded sandbox, the trained spans of ``train_on``:
:mod:`.chat`), and runs each image through the vision pipeline on the worker thread. A record
without images is a plain conversation (no run; still never split: a source's documents are
all whole).

**Tokens.** The rendered text is cut at each marker into pieces, tokenized apart with
``add_special_tokens`` off (the template writes BOS / EOS itself), and the vision run
``vision_start image_token x N vision_end`` (``N`` of the image's resized grid, as the vision
kind) is put where each marker was; a tokenizer that holds the vision tokens as added tokens
splits the text the same way when it tokenizes the marker's replacement. ``loss_mask``: a
piece's tokens by the chat kind's rule (a trained span's characters, carried into each piece
it crosses, from the token holding its first character through the one holding its last), 0
on every vision token. Each image is attached at its run's first ``image_token``
(:func:`~.interleaved.attach_runs`). The rendered ``text`` (what filters see) is the template's
output, markers included.

**Bad records** (each detail names the problem): the chat kind's (``not_messages`` for a turn
without ``from`` / ``value``, ``bad_role`` for another ``from``, ``not_text``,
``invalid_unicode`` (a lone surrogate), ``no_assistant``, ``chat_template``: also a template
that drops a marker, adds one, or prints a vision token), ``malformed_sample`` (markers and
images in different numbers: the detail gives both), ``vision_token_in_text`` (a turn holding
a vision token's text), the image reasons (``image_<...>``, the detail naming the path), and
the format's (``image_path``, ``image_missing``, ``too_many_images``:
:mod:`datalane.engine.formats.llavajson`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from datalane.engine.documents.base import Attached, DocKey, Rendered, Tokenized
from datalane.engine.documents.chat import ChatKind, trained_mask
from datalane.engine.documents.interleaved import MALFORMED, TOO_MANY_IMAGES, attach_runs
from datalane.engine.documents.text import unencodable
from datalane.engine.documents.vision import VisionKind
from datalane.engine.images import BadImage, libraries
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.llava import LlavaSpec

__all__ = ["ROLE_OF", "LlavaKind"]

#: a LLaVA turn's ``from`` -> the chat role it renders as
ROLE_OF = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
           "system": "system"}
#: the bad-record reasons of the format's decode (llavajson.RECORD_REASONS; the engine's
#: formats are not imported by the document kinds)
_FORMAT_REASONS = frozenset({"image_path", "image_missing", "missing_field"})


class LlavaKind(VisionKind):
    """Renders LLaVA conversations with their images; thread-safe, stateless after
    construction."""

    bad_reasons = (VisionKind.bad_reasons | ChatKind.bad_reasons | _FORMAT_REASONS
                   | {MALFORMED, TOO_MANY_IMAGES})

    def __init__(self, spec: LlavaSpec, tokenizer: TokenizerHandle,
                 where: str = "llava") -> None:
        super().__init__(spec, tokenizer, where)
        self.chat = ChatKind(spec, tokenizer, where)
        self.llava = spec

    def identity(self) -> dict[str, Any]:
        """The template's identity (:meth:`ChatKind.identity`) and the image libraries'."""
        return {**self.chat.identity(), "kind": "llava", **libraries()}

    def _messages(self, value: Any) -> tuple[list[dict[str, str]] | None, str, str]:
        field = self.llava.messages_field
        if not isinstance(value, list) or not value:
            what = "an empty list" if value == [] else type(value).__name__
            return None, "not_messages", f"field {field!r} holds {what}, not a list of turns"
        out = []
        for i, turn in enumerate(value):
            if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
                return None, "not_messages", (f"{field}[{i}] is not a mapping with 'from' and "
                                              f"'value'")
            who, text = turn["from"], turn["value"]
            role = ROLE_OF.get(who) if isinstance(who, str) else None
            if role is None:
                return None, "bad_role", (f"{field}[{i}].from is {who!r:.40}; it may be "
                                          f"{', '.join(sorted(ROLE_OF))}")
            if not isinstance(text, str):
                what = "null" if text is None else type(text).__name__
                return None, "not_text", f"{field}[{i}].value is {what}, not a string"
            if (problem := unencodable(text)) is not None:
                return None, "invalid_unicode", f"{field}[{i}].value {problem}"
            held = next((t for t in self._texts if t in text), None)
            if held is not None:
                return None, "vision_token_in_text", (f"{field}[{i}].value holds the vision "
                                                      f"token {held!r}")
            out.append({"role": role, "content": text})
        return out, "", ""

    def render(self, value: Any, key: DocKey | None = None,
               ) -> tuple[Rendered | None, str | None, str | None]:
        if not isinstance(value, dict) or "images" not in value:
            return None, "not_messages", (f"the record holds {type(value).__name__}, not a "
                                          f"conversation and its images")
        msgs, reason, detail = self._messages(value.get("conversations"))
        if msgs is None:
            return None, reason, detail
        images, paths = value["images"], value.get("paths", ())
        marker = self.llava.image_marker
        markers = sum(m["content"].count(marker) for m in msgs)
        if markers != len(images):
            return None, MALFORMED, (f"{markers} {marker} markers for {len(images)} images; "
                                     f"each image needs one marker")
        doc, why, what = self.chat.render(msgs)
        if doc is None:
            return None, why, what
        printed = doc.text.count(marker)
        if printed != markers:
            return None, "chat_template", (f"the template printed {printed} {marker} markers "
                                           f"of the conversation's {markers}")
        held = next((t for t in self._texts if t in doc.text), None)
        if held is not None:
            return None, "chat_template", f"the template printed the vision token {held!r}"
        patches = []
        for k, data in enumerate(images):
            try:
                patches.append(self.image(data, key, k))
            except BadImage as e:
                name = paths[k] if k < len(paths) else f"image {k}"
                return None, e.reason, f"{name!r}: {e.detail}"
        return Rendered(doc.text, doc.spans, tuple(patches)), None, None

    def attach(self, doc: Rendered, ids: np.ndarray) -> tuple[Attached, ...]:
        return attach_runs(self.start_id, doc.value, ids)

    def tokenize(self, docs: list[Rendered]) -> Tokenized:
        """Each document's pieces (its text cut at the markers) tokenized in one batch, each
        with the trained spans that cross it, and the runs put between them."""
        marker = self.llava.image_marker
        pieces: list[str] = []
        spans: list[tuple[tuple[int, int], ...]] = []
        for d in docs:
            lo = 0
            while True:
                at = d.text.find(marker, lo)
                hi = len(d.text) if at < 0 else at
                pieces.append(d.text[lo:hi])
                spans.append(tuple((max(s, lo) - lo, min(e, hi) - lo) for s, e in d.spans or ()
                                   if min(e, hi) > max(s, lo)))
                if at < 0:
                    break
                lo = at + len(marker)
        encs = self.chat.offsets_tokenizer.encode_batch(pieces, add_special_tokens=False)
        ids: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        p = 0
        for k, d in enumerate(docs):
            size = 0
            for image in (*d.value, None):
                enc = encs[p]
                ids.append(np.asarray(enc.ids, dtype=np.int32))
                masks.append(trained_mask(enc, spans[p], len(pieces[p])) if spans[p] else
                             np.zeros(len(enc), np.uint8))
                size += len(enc)
                p += 1
                if image is None:
                    break
                run = self.run_of(image)
                ids.append(run)
                masks.append(np.zeros(len(run), np.uint8))
                size += len(run)
            offsets[k + 1] = offsets[k] + size
        lengths = np.diff(offsets)
        if not ids:
            return ({"input_ids": np.zeros(0, np.int32), "loss_mask": np.zeros(0, np.uint8)},
                    offsets, lengths)
        return ({"input_ids": np.concatenate(ids), "loss_mask": np.concatenate(masks)},
                offsets, lengths)


KIND = LlavaKind
