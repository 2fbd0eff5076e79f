"""Vision sources beyond WebDataset: Parquet with an image-bytes column (binary, or Hugging
Face's ``Image`` struct ``{bytes, path}``) and Hugging Face ``save_to_disk`` datasets with an
``Image`` feature give the documents the same pairs give from WebDataset
(datalane/engine/formats/columnparts.py, docs/vlm.md).

The hand-worked pairs are test_vision_kind.py's: a 96 x 64 JPEG captioned "a red square" (70
placeholders, 81 tokens with the caption and EOS), a 512 x 256 PNG captioned "two blue discs"
(128 placeholders, 142 tokens) and a truncated JPEG (``image_truncated``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datalane.engine.chunks import RecordReader
from datalane.engine.formats import format_for
from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.spec.errors import DataError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.testing.images import ImageCorpus, hostile_images
from tests.support.kinds import VISION_TOKENIZER
from tests.support.vision import END, EOS, PAD, START, caption, encoded

IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
CAPTIONS = ["a red square  \n", "two blue discs", "broken"]


def _images() -> list[bytes]:
    return [encoded(96, 64, "JPEG", 1), encoded(512, 256, "PNG", 2),
            hostile_images()["truncated_jpeg"][0]]


def _vision_recipe(uris: list[str], seq_len: int = 150, vision: dict[str, Any] | None = None,
                   **extra: Any) -> Any:
    return load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": seq_len,
        "tokenizer": {"uri": str(VISION_TOKENIZER)}, "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 1},
        "sources": [{"name": "pairs", "uris": uris,
                     "vision": {"image_field": ["image"], "text_field": "caption"}
                     if vision is None else vision}],
        **extra})


def _steps(recipe: Any, n: int) -> tuple[list[Any], Any]:
    with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:
        steps = [loader.next_step() for _ in range(n)]
        return steps, loader.counters()


def _check_hand_worked(steps: list[Any]) -> None:
    """The two good pairs as two whole sequences of 151 tokens (test_vision_kind.py's)."""
    doc_a = [START, *[PAD] * 70, END, *caption("a red square"), EOS]
    doc_b = [START, *[PAD] * 128, END, *caption("two blue discs"), EOS]
    for step, doc, run in zip(steps, (doc_a, doc_b), (72, 130), strict=False):
        ids, mask = step.columns["input_ids"][0], step.columns["loss_mask"][0]
        n = len(doc)
        assert ids.tolist() == [*doc, *[EOS] * (151 - n)]
        assert mask.tolist() == [*[0] * run, *[1] * (n - run), *[0] * (151 - n)]
    assert steps[2].ended


@pytest.mark.parametrize("struct", [False, True], ids=["binary", "image-struct"])
def test_parquet_pairs_give_the_hand_worked_documents(tmp_path: Path, struct: bool) -> None:
    images = _images()
    column = (pa.array([{"bytes": b, "path": f"{k}.jpg"} for k, b in enumerate(images)],
                       IMAGE_STRUCT) if struct else pa.array(images, pa.binary()))
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"image": column, "caption": CAPTIONS}), path)
    steps, counters = _steps(_vision_recipe([str(path)]), 3)
    _check_hand_worked(steps)
    assert counters.docs == 3 and counters.kept == 2
    assert counters.skipped == {"image_truncated": 1}


def test_a_save_to_disk_dataset_with_an_image_feature_gives_the_same_documents(
        tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "caption": datasets.Value("string")})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in _images()], "caption": CAPTIONS},
        features=features)
    ds.save_to_disk(str(tmp_path / "ds"))
    steps, counters = _steps(_vision_recipe([str(tmp_path / "ds")]), 3)
    _check_hand_worked(steps)
    assert counters.skipped == {"image_truncated": 1}


def _documents(recipe: Any) -> list[tuple[list[int], list[int]]]:
    """Every record's (input_ids, loss_mask), in file order, through the plan's map stage."""
    plan = Plan.build(recipe)
    sp = plan.sources[0]
    stage = plan.map_stages()[0]
    reader = RecordReader(sp.files, sp.source.field, sp.source)
    formats = [format_for(f.format, sp.source) for f in sp.files]
    out = []
    for chunk in sorted(sp.chunks, key=lambda c: (c.file, c.start)):
        got = stage.run([(chunk.file, pos, raw) for pos, raw in reader.records(chunk)], formats)
        assert got.status == [None] * len(got.status)
        for i in range(len(got.status)):
            lo, hi = got.offsets[i], got.offsets[i + 1]
            out.append((got.columns["input_ids"][lo:hi].tolist(),
                        got.columns["loss_mask"][lo:hi].tolist()))
    reader.close()
    return out


def test_the_corpus_reads_the_same_from_webdataset_parquet_and_hf(
        image_corpus: ImageCorpus, tmp_path: Path) -> None:
    """The generated corpus's 20 pairs (JPEG, PNG, WebP) give the same token ids and masks
    from its WebDataset shards, its Parquet file and a save_to_disk copy of that file."""
    datasets = pytest.importorskip("datasets")
    wds = _documents(_vision_recipe([f"{image_corpus.root}/*.tar"], 4095, {}))
    assert len(wds) == 20
    columns = {"image_field": ["image"], "text_field": "caption"}
    assert _documents(_vision_recipe([image_corpus.parquet], 4095, columns)) == wds
    table = pq.read_table(image_corpus.parquet)
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in table.column("image").to_pylist()],
         "caption": table.column("caption").to_pylist()},
        features=datasets.Features({"image": datasets.Image(),
                                    "caption": datasets.Value("string")}))
    ds.save_to_disk(str(tmp_path / "ds"), max_shard_size="100KB")
    assert len(list((tmp_path / "ds").glob("*.arrow"))) > 1
    assert _documents(_vision_recipe([str(tmp_path / "ds")], 4095, columns)) == wds


def _arrow(path: Path, table: pa.Table) -> None:
    with pa.ipc.new_stream(path, table.schema) as w:
        w.write_table(table, max_chunksize=2)


#: rows after a good first one, and the reason each must be set aside with
BAD_ROWS: list[tuple[str, dict[str, Any], str, str]] = [
    ("null image", {"image": None, "caption": "x"}, "missing_field",
     r"no value in column image \(the image\)"),
    ("path only", {"image": {"bytes": None, "path": "photos/1.jpg"}, "caption": "x"},
     "image_not_embedded", r"column 'image' holds the path 'photos/1\.jpg' and no image bytes "
     r"\(written without embedding its image files\)"),
    ("null caption", {"image": {"bytes": b"\xff\xd8", "path": None}, "caption": None},
     "missing_field", r"no value in column caption \(the text\)"),
]


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_bad_values_are_bad_records_by_reason_naming_the_file_and_row(tmp_path: Path,
                                                                      fmt: str) -> None:
    good = {"image": {"bytes": _images()[0], "path": None}, "caption": "a red square"}
    table = pa.Table.from_pylist([good, *(r for _, r, _, _ in BAD_ROWS)],
                                 pa.schema([("image", IMAGE_STRUCT), ("caption", pa.string())]))
    path = tmp_path / ("pairs.parquet" if fmt == "parquet" else "pairs.arrow")
    pq.write_table(table, path) if fmt == "parquet" else _arrow(path, table)
    steps, counters = _steps(_vision_recipe([str(path)]), 2)
    assert steps[0].columns["input_ids"][0, :2].tolist() == [START, PAD]
    assert steps[1].ended
    assert counters.skipped == {"missing_field": 2, "image_not_embedded": 1}
    for k, (_, row, _, detail) in enumerate(BAD_ROWS):  # under fail: each alone after `good`
        cut = pa.Table.from_pylist([good, row], table.schema)
        bad = tmp_path / f"row{k}{path.suffix}"
        pq.write_table(cut, bad) if fmt == "parquet" else _arrow(bad, cut)
        with pytest.raises(DataError, match=rf"{detail} in {bad} at row 1"):
            _steps(_vision_recipe([str(bad)], bad_records="fail"), 2)


@pytest.mark.parametrize(("column", "shown"), [
    (pa.array([7, 8], pa.int64()), "int64"),
    (pa.array(["a.jpg", "b.jpg"], pa.string()), "string"),
    (pa.array([[b"x"], [b"y"]], pa.list_(pa.binary())), r"list<(item|element): binary>"),
])
@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_an_image_column_of_a_wrong_type_is_wrong_type_in_every_row(
        tmp_path: Path, fmt: str, column: pa.Array, shown: str) -> None:
    table = pa.table({"image": column, "caption": ["a", "b"]})
    path = tmp_path / ("pairs.parquet" if fmt == "parquet" else "pairs.arrow")
    pq.write_table(table, path) if fmt == "parquet" else _arrow(path, table)
    # under skip, a source whose first records are all bad stops naming their reasons
    with pytest.raises(DataError, match=rf"none of the first 2 records .* \(wrong_type=2\); "
                                        rf".* \(in {path}\)"):
        _steps(_vision_recipe([str(path)]), 1)
    want = (rf"column 'image' is {shown}, not binary or an Image struct \{{bytes, path\}}.* "
            rf"in {path} at row 0")
    with pytest.raises(DataError, match=want):
        _steps(_vision_recipe([str(path)], bad_records="fail"), 1)


def test_two_image_columns_of_one_row_are_a_malformed_sample(tmp_path: Path) -> None:
    jpeg, png = _images()[:2]
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"jpg": [jpeg, None, jpeg], "png": [None, png, png],
                             "txt": ["a red square", "two blue discs", "both"]}), path)
    plan = Plan.build(_vision_recipe([str(path)], vision={"image_field": ["jpg", "png"]}))
    sp = plan.sources[0]
    reader = RecordReader(sp.files, sp.source.field, sp.source)
    fmt = format_for("parquet", sp.source)
    got = [fmt.decode(raw, sp.source.field) for _, raw in reader.records(sp.chunks[0])]
    assert [g[0] for g in got[:2]] == [{"image": jpeg, "text": "a red square"},
                                       {"image": png, "text": "two blue discs"}]
    assert got[2] == (None, "malformed_sample",
                      "the row has values in 2 image columns (jpg, png); it may hold one")


def test_an_image_over_the_record_bound_is_too_large_and_never_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane.engine.formats import columnparts

    monkeypatch.setattr(columnparts, "MAX_RECORD_BYTES", 1000)
    path = tmp_path / "pairs.arrow"
    images = [bytes(999), bytes(1001)]
    _arrow(path, pa.table({"image": pa.array([{"bytes": b, "path": "p"} for b in images],
                                             IMAGE_STRUCT), "caption": ["a", "b"]}))
    plan = Plan.build(_vision_recipe([str(path)]))
    sp = plan.sources[0]
    reader = RecordReader(sp.files, sp.source.field, sp.source)
    fmt = format_for("hf", sp.source)
    got = [fmt.decode(raw, sp.source.field) for _, raw in reader.records(sp.chunks[0])]
    assert got[0] == ({"image": images[0], "text": "a"}, None, None)
    # the path counts too (a record's bytes); the detail names the contract's bound (the test
    # lowered the reader's)
    assert got[1][1:] == ("too_large", "column 'image': a value of 1,002 bytes, over the limit "
                                       "of 67,108,864 bytes per record")
    assert np.sum([g[1] is None for g in got]) == 1
