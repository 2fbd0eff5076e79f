"""The interleaved document kind end to end: OBELICS-style rows (``texts`` and ``images`` lists
with nulls) from Parquet through the recipe, the map stage and the Loader
(datalane/engine/documents/interleaved.py, docs/vlm.md), against TorchTitan's own rendering.

The hand-worked row holds the images of test_vision_kind.py: a 96 x 64 JPEG (grown to 224 x
320: 70 placeholders) and a 512 x 256 PNG (128 placeholders), among four texts.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tokenizers import Tokenizer

from datalane.engine.loader import Loader
from datalane.spec.errors import ConfigError, DataError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.testing.images import hostile_images
from tests.support.kinds import VISION_TOKENIZER
from tests.support.vision import END, EOS, PAD, START, encoded, write_interleaved

TEXTS = ["  Look: ", None, " a red square, then", " more", None, " two blue discs.  "]


def _titan_text() -> types.ModuleType:
    """torchtitan/hf_datasets/multimodal/utils/text.py, loaded from its file (its package
    imports torchvision, which the shared venv lacks; the module itself needs torch only)."""
    pytest.importorskip("torch")
    torchtitan = pytest.importorskip("torchtitan")
    path = Path(torchtitan.__file__).parent / "hf_datasets" / "multimodal" / "utils" / "text.py"
    spec = importlib.util.spec_from_file_location("titan_mm_text", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _images() -> list[Any]:
    return [None, encoded(96, 64, "JPEG", 1), None, None, encoded(512, 256, "PNG", 2), None]


def _recipe(path: Path, seq_len: int = 255, **extra: Any) -> Any:
    interleaved = extra.pop("interleaved", {})
    return load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": seq_len,
        "tokenizer": {"uri": str(VISION_TOKENIZER)}, "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 1},
        "sources": [{"name": "docs", "uris": [str(path)], "interleaved": interleaved}],
        **extra})


def test_a_row_gives_torchtitans_token_ids_and_labels(tmp_path: Path) -> None:
    text = _titan_text().insert_vision_placeholders(
        list(TEXTS), [70, 128], vision_start_token="<|vision_start|>",
        vision_token="<|image_pad|>", vision_end_token="<|vision_end|>", eos_token="<|eos|>")
    tok = Tokenizer.from_file(str(VISION_TOKENIZER))
    titan = tok.encode(text).ids  # MultiModalTokenizer.encode: the tokenizer's own encode
    # by hand: the stripped text, the two runs in their places, EOS (the recipe's add_eos)
    pieces = [tok.encode(t, add_special_tokens=False).ids
              for t in ("Look: ", " a red square, then more", " two blue discs.")]
    doc = [*pieces[0], START, *[PAD] * 70, END, *pieces[1], START, *[PAD] * 128, END,
           *pieces[2], EOS]
    assert titan == doc and len(doc) == 5 + 72 + 16 + 130 + 12 + 1 == 236
    path = write_interleaved(tmp_path / "docs.parquet", [(TEXTS, _images())])
    with Loader(_recipe(path), 0, 1, Knobs(workers=2)) as loader:
        step = loader.next_step()
        assert loader.next_step().ended
    ids, mask = step.columns["input_ids"][0], step.columns["loss_mask"][0]
    assert ids.tolist() == [*doc, *[EOS] * (256 - 236)]
    # TorchTitan's labels: -100 on the vision tokens; datalane's loss mask 0 there (and padding)
    assert mask.tolist() == [*(0 if t in (START, PAD, END) else 1 for t in doc),
                             *[0] * (256 - 236)]
    # each image is a per-image row, at its own run's first placeholder: 5 + 1 and
    # 5 + 72 + 16 + 1, with its grid (70 = 7 x 10 merged tokens, 128 = 8 x 16)
    assert step.columns["image_seq"].tolist() == [0, 0]
    assert step.columns["image_offset"].tolist() == [6, 94]
    assert step.columns["image_grid_thw"].tolist() == [[1, 14, 20], [1, 16, 32]]
    assert step.columns["image_patch_start"].tolist() == [0, 280, 280 + 512]


BAD: list[tuple[list[Any], list[Any], str, str]] = [
    (["a", None], [None, b"\xff\xd8"], "image_truncated", "entry 1: "),
    (["a", None, None, None], [None, b"x", b"y", b"z"], "too_many_images",
     r"3 images, more than max_images 2"),
    (["a", "b"], [None], "malformed_sample",
     r"the texts \(2\) and images \(1\) are not two lists of one length"),
    (["a", "b"], [None, b"x"], "malformed_sample", r"entry 1 holds both a text and an image"),
    (["a", None], [None, None], "malformed_sample",
     r"entry 1 holds neither a text nor an image"),
    ([], [], "malformed_sample", r"the document has no entries"),
    (["<|image_pad|> here", None], [None, b"x"], "vision_token_in_text",
     r"entry 0 holds the vision token '<\|image_pad\|>'"),
]


def test_bad_rows_are_bad_records_by_reason(tmp_path: Path) -> None:
    rows = [(TEXTS, _images())]
    for texts, images, _, _ in BAD:
        rows.append((texts, [hostile_images()["truncated_jpeg"][0] if i == b"\xff\xd8"
                             else i for i in images]))
    path = write_interleaved(tmp_path / "docs.parquet", rows)
    with Loader(_recipe(path, interleaved={"max_images": 2}), 0, 1) as loader:
        assert loader.next_step().columns["input_ids"][0, 0] != EOS
        assert loader.next_step().ended
        counters = loader.counters()
    assert counters.kept == 1
    assert counters.skipped == {"image_truncated": 1, "too_many_images": 1,
                                "malformed_sample": 4, "vision_token_in_text": 1}


@pytest.mark.parametrize(("row", "match"), [(b, b[3]) for b in BAD[1:]])
def test_under_fail_a_bad_row_is_named_with_the_file_and_row(tmp_path: Path, row: Any,
                                                             match: str) -> None:
    path = write_interleaved(tmp_path / "docs.parquet", [(TEXTS, _images()), (row[0], row[1])])
    with pytest.raises(DataError, match=rf"source 'docs': {match} in {path} at row 1"), \
            Loader(_recipe(path, interleaved={"max_images": 2}, bad_records="fail"),
                   0, 1) as loader:
        for _ in range(3):
            loader.next_step()


def test_a_too_many_images_row_is_set_aside_before_any_image_is_decoded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane.engine.documents import vision  # VisionKind.image, which both kinds use

    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("an image was processed")

    monkeypatch.setattr(vision, "process", never)
    path = write_interleaved(tmp_path / "docs.parquet", [(["a", None, None], [None, b"x", b"y"])])
    with pytest.raises(DataError, match=r"\(too_many_images=1\)"), \
            Loader(_recipe(path, interleaved={"max_images": 1}, bad_records="fail"),
                   0, 1) as loader:
        loader.next_step()


@pytest.mark.parametrize(("change", "match"), [
    ({"uris": ["x.tar"]}, r"sources\[0\]\.interleaved: .* the webdataset format does not do; "
                          r"use hf or parquet files"),
    ({"interleaved": {"max_images": 0}}, r"sources\[0\]\.interleaved\.max_images 0 must be >= 1"),
    ({"interleaved": {"texts_field": "c", "images_field": "c"}},
     r"sources\[0\]\.interleaved\.texts_field and images_field both name the column 'c'"),
    ({"interleaved": {"resize": {"size": [64, 100]}}},
     r"sources\[0\]\.interleaved\.resize\.size \[64, 100\] is not \[height, width\]"),
])
def test_bad_interleaved_settings_are_refused_naming_the_field(change: dict[str, Any],
                                                               match: str) -> None:
    source = {"name": "p", "uris": ["x.parquet"], "interleaved": {}, **change}
    with pytest.raises(ConfigError, match=match):
        load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 64,
                     "tokenizer": {"uri": "t.json"}, "packing": {"algorithm": "bestfit"},
                     "sources": [source]})


def test_a_save_to_disk_dataset_of_image_lists_gives_the_same_document(tmp_path: Path) -> None:
    """HF's ``List(Image())`` feature (a list of ``{bytes, path}`` structs) reads as the
    Parquet list<binary> row does; a path-only image in a list is ``image_not_embedded``,
    naming the entry."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"texts": datasets.List(datasets.Value("string")),
                                  "images": datasets.List(datasets.Image())})
    images = [None if b is None else {"bytes": b, "path": None} for b in _images()]
    ds = datasets.Dataset.from_dict({"texts": [TEXTS], "images": [images]}, features=features)
    ds.save_to_disk(str(tmp_path / "hf"))
    write_interleaved(tmp_path / "docs.parquet", [(TEXTS, _images())])
    got = []
    for path in (tmp_path / "hf", tmp_path / "docs.parquet"):
        with Loader(_recipe(path), 0, 1) as loader:
            got.append(loader.next_step().columns["input_ids"][0].tolist())
    assert got[0] == got[1] and got[0][5:7] == [START, PAD]
    # a path-only struct after a good row: written as Arrow directly (save_to_disk embeds the
    # files it names)
    table = pa.table({
        "texts": pa.array([TEXTS, ["a", None]], pa.list_(pa.string())),
        "images": pa.array([images, [None, {"bytes": None, "path": "p/1.jpg"}]],
                           pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())])))})
    arrow = tmp_path / "docs.arrow"
    with pa.ipc.new_stream(arrow, table.schema) as w:
        w.write_table(table)
    with pytest.raises(DataError, match=r"column 'images'\[1\] holds the path 'p/1\.jpg' and no "
                                        rf"image bytes .* in {arrow} at row 1"), \
            Loader(_recipe(arrow, bad_records="fail"), 0, 1) as loader:
        for _ in range(3):
            loader.next_step()
