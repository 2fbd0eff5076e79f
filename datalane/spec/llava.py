"""The LLaVA part of a source: conversations of a JSON file whose images are files beside it
(docs/vlm.md, LLaVA JSON).

A LLaVA source is a JSON file holding a list of records (LLaVA-Instruct-150K,
LLaVA-Pretrain), or a JSONL file of one record a line, each
``{"id": ..., "image": "coco/train2017/000000033471.jpg", "conversations": [{"from": "human",
"value": "<image>\\nWhat ...?"}, {"from": "gpt", "value": "..."}]}``. ``image`` is a path (or a
list of paths) relative to the JSON file's folder; a record without one is a plain
conversation. Each ``<image>`` marker of the conversation stands for the next image; the
conversation is rendered with the chat template (as a ``chat`` source's), and each marker is
replaced by the image's vision run (``vision_start_token``, ``image_token`` once per merged
patch, ``vision_end_token``), with ``loss_mask`` 0 on it. :class:`LlavaSpec` is the recipe's
``sources[i].llava``; the engine sides are :mod:`datalane.engine.formats.llavajson` (the
record, its images read) and :mod:`datalane.engine.documents.llava` (the document).

It is a kind of its own, not a ``chat`` or ``vision`` mode: its records are the LLaVA shape
(``from`` / ``value`` turns, image paths), its format reads files beside the record (only the
JSON reader knows the file a record came from), and its documents are never split (a source
of it needs ``packing.algorithm: bestfit``, as ``vision``). It shares the chat settings
(:class:`~datalane.spec.chat.ChatSpec`: the template, ``train_on``) and the image settings
(:class:`~datalane.spec.vision.ImageSettings`) by inheriting both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from datalane.spec.chat import ChatSpec
from datalane.spec.errors import ConfigError
from datalane.spec.model import doc
from datalane.spec.vision import ImageSettings

__all__ = ["LlavaSpec"]


@dataclass(frozen=True)
class LlavaSpec(ImageSettings, ChatSpec):
    """LLaVA records: ``{from, value}`` turns rendered with the chat template, each ``<image>``
    marker replaced by the vision run of the next image the record names."""

    #: a JSON (array) or JSONL file: only its reader knows the folder image paths start from
    formats: ClassVar[tuple[str, ...] | None] = ("jsonl",)
    #: the JSON format's configured copy that reads the records with their images (the spec
    #: never imports the engine: :meth:`datalane.engine.formats.jsonl.Jsonl.for_source`)
    jsonl_format: ClassVar[str] = "datalane.engine.formats.llavajson:LlavaJson"

    messages_field: str = doc(
        "Key holding the conversation: a list of `{from, value}` turns, `from` human or user, "
        "gpt or assistant, or system (LLaVA: `conversations`).", default="conversations",
        pattern=r"[^|+]+")
    image_field: str = doc(
        "Key holding the record's image: a path relative to the JSON file's folder, or a list "
        "of them (one per `<image>` marker, in order); absent or null: a conversation without "
        "an image. A path that is absolute, a URI, holds `..` or leads outside the folder "
        "(symlinks resolved) is a bad record `image_path`; a missing file `image_missing`.",
        default="image", pattern=r"[^|+]+")
    image_marker: str = doc(
        "The text in a turn that stands for the next image (LLaVA: `<image>`); the markers of "
        "a record must be as many as its images.", default="<image>", pattern=r".+")
    max_images: int = doc(
        "Most images of one record; a record naming more is set aside as `too_many_images` "
        "before any is read.", default=16, ge=1, le=128)

    def validate(self, where: str) -> None:
        ImageSettings.validate(self, where or "llava")
        ChatSpec.validate(self, where)
        if self.messages_field == self.image_field:
            raise ConfigError(f"{where or 'llava'}.messages_field and image_field both name "
                              f"the key {self.image_field!r}")
        if self.image_marker in (self.image_token, self.vision_start_token,
                                 self.vision_end_token):
            raise ConfigError(f"{where or 'llava'}.image_marker {self.image_marker!r} is one of "
                              f"the vision tokens; it must be text the turns hold")

    @property
    def document_field(self) -> str:
        """The keys a record's document is in, as errors name them
        (``conversations+image``)."""
        return f"{self.messages_field}+{self.image_field}"

    @property
    def document_parts(self) -> dict[str, tuple[str, ...]]:
        """The keys the JSON reader takes from a record together."""
        return {"conversations": (self.messages_field,), "image": (self.image_field,)}
