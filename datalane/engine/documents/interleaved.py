"""Interleaved image-text documents (OBELICS): texts with images among them (docs/vlm.md).

The field value is what a columnar format reads for the kind's parts
(:mod:`datalane.spec.vision`, :class:`~datalane.spec.vision.InterleavedSpec`):
``{"texts": [str | bytes | None, ...], "images": [bytes | None, ...]}``, two lists of one
length, each position a text or an image, the other null: TorchTitan's ``_process_mm_sample``
input. :class:`InterleavedKind` renders it as TorchTitan's ``insert_vision_placeholders`` +
``encode`` do: the texts in order, each image's run ``vision_start image_token x N
vision_end`` in its place (``N`` of its resized grid, as the vision kind), the joined text
stripped at both ends, then the recipe tokenizer's BOS / EOS. Texts between two images (or an
image and an end) are tokenized as one piece each (the added vision tokens split TorchTitan's
joined string the same way; consecutive texts are one piece, joined without a separator).
``loss_mask`` is 0 on the vision tokens. The images run through the vision kind's pipeline on
the worker thread (an augmenting recipe draws each image's crop and flip from the record's key
and the image's index among the document's images, 0 first: each image its own draw); the
rendered document's ``value`` is the tuple of their :class:`Patches`, in document order (kept
with the map result, ``attaches``). The rendered ``text`` (what character filters and
predicates see) is the texts joined; ``spans`` holds one zero-length span per
image, at the character of ``text`` where it stands.

**Bad records** (each detail names the position): ``malformed_sample`` (not two lists of one
length, an empty document, a position with both or neither, an image that is not bytes),
``too_many_images`` (more than ``max_images``, before any is decoded), the text reasons
(``non_utf8``, ``not_text``, ``invalid_unicode``, ``vision_token_in_text``) and the image
reasons (the first bad image sets the document aside, as TorchTitan drops the sample).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from datalane.engine.documents.base import Attached, DocKey, Rendered, Tokenized
from datalane.engine.documents.vision import VisionKind
from datalane.engine.images import BadImage, Patches
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.vision import InterleavedSpec

__all__ = ["InterleavedKind", "attach_runs"]

TOO_MANY_IMAGES = "too_many_images"
MALFORMED = "malformed_sample"


class InterleavedKind(VisionKind):
    """Renders interleaved documents; thread-safe, stateless after construction."""

    bad_reasons = VisionKind.bad_reasons | {MALFORMED, TOO_MANY_IMAGES}

    def __init__(self, spec: InterleavedSpec, tokenizer: TokenizerHandle,
                 where: str = "interleaved") -> None:
        super().__init__(spec, tokenizer, where)
        self.max_images = spec.max_images

    def render(self, value: Any, key: DocKey | None = None,
               ) -> tuple[Rendered | None, str | None, str | None]:
        texts, images = (value.get("texts"), value.get("images")) if isinstance(
            value, dict) else (None, None)
        if not isinstance(texts, list) or not isinstance(images, list):
            return None, MALFORMED, (f"the record holds {type(value).__name__}, not the lists "
                                     f"of texts and images")
        if len(texts) != len(images) or not texts:
            return None, MALFORMED, (f"the texts ({len(texts)}) and images ({len(images)}) "
                                     f"are not two lists of one length"
                                     if texts or images else "the document has no entries")
        count = sum(i is not None for i in images)
        if count > self.max_images:
            return None, TOO_MANY_IMAGES, (f"{count} images, more than max_images "
                                           f"{self.max_images}")
        pieces: list[str | int] = []  # text, or the index of an image
        for k, (text, image) in enumerate(zip(texts, images, strict=True)):
            if (text is None) == (image is None):
                held = "both a text and an image" if text is not None else \
                    "neither a text nor an image"
                return None, MALFORMED, f"entry {k} holds {held}"
            if image is not None:
                if not isinstance(image, bytes):
                    return None, MALFORMED, (f"entry {k} holds {type(image).__name__}, not "
                                             f"an image")
                pieces.append(k)
                continue
            got, reason, detail = self.text_of(text, f"entry {k}")
            if got is None:
                return None, reason, detail
            if pieces and isinstance(pieces[-1], str):
                pieces[-1] += got
            else:
                pieces.append(got)
        if isinstance(pieces[0], str):  # TorchTitan strips the joined string
            pieces[0] = pieces[0].lstrip()
        if isinstance(pieces[-1], str):
            pieces[-1] = pieces[-1].rstrip()
        patches: list[Patches] = []
        text = ""
        at: list[tuple[int, int]] = []
        for piece in pieces:
            if isinstance(piece, str):
                text += piece
                continue
            try:
                patches.append(self.image(images[piece], key, len(patches)))
            except BadImage as e:
                return None, e.reason, f"entry {piece}: {e.detail}"
            at.append((len(text), len(text)))
        return Rendered(text, tuple(at), tuple(patches)), None, None

    def attach(self, doc: Rendered, ids: np.ndarray) -> tuple[Attached, ...]:
        return attach_runs(self.start_id, doc.value, ids)

    def tokenize(self, docs: list[Rendered]) -> Tokenized:
        """Each document's text pieces (cut at its images) tokenized in one batch, the runs
        put between them."""
        pieces: list[str] = []
        for d in docs:
            cuts = [0, *(a for a, _ in d.spans or ()), len(d.text)]
            pieces.extend(d.text[a:b] for a, b in itertools.pairwise(cuts))
        encs = self.tokenizer.tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
        ids_of = [np.asarray(e.ids, dtype=np.int32) for e in encs]
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
        columns: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        lengths = np.zeros(len(docs), dtype=np.int64)
        p = 0
        for k, d in enumerate(docs):
            parts: list[np.ndarray] = [] if bos is None else [np.array([bos], np.int32)]
            mask: list[np.ndarray] = [] if bos is None else [np.ones(1, np.uint8)]
            for image in (*d.value, None):
                text = ids_of[p]
                p += 1
                parts.append(text)
                mask.append(np.ones(len(text), np.uint8))
                lengths[k] += len(text)
                if image is None:
                    break
                run = self.run_of(image)
                parts.append(run)
                mask.append(np.zeros(len(run), np.uint8))
                lengths[k] += len(run)
            if eos is not None:
                parts.append(np.array([eos], np.int32))
                mask.append(np.ones(1, np.uint8))
            columns.append(np.concatenate(parts))
            masks.append(np.concatenate(mask))
            offsets[k + 1] = offsets[k] + len(columns[-1])
        if not docs:
            return ({"input_ids": np.zeros(0, np.int32), "loss_mask": np.zeros(0, np.uint8)},
                    offsets, lengths)
        return ({"input_ids": np.concatenate(columns), "loss_mask": np.concatenate(masks)},
                offsets, lengths)


def attach_runs(start_id: int, patches: tuple[Any, ...],
                ids: np.ndarray) -> tuple[Attached, ...]:
    """One :class:`Attached` per image, at its run's first ``image_token`` (the token after
    each ``vision_start``: a text holding a vision token's text was set aside, so every
    ``vision_start`` id opens a run); interleaved and llava documents."""
    starts = np.flatnonzero(ids == start_id)
    if len(starts) != len(patches):
        raise AssertionError(f"{len(starts)} vision runs for {len(patches)} images")
    return tuple(Attached(int(s) + 1, p) for s, p in zip(starts, patches, strict=True))


KIND = InterleavedKind
