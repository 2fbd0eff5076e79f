"""One fixture per document kind, keyed by the kind's name (``text`` and every kind a
``Source`` field declares: :func:`datalane.spec.recipe.document_kinds`).

A fixture is a recipe source reading the kind (its configuration as a recipe would give it,
loaded through the recipe model), the tokenizer it is read with, field values that are good
documents of the kind, and one value that is a bad record of it.
tests/engine/test_kind_contract.py runs every kind through the same contract with its fixture
here; a declared kind without one fails that test by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datalane.corpus import tokenizer_path
from datalane.testing.images import CHATML_TEMPLATE, hostile_images

__all__ = ["FIXTURES", "KindFixture"]

CHAT = Path(__file__).resolve().parent.parent / "data" / "chat"
#: datalane's bundled tokenizer with Qwen's vision tokens
#: (:func:`datalane.testing.images.write_vision_tokenizer`)
VISION_TOKENIZER = Path(__file__).resolve().parent.parent / "data" / "vision" / "tokenizer.json"


@dataclass(frozen=True)
class KindFixture:
    source: dict[str, Any]  # the recipe source's kind settings (``{"chat": {...}}``; {}: text;
    # and ``uris`` where the kind needs a format that can read it)
    tokenizer: str
    good: list[Any]
    bad: Any


def _turns(k: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question {k}?"},
            {"role": "assistant", "content": "answer " * (k % 4 + 1)}]


def _image(k: int) -> bytes:
    """A small JPEG of 48 x (40 + 8k) pixels."""
    import io

    from PIL import Image

    from datalane.testing.images import synthetic_image

    buf = io.BytesIO()
    Image.fromarray(synthetic_image(k, 48, 40 + 8 * k)).save(buf, "JPEG")
    return buf.getvalue()


FIXTURES: dict[str, KindFixture] = {
    "text": KindFixture({}, tokenizer_path(),
                        ["hello world", "a second document, longer than the first one", "x"],
                        b"\xff\xfe not utf-8"),
    "chat": KindFixture({"chat": {"tokenizer_config": str(CHAT / "chatml" /
                                                          "tokenizer_config.json")}},
                        str(CHAT / "tokenizer.json"), [_turns(k) for k in range(4)],
                        "not a list of messages"),
    # as the token formats decode them: 1-D integer arrays
    "tokens": KindFixture({"tokens": {}}, tokenizer_path(),
                          [np.array(ids) for ids in ([1, 2, 3], [7], [100, 200, 300, 400, 5])],
                          np.array([1, -3])),
    # as a WebDataset source decodes them: the image member's and the caption member's bytes
    "vision": KindFixture({"uris": ["x.tar"], "vision": {}}, str(VISION_TOKENIZER),
                          [{"image": _image(k), "text": f"caption {k} ".encode() * k}
                           for k in range(3)],
                          {"image": hostile_images()["truncated_jpeg"][0], "text": b"a cat"}),
    # as a Parquet source decodes them: a row's texts and images lists
    "interleaved": KindFixture(
        {"uris": ["x.parquet"], "interleaved": {}}, str(VISION_TOKENIZER),
        [{"texts": [f"text {k} ", None, "after"][:2 + k % 2],
          "images": [None, _image(k), None][:2 + k % 2]} for k in range(3)]
        + [{"texts": ["no image at all"], "images": [None]}],
        {"texts": ["a", None], "images": [None, hostile_images()["truncated_jpeg"][0]]}),
    # as the llava JSON format decodes them: the turns, the images read beside the file
    "llava": KindFixture(
        {"uris": ["x.json"], "llava": {"template_text": CHATML_TEMPLATE}}, str(VISION_TOKENIZER),
        [{"conversations": [{"from": "human", "value": "<image>\n" * k + f"question {k}?"},
                            {"from": "gpt", "value": "answer " * (k + 1)}],
          "images": tuple(_image(j) for j in range(k)),
          "paths": tuple(f"{j}.jpg" for j in range(k))} for k in range(3)],
        {"conversations": [{"from": "human", "value": "<image>\n"},
                           {"from": "gpt", "value": "a"}], "images": (), "paths": ()}),
}
