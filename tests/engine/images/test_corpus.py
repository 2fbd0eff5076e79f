"""datalane.testing.images: the same image corpus for the same arguments, in two layouts."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from datalane.engine.images import BadImage, ImageRule, decode, process, sniff
from datalane.testing.images import ImageCorpus, make_image_corpus


def _digest(paths: list[str]) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


def test_the_same_arguments_give_the_same_bytes(tmp_path: Path) -> None:
    a = make_image_corpus(str(tmp_path / "a"), images=6, seed=3, per_shard=4)
    b = make_image_corpus(str(tmp_path / "b"), images=6, seed=3, per_shard=4)
    c = make_image_corpus(str(tmp_path / "c"), images=6, seed=4, per_shard=4)
    files = [*a.shards, a.parquet, a.hostile]
    assert _digest(files) == _digest([*b.shards, b.parquet, b.hostile])
    assert _digest(a.shards) != _digest(c.shards)
    assert [Path(s).name for s in a.shards] == ["images-000000.tar", "images-000001.tar"]


def test_shards_and_parquet_hold_the_same_captioned_images(image_corpus: ImageCorpus) -> None:
    rows = pq.read_table(image_corpus.parquet).to_pylist()
    assert [r["key"] for r in rows] == image_corpus.keys
    members: dict[str, bytes] = {}
    for shard in image_corpus.shards:
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m)
                assert f is not None
                members[m.name] = f.read()
    assert len(members) == 3 * len(rows)
    exts = {r["ext"] for r in rows}
    assert exts == {"jpg", "png", "webp"}
    total = 0
    for row, (w, h) in zip(rows, image_corpus.sizes, strict=True):
        key, ext = row["key"], row["ext"]
        assert members[f"{key}.{ext}"] == row["image"]
        assert members[f"{key}.txt"].decode() == row["caption"]
        meta = json.loads(members[f"{key}.json"])
        assert (meta["width"], meta["height"], meta["caption"]) == (w, h, row["caption"])
        assert sniff(row["image"]) == {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[ext]
        assert decode(row["image"]).size == (w, h)
        total += len(row["image"])
    assert total == image_corpus.encoded_bytes


def test_the_hostile_shard_lists_each_samples_reason(image_corpus: ImageCorpus) -> None:
    reasons = json.loads(Path(image_corpus.hostile).with_name("hostile.json").read_text())
    assert {"truncated_jpeg", "bomb_header", "zero_size_png", "wrong_magic"} <= set(reasons)
    got: dict[str, str | None] = {}
    with tarfile.open(image_corpus.hostile) as tar:
        for m in tar.getmembers():
            if m.name.endswith(".img"):
                f = tar.extractfile(m)
                assert f is not None
                try:
                    patches = process(f.read(), ImageRule())
                    assert patches.values.dtype == np.uint8
                    got[m.name[:-4]] = None
                except BadImage as e:
                    got[m.name[:-4]] = e.reason
    assert got == reasons
