"""The vision document kind end to end: a WebDataset shard of image-caption pairs through the
recipe, the map stage and the Loader (datalane/engine/documents/vision.py, docs/vlm.md).

The hand-worked shard holds a 96 x 64 JPEG, a 512 x 256 PNG and a truncated JPEG. By
TorchTitan's rule (factor 32, min_pixels 65,536): 64 x 96 is 6,144 pixels, under the budget,
so both sides grow by sqrt(65536 / 6144) = 3.266 and round up to multiples of 32: 224 x 320,
grid (1, 14, 20), 14 * 20 / 2**2 = 70 placeholders; 256 x 512 is on the grid and in the
budget: grid (1, 16, 32), 16 * 32 / 4 = 128 placeholders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.corpus import tokenizer_path
from datalane.engine.chunks import RecordReader
from datalane.engine.formats import format_for
from datalane.engine.images import ImageRule, process
from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.spec.errors import ConfigError, DataError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe, load_recipe
from datalane.testing.images import ImageCorpus
from tests.support.vision import END, EOS, PAD, START, caption, vision_recipe


def test_the_hand_worked_shard_gives_the_exact_tokens_mask_and_counts(shard) -> None:
    path, _ = shard
    # 151 tokens a sequence: document A (1 + 70 + 1 + 8 + EOS = 81) opens a sequence, B (1 +
    # 128 + 1 + 11 + EOS = 142) does not fit beside it (70 left) and opens a second: bestfit
    # keeps both whole, so neither placeholder run is cut
    cap_a, cap_b = caption("a red square"), caption("two blue discs")
    assert (len(cap_a), len(cap_b)) == (8, 11)
    doc_a = [START, *[PAD] * 70, END, *cap_a, EOS]
    doc_b = [START, *[PAD] * 128, END, *cap_b, EOS]
    with Loader(vision_recipe([str(path)], 150), 0, 1, Knobs(workers=2)) as loader:
        steps = [loader.next_step() for _ in range(3)]
        counters = loader.counters()
    for step, doc, run in zip(steps, (doc_a, doc_b), (72, 130), strict=False):
        ids, pos, mask = (step.columns[c][0] for c in ("input_ids", "positions", "loss_mask"))
        n = len(doc)
        assert ids.tolist() == [*doc, *[EOS] * (151 - n)]  # padded with the pad id (EOS here)
        assert pos.tolist() == [*range(n), *[-1] * (151 - n)]
        # 0 on start, placeholders and end; 1 on the caption and EOS; padding 0
        assert mask.tolist() == [*[0] * run, *[1] * (n - run), *[0] * (151 - n)]
    assert steps[2].ended
    assert counters.docs == 3 and counters.kept == 2
    assert counters.skipped == {"image_truncated": 1}


def test_a_bad_image_stops_the_stream_under_fail(shard) -> None:
    path, _ = shard
    with Loader(vision_recipe([str(path)], 150, bad_records="fail"), 0, 1) as loader, \
            pytest.raises(DataError, match=r"source 'pairs': .*truncated.* in .*pairs\.tar"):
        for _ in range(3):
            loader.next_step()


def test_a_document_longer_than_a_sequence_is_set_aside_not_split(shard) -> None:
    path, _ = shard
    # B's 142 tokens do not fit 128
    with Loader(vision_recipe([str(path)], 127), 0, 1) as loader:
        first = loader.next_step()
        assert loader.next_step().ended
        counters = loader.counters()
    assert first.columns["input_ids"][0, :81].tolist()[:2] == [START, PAD]
    assert counters.skipped == {"image_truncated": 1, "too_long": 1}


def test_the_map_result_carries_each_documents_patches(shard) -> None:
    path, images = shard
    plan = Plan.build(vision_recipe([str(path)], 150))
    sp = plan.sources[0]
    stage = plan.map_stages()[0]
    reader = RecordReader(sp.files, sp.source.field, sp.source)
    records = [(0, pos, raw) for pos, raw in reader.records(sp.chunks[0])]
    got = stage.run(records, [format_for(f.format, sp.source) for f in sp.files])
    assert got.status == [None, None, "image_truncated"]
    assert got.attached is not None and got.attached[2] is None
    for k, (grid, tokens) in enumerate((((1, 14, 20), 70), ((1, 16, 32), 128))):
        (carried,) = got.attached[k]  # at the first placeholder: after vision_start (no BOS)
        assert carried.offset == 1
        patches = carried.value
        assert patches.grid_thw == grid and patches.tokens == tokens
        # one frame of 16 x 16 x 3 bytes a patch (the client repeats it), t * h * w rows
        assert patches.values.shape == (grid[1] * grid[2], 768)
        want = process(images[k], ImageRule(), repeat_frames=False)
        np.testing.assert_array_equal(patches.values, want.values)
    assert np.diff(got.offsets).tolist() == [81, 142, 0]


@pytest.mark.parametrize(("change", "match"), [
    ({"packing": {"algorithm": "wrap"}},
     r"sources\[0\]\.vision: its documents must never be split .* packing\.algorithm 'wrap'"),
    ({"sources": [{"name": "p", "uris": ["x.jsonl"], "vision": {}}]},
     r"sources\[0\]\.vision: .* the jsonl format does not do; use hf or parquet or "
     r"webdataset files"),
    ({"sources": [{"name": "p", "uris": ["x.tar"],
                   "vision": {"resize": {"min_pixels": 70000, "max_pixels": 65536}}}]},
     r"sources\[0\]\.vision\.resize\.min_pixels 70,000 is over "
     r"sources\[0\]\.vision\.resize\.max_pixels 65,536"),
    ({"sources": [{"name": "p", "uris": ["x.tar"],
                   "vision": {"resize": {"size": [64, 100]}}}]},
     r"sources\[0\]\.vision\.resize\.size \[64, 100\] is not \[height, width\], both "
     r"positive multiples of 32"),
    ({"sources": [{"name": "p", "uris": ["x.tar"], "vision": {"limits": {"max_bytes": 0}}}]},
     r"sources\[0\]\.vision\.limits\.max_bytes 0 must be >= 1"),
    ({"sources": [{"name": "p", "uris": ["x.tar"], "vision": {"image_field": ["JPG"]}}]},
     r"sources\[0\]\.vision\.image_field\[0\] 'JPG'"),
])
def test_bad_vision_settings_are_refused_naming_the_field(change: dict[str, Any],
                                                          match: str) -> None:
    base: dict[str, Any] = {"lanes": 1, "global_batch_size": 1, "seq_len": 64,
                            "tokenizer": {"uri": "t.json"}, "packing": {"algorithm": "bestfit"},
                            "sources": [{"name": "p", "uris": ["x.tar"], "vision": {}}]}
    with pytest.raises(ConfigError, match=match):
        load_recipe({**base, **change})


def test_a_tokenizer_without_the_vision_tokens_is_refused(shard) -> None:
    path, _ = shard
    with pytest.raises(ConfigError, match=r"sources\[0\]\.vision\.image_token '<\|image_pad\|>' "
                                          r"is not in the vocabulary"):
        Plan.build(vision_recipe([str(path)], 150, tokenizer=tokenizer_path()))


def _corpus_recipe(corpus: ImageCorpus, batch: int = 4, seq_len: int = 2047) -> Recipe:
    return load_recipe({
        "lanes": 2, "global_batch_size": batch, "seq_len": seq_len,
        "tokenizer": {"uri": corpus.tokenizer}, "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 4},
        "sources": [{"name": "pairs", "uris": [f"{corpus.root}/*.tar"], "vision": {},
                     "chunk_rows": 5}]})


def _windows(corpus: ImageCorpus, world: int, workers: int) -> list[list[dict[str, bytes]]]:
    """Each step's columns of every lane, lane by lane (world ranks concatenated)."""
    recipe = _corpus_recipe(corpus)
    loaders = [Loader(recipe, r, world, Knobs(workers=workers)) for r in range(world)]
    recipe_schema = loaders[0].schema
    out: list[list[dict[str, bytes]]] = []
    try:
        while True:
            steps = [ld.next_step() for ld in loaders]
            # the per-token columns (a rank's per-image columns count its own rows: the step
            # hashes compare them, tests/engine/images/test_image_columns.py)
            out.append([{n: a.tobytes() for n, a in s.columns.items()
                         if not recipe_schema.column(n).per_image} for s in steps])
            if all(s.ended for s in steps):
                break
            assert len(out) < 50
    finally:
        for ld in loaders:
            ld.close()
    return [[{n: b"".join(r[n] for r in row) for n in row[0]}] for row in out]


def test_the_generated_corpus_gives_the_same_windows_for_any_workers_and_world(
        image_corpus: ImageCorpus) -> None:
    one = _windows(image_corpus, 1, 1)
    assert _windows(image_corpus, 1, 2) == one
    assert _windows(image_corpus, 2, 2) == one
    # every image of the corpus is one whole run of its placeholder count, in some sequence
    runs: list[int] = []
    for row in one:
        ids = np.frombuffer(row[0]["input_ids"], dtype=np.int32).reshape(-1, 2048)
        for seq in ids:
            starts, ends = np.flatnonzero(seq == START), np.flatnonzero(seq == END)
            assert len(starts) == len(ends) and (starts < ends).all()
            for s, e in zip(starts, ends, strict=True):
                assert (seq[s + 1:e] == PAD).all()
                runs.append(int(e - s - 1))
            assert int((seq == PAD).sum()) == sum(int(e - s - 1) for s, e in zip(starts, ends,
                                                                                 strict=True))
    from tests.engine.images.conftest import corpus_images

    want = [process(data, ImageRule()).tokens for _, data in corpus_images(image_corpus)]
    assert sorted(runs) == sorted(want)


def test_a_restored_lane_continues_exactly(image_corpus: ImageCorpus) -> None:
    """Resumed after each step, the loader gives the steps the unbroken one gave: the
    bestfit carry-over's documents are re-read by reference (their image parts again)."""
    recipe = _corpus_recipe(image_corpus, 2, 1279)  # the largest image: 1,152 placeholders
    with Loader(recipe) as loader:
        whole, states = [], []
        while True:
            states.append(loader.state_dict())
            step = loader.next_step()
            whole.append(step.columns["input_ids"].tobytes())
            if step.ended:
                break
    assert len(whole) >= 5 and loader.counters().skipped == {}
    for k in range(1, len(whole)):
        with Loader(recipe) as again:
            again.load_state_dict(states[k])
            got = [again.next_step().columns["input_ids"].tobytes()
                   for _ in range(len(whole) - k)]
        assert got == whole[k:], f"resumed at step {k}"


def test_the_hostile_shard_is_counted_by_reason(image_corpus: ImageCorpus) -> None:
    """Every hostile image of the corpus (``hostile/``, ``.img`` members) is a bad record of the
    reason hostile.json gives it; the valid but awkward ones (CMYK, 16-bit grey, palette,
    EXIF-rotated, animated WebP) are documents."""
    import json
    from collections import Counter

    with open(Path(image_corpus.hostile).parent / "hostile.json") as f:
        reasons: dict[str, str | None] = json.load(f)
    recipe = load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 8191,
        "tokenizer": {"uri": image_corpus.tokenizer}, "packing": {"algorithm": "bestfit"},
        "sources": [{"name": "hostile", "uris": [image_corpus.hostile],
                     "vision": {"image_field": ["img"]}}]})
    with Loader(recipe, 0, 1) as loader:
        while not loader.next_step().ended:
            pass
        counters = loader.counters()
    bad = Counter(r for r in reasons.values() if r is not None)
    assert counters.skipped == dict(bad)
    assert counters.kept == sum(r is None for r in reasons.values()) == 6
