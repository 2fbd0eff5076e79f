"""Image-caption documents: an image's placeholder run, then its caption (docs/vlm.md).

The field value is what a format reads for a vision source's parts (:mod:`datalane.spec.vision`):
``{"image": bytes, "text": bytes | str}``. :class:`VisionKind` renders the caption (UTF-8,
trailing whitespace stripped: what the filters see) and runs the image through
:func:`datalane.engine.images.process` on the worker thread: decode within the recipe's limits,
augment (when the recipe declares it), resize, patchify. The rendered document's ``value`` is
the image's :class:`Patches` (uint8, one frame: ``repeat_frames=False``, the client repeats
it); the document carries it to the packer (``attaches``: an :class:`Attached` at the offset
of its first ``image_token``), which places it in a sequence, and the lane builds the
per-image columns from it (:mod:`datalane.spec.imagecolumns`).

**Tokens** (as TorchTitan's ``insert_vision_placeholders``, the image first as in a CC12M
pair): ``[BOS] vision_start image_token x N vision_end caption [EOS]`` where
``N = t * h * w / merge_size**2`` and BOS / EOS follow the recipe's ``tokenizer.add_bos`` /
``add_eos``; the caption is tokenized alone with ``add_special_tokens`` off (TorchTitan encodes
the joined string, in which the added vision tokens split the caption off the same way). The
ids of the three vision tokens come from the recipe's tokenizer by the names the source gives
(Qwen's by default); a tokenizer without them is a ConfigError. ``loss_mask`` is 0 on the
three vision tokens and 1 elsewhere (TorchTitan's labels -100 on them). A document's raw length
(what token filters see) is its placeholder run plus its caption tokens, without BOS and EOS.

**Augmentation** (``augment: {crop, flip}``, off by default): each image's crop and flip are
drawn from its record's :class:`~datalane.engine.documents.base.DocKey` and its index in the
document, ``words(3, seed, "image-augment", lane, source, file, position, image)``
(:func:`datalane.engine.images.augment.augment`; ``image`` is 0 here, and k for the k-th
image of an interleaved document), so the pixels are the same for any world size, worker count
or restore. The kind is ``keyed`` only then: without augmentation no key is built or used.

**Bad records** (the ``bad_records`` policy applies; each detail names the problem): the image
reasons of :data:`datalane.spec.limits.IMAGE_REASONS` (one bad image sets the document aside,
as TorchTitan drops the sample), ``non_utf8`` / ``not_text`` / ``invalid_unicode`` for a
caption that is no text, ``vision_token_in_text`` for a caption holding one of the vision
tokens' text (it would add a placeholder the image does not have; the model refuses a run of
the wrong length).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from datalane.engine.documents.base import (
    LOSS_MASK,
    Attached,
    DocKey,
    KindBase,
    Rendered,
    Tokenized,
)
from datalane.engine.documents.text import text_value
from datalane.engine.images import (
    Augment,
    BadImage,
    ImageLimits,
    ImageRule,
    Patches,
    PatchRule,
    ResizeRule,
    libraries,
    process,
)
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec import imagecolumns
from datalane.spec.errors import ConfigError
from datalane.spec.limits import IMAGE_REASONS
from datalane.spec.schema import Column
from datalane.spec.vision import ImageSettings
from datalane.spec.visioncontract import VisionContract

__all__ = ["VisionKind", "image_rule"]


def image_rule(spec: ImageSettings) -> ImageRule:
    """The engine's :class:`ImageRule` of a source's ``vision`` settings."""
    size = tuple(spec.resize.size) if spec.resize.size is not None else None
    return ImageRule(
        limits=ImageLimits(spec.limits.max_bytes, spec.limits.max_pixels, spec.exif_transpose,
                           spec.limits.max_scans),
        resize=ResizeRule(spec.patch_size, spec.merge_size, spec.resize.min_pixels,
                          spec.resize.max_pixels, size),  # type: ignore[arg-type]
        patches=PatchRule(spec.patch_size, spec.temporal_patch_size, spec.merge_size,
                          spec.order, tuple(spec.image_mean),  # type: ignore[arg-type]
                          tuple(spec.image_std)),  # type: ignore[arg-type]
        augment=Augment(spec.augment.crop, spec.augment.flip))


class VisionKind(KindBase):
    """Renders image-caption pairs; thread-safe, stateless after construction."""

    bad_reasons = IMAGE_REASONS | {"non_utf8", "not_text", "invalid_unicode",
                                   "vision_token_in_text"}
    attaches = True

    def __init__(self, spec: ImageSettings, tokenizer: TokenizerHandle,
                 where: str = "vision") -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.rule = image_rule(spec)
        #: an augmenting kind draws from each record's key (the map stage then builds it)
        self.keyed = self.rule.augment.active
        #: the loss mask, then the per-image columns (patch rows of one frame: the client
        #: repeats it temporal_patch_size times)
        self.columns: tuple[Column, ...] = (LOSS_MASK, *imagecolumns.columns(
            3 * spec.patch_size * spec.patch_size, spec.merge_size))
        tok = tokenizer.tokenizer

        def token(name: str) -> int:
            text = getattr(spec, name)
            tid = tok.token_to_id(text)
            if tid is None:
                raise ConfigError(f"{where}.{name} {text!r} is not in the vocabulary of "
                                  f"{tokenizer.spec.uri}")
            return int(tid)

        self.image_id = token("image_token")
        self.start_id = token("vision_start_token")
        self.end_id = token("vision_end_token")
        self._texts = (spec.image_token, spec.vision_start_token, spec.vision_end_token)
        video = tok.token_to_id("<|video_pad|>")
        if video is not None and int(video) in (self.image_id, self.start_id, self.end_id):
            video = None  # the recipe renders images with it: no video placeholder of its own
        patches = self.rule.patches
        try:  # the tokenizer's pad or <|video_pad|> may be one of the vision tokens
            self.vision: VisionContract | None = VisionContract(
                self.image_id, -1 if video is None else int(video), self.start_id,
                self.end_id, tokenizer.pad_id, patches.patch_size,
                patches.temporal_patch_size, patches.merge_size, patches.order, patches.mean,
                patches.std)
        except ValueError as e:
            raise ConfigError(f"{where}: the vision contract with {tokenizer.spec.uri}: "
                              f"{e}") from None
        """The source's vision contract: its tokens' ids (``<|video_pad|>``'s where the
        vocabulary has it and the recipe does not use it for images, else -1, an id no token
        has: videos are not carried; the
        tokenizer's pad, what the lanes pad ``input_ids`` with) and its patch rule."""
        # the first placeholder follows BOS (if the tokenizer adds one) and vision_start
        self._first_pad = (1 if tokenizer.bos_id is not None else 0) + 1

    def identity(self) -> dict[str, Any]:
        """Pillow's and the decoders' versions: they decide the pixel bytes (the recipe's
        settings are in the fingerprint already)."""
        return libraries()

    def text_of(self, value: Any, label: str) -> tuple[str | None, str, str]:
        """A text part's string (:func:`text_value`), or ``vision_token_in_text`` when it holds
        a vision token's text (it would be tokenized to a placeholder no image has)."""
        text, reason, detail = text_value(value, label)
        held = next((t for t in self._texts if t in text), None) if text is not None else None
        if held is not None:
            return None, "vision_token_in_text", f"{label} holds the vision token {held!r}"
        return text, reason, detail

    def image(self, data: bytes, key: DocKey | None, index: int) -> Patches:
        """Image ``index`` of the document at ``key`` through the image pipeline (one frame);
        raises :class:`BadImage`. An augmenting rule draws from the key and the index."""
        if not self.keyed:
            return process(data, self.rule, repeat_frames=False)
        if key is None:
            raise ValueError("an augmenting image kind renders a record only with its DocKey "
                             "(the map stage gives it)")
        return process(data, self.rule, seed=key.seed, lane=key.lane,
                       document=(key.source, key.file, key.position, index),
                       repeat_frames=False)

    def run_of(self, image: Patches) -> np.ndarray:
        """An image's tokens: vision_start, one placeholder per merged patch, vision_end."""
        run = np.full(image.tokens + 2, self.image_id, np.int32)
        run[0], run[-1] = self.start_id, self.end_id
        return run

    def render(self, value: Any, key: DocKey | None = None,
               ) -> tuple[Rendered | None, str | None, str | None]:
        if not isinstance(value, dict) or "image" not in value or "text" not in value:
            return None, "not_text", (f"the record holds {type(value).__name__}, not an image "
                                      f"and a caption")
        caption, reason, detail = self.text_of(value["text"], "the caption")
        if caption is None:
            return None, reason, detail
        try:
            patches = self.image(value["image"], key, 0)
        except BadImage as e:
            return None, e.reason, e.detail
        return Rendered(caption.rstrip(), None, patches), None, None

    def attach(self, doc: Rendered, ids: np.ndarray) -> tuple[Attached, ...]:
        return (Attached(self._first_pad, doc.value),)

    def attached_bytes(self, attached: tuple[Attached, ...]) -> int:
        return sum(int(a.value.values.nbytes) for a in attached)

    def most_attached_bytes(self, tokens: int) -> int:
        """An image's placeholders are tokens of its document, each ``merge_size**2`` patch
        rows of ``3 * patch_size**2`` bytes (one frame): a document of ``tokens`` tokens holds
        at most ``tokens * merge_size**2 * 3 * patch_size**2`` bytes of patch rows, however
        many images it has."""
        return tokens * self.spec.merge_size ** 2 * 3 * self.spec.patch_size ** 2

    def lighten(self, doc: Rendered, most: int) -> Rendered:
        """``doc`` with no patch rows (its images' grids and placeholder counts kept) when they
        are more than ``most`` bytes: a worker then does not hold a too-long document's images
        until its task ends. The value is one image's :class:`Patches` or a tuple of them."""
        images = doc.value if isinstance(doc.value, tuple) else (doc.value,)
        if sum(int(p.values.nbytes) for p in images) <= most:
            return doc
        light = tuple(dataclasses.replace(p, values=np.empty((0, p.values.shape[1]),
                                                             p.values.dtype)) for p in images)
        return doc._replace(value=light if isinstance(doc.value, tuple) else light[0])

    def tokenize(self, docs: list[Rendered]) -> Tokenized:
        flat, offsets, lengths = self.tokenizer.encode([d.text for d in docs])
        n = len(docs)
        runs = np.fromiter((d.value.tokens + 2 for d in docs), dtype=np.int64, count=n)
        out_offsets = offsets.copy()
        out_offsets[1:] += np.cumsum(runs)
        total = int(out_offsets[-1])
        ids = np.empty(total, dtype=np.int32)
        mask = np.ones(total, dtype=np.uint8)
        head = 1 if self.tokenizer.bos_id is not None else 0
        for k in range(n):
            lo, run = int(out_offsets[k]), int(runs[k])
            src = int(offsets[k])
            ids[lo:lo + head] = flat[src:src + head]
            at = lo + head
            ids[at] = self.start_id
            ids[at + 1:at + run - 1] = self.image_id
            ids[at + run - 1] = self.end_id
            mask[at:at + run] = 0
            rest = int(offsets[k + 1]) - src - head
            ids[at + run:at + run + rest] = flat[src + head:src + head + rest]
        return {"input_ids": ids, "loss_mask": mask}, out_offsets, lengths + runs


KIND = VisionKind
