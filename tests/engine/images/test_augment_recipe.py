"""Augmentation declared in the recipe (``vision.augment`` / ``interleaved.augment``), through
the real kinds, map stage, lanes and Loader (datalane/engine/documents/vision.py, docs/vlm.md,
Augmentation).

Each image's crop and flip are the words of ``(seed, "image-augment", lane, source, file,
position, image)``: the recipe's seed, the lane that reads the record, the source's name, the
record's file index and position, the image's index in its document. The expected pixels here
are made by hand from those words: PIL's own crop of :func:`crop_box`'s box and mirror, saved
as PNG (lossless) and run through the pipeline without augmentation.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from datalane.engine.chunks import RecordReader
from datalane.engine.documents.base import DocKey
from datalane.engine.formats import format_for
from datalane.engine.images import Augment, ImageRule, Patches, process
from datalane.engine.images.augment import crop_box
from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.engine.rng import words
from datalane.spec.errors import MismatchError
from datalane.spec.fingerprint import check_fingerprint
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe, load_recipe
from datalane.testing.images import CHATML_TEMPLATE, ImageCorpus
from tests.support.kinds import VISION_TOKENIZER
from tests.support.vision import encoded, vision_recipe, write_shard

AUG = Augment(crop=0.5, flip=0.5)
WIDE, SQUARE = encoded(512, 256, "PNG", 2), encoded(64, 64, "PNG", 3)


def _by_hand(data: bytes, aug: Augment, *key: object) -> tuple[tuple[int, ...], bool, Patches]:
    """The crop box, the flip and the patches of ``data`` augmented with the words of ``key``
    (``seed, lane, source, file, position, image``), made without the augment code path."""
    seed, lane, *document = key
    draws = words(3, seed, "image-augment", lane, *document)
    image = Image.open(io.BytesIO(data)).convert("RGB")
    box = crop_box(image.width, image.height, aug, draws)
    image = image.crop(box)
    flipped = draws[2] % 65536 < round(aug.flip * 65536)
    if flipped:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return box, flipped, process(buf.getvalue(), ImageRule(), repeat_frames=False)


def _two_shards(tmp_path: Path) -> list[str]:
    """a.tar: the 512 x 256 PNG ("two blue discs"); b.tar: the 64 x 64 PNG ("a dark sky");
    each sample's header at byte 0 of its shard."""
    write_shard(tmp_path / "a.tar", [[("png", WIDE), ("txt", b"two blue discs")]])
    write_shard(tmp_path / "b.tar", [[("png", SQUARE), ("txt", b"a dark sky")]])
    return [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")]


def _augmented(uris: list[str], augment: dict[str, Any] | None, **extra: Any) -> Recipe:
    vision: dict[str, Any] = {} if augment is None else {"augment": augment}
    return vision_recipe(uris, 150, **{"seed": 7, "sources": [
        {"name": "pairs", "uris": uris, "vision": vision}], **extra})


def test_the_hand_worked_boxes_and_flips_through_the_map_stage(tmp_path: Path) -> None:
    """The words ``w`` of (7, lane, 'pairs', file 0, position 0, image 0), crop 0.5 of the 512 x
    256 PNG (smallest crop 256 x 128; step = w0 % 65537, scale in 65,536 steps):

    * lane 0: step 31,053: 256 + 256 * 31053 // 65536 = 377 wide, 128 + 60 = 188 high; left
      (w1 >> 32) % (512 - 377 + 1) = 4293554020 % 136 = 20, top (w1 & 0xFFFFFFFF) % 69 =
      200564616 % 69 = 39: box (20, 39, 397, 227); w2 % 65536 = 59,064, not under 32,768: no
      flip;
    * lane 1 (the same record; the lane is in the key): step 61,172: 494 x 247 at
      3794082 % 19 = 10, 2581800863 % 10 = 3: box (10, 3, 504, 250); 14,811: flipped."""
    uris = _two_shards(tmp_path)
    plan = Plan.build(_augmented(uris, {"crop": 0.5, "flip": 0.5}))
    sp = plan.sources[0]
    stage = plan.map_stages()[0]
    assert sp.kind.keyed and (stage.seed, stage.source) == (7, "pairs")
    reader = RecordReader(sp.files, sp.source.field, sp.source)
    records = [(0, pos, raw) for pos, raw in reader.records(sp.chunks[0])]
    assert [pos for _, pos, _ in records] == [0]
    formats = [format_for(f.format, sp.source) for f in sp.files]
    want = {lane: _by_hand(WIDE, AUG, 7, lane, "pairs", 0, 0, 0) for lane in (0, 1)}
    assert want[0][:2] == ((20, 39, 397, 227), False)
    assert want[1][:2] == ((10, 3, 504, 250), True)
    for lane in (0, 1):
        got = stage.run(records, formats, lane)
        assert got.status == [None] and got.attached is not None
        (attached,) = got.attached[0] or ()
        assert attached.value.grid_thw == want[lane][2].grid_thw
        np.testing.assert_array_equal(attached.value.values, want[lane][2].values)
    # without augmentation the image is the whole PNG, on the grid: (1, 16, 32)
    assert process(WIDE, ImageRule()).grid_thw == (1, 16, 32) != want[0][2].grid_thw


def test_each_lane_draws_its_own_records_pixels_in_a_loader(tmp_path: Path) -> None:
    """Two lanes, one shard each (as the plan deals them): step 0 holds lane 0's document in
    row 0, lane 1's in row 1, each image augmented with its own lane's and file's words."""
    uris = _two_shards(tmp_path)
    recipe = _augmented(uris, {"crop": 0.5, "flip": 0.5}, lanes=2, global_batch_size=2)
    plan = Plan.build(recipe)
    files = [plan.sources[0].lane_chunks(lane, 0)[0].file for lane in (0, 1)]
    assert sorted(files) == [0, 1]
    want = [_by_hand((WIDE, SQUARE)[f], AUG, 7, lane, "pairs", f, 0, 0)[2]
            for lane, f in enumerate(files)]
    with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:
        step = loader.next_step()
    assert step.columns["image_seq"].tolist() == [0, 1]
    assert step.columns["image_grid_thw"].tolist() == [list(w.grid_thw) for w in want]
    np.testing.assert_array_equal(step.columns["image_patches"],
                                  np.concatenate([w.values for w in want]))


def _two_draws_of_wide(recipe: Recipe, seed: int, source: str) -> None:
    """The first step holds record 0 of ``source`` with WIDE as its images 0 and 1, each
    augmented from its own words (lane 0, file 0, position 0, the image's index)."""
    want = [_by_hand(WIDE, AUG, seed, 0, source, 0, 0, k) for k in (0, 1)]
    assert want[0][0] != want[1][0]
    with Loader(recipe, 0, 1) as loader:
        step = loader.next_step()
    assert step.columns["image_grid_thw"].tolist() == [list(w[2].grid_thw) for w in want]
    np.testing.assert_array_equal(step.columns["image_patches"],
                                  np.concatenate([w[2].values for w in want]))


def test_each_image_of_an_interleaved_document_has_its_own_draw(tmp_path: Path) -> None:
    """The same PNG twice in one row: image 0 and image 1 are drawn from their own words
    (the image's index is the key's last part), so their crops differ."""
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({
        "texts": pa.array([["look", None, "and", None]], pa.list_(pa.string())),
        "images": pa.array([[None, WIDE, None, WIDE]], pa.list_(pa.binary()))}), path)
    recipe = load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 511, "seed": 3,
        "tokenizer": {"uri": str(VISION_TOKENIZER)}, "packing": {"algorithm": "bestfit"},
        "sources": [{"name": "docs", "uris": [str(path)],
                     "interleaved": {"augment": {"crop": 0.5, "flip": 0.5}}}]})
    _two_draws_of_wide(recipe, 3, "docs")


def test_each_image_of_a_llava_record_has_its_own_draw(tmp_path: Path) -> None:
    """A LLaVA record naming the same PNG twice: each image is drawn from its own words, the
    record's key being its JSONL line's byte offset (0) and the image's index in the record."""
    (tmp_path / "wide.png").write_bytes(WIDE)
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"image": ["wide.png", "wide.png"], "conversations": [
        {"from": "human", "value": "<image> and <image>"}, {"from": "gpt", "value": "Two."}]})
        + "\n")
    recipe = load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 1023, "seed": 5,
        "tokenizer": {"uri": str(VISION_TOKENIZER)}, "packing": {"algorithm": "bestfit"},
        "sources": [{"name": "talk", "uris": [str(path)], "llava": {
            "template_text": CHATML_TEMPLATE, "augment": {"crop": 0.5, "flip": 0.5}}}]})
    _two_draws_of_wide(recipe, 5, "talk")


def test_a_recipe_without_augmentation_keeps_its_fingerprint_and_columns(tmp_path: Path) -> None:
    """Leaving ``augment`` out, declaring it empty or at its identity (crop 1, flip 0) is one
    recipe: one fingerprint, no key built (the kind is not keyed), the same columns; a declared
    crop changes the fingerprint, and a resume across the change is refused naming it."""
    uris = _two_shards(tmp_path)
    plain = Plan.build(_augmented(uris, None))
    assert not plain.sources[0].kind.keyed
    assert "augment" not in plain.fingerprint_doc["recipe"]["sources"][0]["vision"]  # type: ignore[index]
    for same in ({}, {"crop": 1, "flip": 0}):
        assert Plan.build(_augmented(uris, same)).fingerprint == plain.fingerprint

    def columns(recipe: Recipe) -> list[dict[str, bytes]]:
        with Loader(recipe, 0, 1) as loader:
            return [{n: a.tobytes() for n, a in loader.next_step().columns.items()}
                    for _ in range(2)]

    assert columns(_augmented(uris, {})) == columns(_augmented(uris, None))
    cropped = Plan.build(_augmented(uris, {"crop": 0.9}))
    with pytest.raises(MismatchError, match=r"sources\[0\]\.vision\.augment"):
        check_fingerprint(plain.fingerprint, plain.fingerprint_doc, cropped.fingerprint,
                          cropped.fingerprint_doc, "the checkpoint")


def test_a_kind_that_augments_needs_the_records_key(tmp_path: Path) -> None:
    plan = Plan.build(_augmented(_two_shards(tmp_path), {"flip": 1.0}))
    kind = plan.sources[0].kind
    value = {"image": SQUARE, "text": "a dark sky"}
    with pytest.raises(ValueError, match="only with its DocKey"):
        kind.render(value)
    doc, _, _ = kind.render(value, DocKey(7, 0, "pairs", 1, 0))
    assert doc is not None
    mirror = encoded(64, 64, "PNG", 3)
    flipped = Image.open(io.BytesIO(mirror)).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buf = io.BytesIO()
    flipped.save(buf, "PNG")
    np.testing.assert_array_equal(doc.value.values,
                                  process(buf.getvalue(), ImageRule(), repeat_frames=False).values)


# -- any world, any workers, any restore ----------------------------------------------------------


def _corpus_recipe(corpus: ImageCorpus, lanes: int, batch: int, seq_len: int) -> Recipe:
    return load_recipe({
        "lanes": lanes, "global_batch_size": batch, "seq_len": seq_len, "seed": 5,
        "tokenizer": {"uri": corpus.tokenizer}, "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 4},
        "sources": [{"name": "pairs", "uris": [f"{corpus.root}/*.tar"], "chunk_rows": 5,
                     "vision": {"augment": {"crop": 0.6, "flip": 0.5}}}]})


def _run(recipe: Recipe, world: int, workers: int) -> list[dict[str, bytes]]:
    """Every step: the per-token columns of every row and the images' grids and patch rows,
    ranks one after another (the global batch)."""
    loaders = [Loader(recipe, r, world, Knobs(workers=workers)) for r in range(world)]
    out: list[dict[str, bytes]] = []
    try:
        while True:
            steps = [ld.next_step() for ld in loaders]
            names = [n for n in steps[0].columns
                     if not loaders[0].schema.column(n).per_image] + [
                "image_grid_thw", "image_patches"]
            out.append({n: b"".join(s.columns[n].tobytes() for s in steps) for n in names})
            if all(s.ended for s in steps):
                return out
            assert len(out) < 50
    finally:
        for ld in loaders:
            ld.close()


def test_the_same_augmented_pixels_for_any_world_and_workers(image_corpus: ImageCorpus) -> None:
    recipe = _corpus_recipe(image_corpus, 4, 4, 2047)
    one = _run(recipe, 1, 1)
    assert _run(recipe, 1, 2) == one
    assert _run(recipe, 2, 1) == one
    assert _run(recipe, 4, 2) == one
    # augmented: the crops change the grids of the corpus's images (as sorted placeholder counts)
    from tests.engine.images.conftest import corpus_images

    grids = np.concatenate([np.frombuffer(s["image_grid_thw"], np.int32) for s in one])
    got = sorted(int(t * h * w) // 4 for t, h, w in grids.reshape(-1, 3))
    plain = sorted(process(data, ImageRule()).tokens for _, data in corpus_images(image_corpus))
    assert len(got) == len(plain) and got != plain


def test_a_restored_augmented_loader_continues_byte_equal(image_corpus: ImageCorpus) -> None:
    """Resumed after each step, two lanes: the bestfit carry-over's documents are re-read by
    reference in their own lane, and drawn again from the same key."""
    recipe = _corpus_recipe(image_corpus, 2, 2, 1279)
    with Loader(recipe) as loader:
        whole, states = [], []
        while True:
            states.append(loader.state_dict())
            step = loader.next_step()
            whole.append({n: a.tobytes() for n, a in step.columns.items()})
            if step.ended:
                break
    assert len(whole) == 4 and loader.counters().skipped == {}
    # lane 1's open sequences hold documents after step 0: restored, lane 1 re-reads them
    assert states[1]["lanes"]["1"]["pack"]["bestfit"]["bins"]
    for k in range(1, len(whole)):
        with Loader(recipe) as again:
            again.load_state_dict(states[k])
            got = [{n: a.tobytes() for n, a in again.next_step().columns.items()}
                   for _ in range(len(whole) - k)]
        assert got == whole[k:], f"resumed at step {k}"
