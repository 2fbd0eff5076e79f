"""Sources on object storage are read about once: the bytes fetched are the files' bytes.

Lanes read a source in chunks (1 MiB by default, in a shuffled order), so a remote file is
entered at many offsets. fsspec's default for s3fs is 50 MiB of read-ahead on every read
outside its cache: each chunk a lane started fetched up to 50 MiB more, about 23 times the
bytes of a 100 MB token file in the pre-tokenized benchmark. Files read in explicit ranges
(token windows, JSONL chunks, Parquet column chunks) now fetch exactly their ranges; files
read as streams fetch 4 MiB at a time.

A real S3 endpoint (moto's server on loopback, through botocore and s3fs) serves a Megatron
dataset, a JSONL file and a Parquet file cut into many small chunks; every step of a run over
them equals the run over the same files on local disk, and the bytes fetched (counted at
s3fs's one fetch function) are the files' bytes: exactly for the token file, within 15% for
JSONL (the reads that finish each chunk's last line), and Parquet's footer once per open.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datalane import Knobs, Loader, load_recipe
from datalane.corpus import tokenizer_path
from datalane.engine.formats.megatron import write_dataset


def write_sources(root: Path) -> list[Path]:
    rng = np.random.default_rng(4)
    docs = [rng.integers(3, 1024, size=int(rng.integers(50, 400))) for _ in range(2500)]
    write_dataset(str(root / "meg"), docs, "uint16")
    words = ["lane", "shard", "token", "batch", "epoch", "mixture", "resume", "sidecar"]
    with open(root / "web.jsonl", "w") as f:
        for i in range(4000):
            f.write(json.dumps({"text": " ".join(words[(i * j) % 8] for j in range(
                20 + i % 80))}) + "\n")
    pq.write_table(pa.table({"input_ids": pa.array([d.tolist() for d in docs[:1500]],
                                                   pa.list_(pa.int32()))}),
                   root / "ids.parquet", row_group_size=100)
    return [root / "meg.idx", root / "meg.bin", root / "web.jsonl", root / "ids.parquet"]


def recipe(where: str) -> Any:
    return load_recipe({
        "lanes": 4, "global_batch_size": 8, "seq_len": 256, "seed": 9,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [
            {"name": "meg", "uris": [f"{where}/meg.idx"], "tokens": {}, "weight": 2,
             "chunk_bytes": 32 << 10},
            {"name": "web", "uris": [f"{where}/web.jsonl"], "chunk_bytes": 32 << 10},
            {"name": "pq", "uris": [f"{where}/ids.parquet"], "tokens": {}},
        ],
    })


def run(where: str) -> list[str]:
    with Loader(recipe(where), 0, 1, Knobs(workers=2)) as loader:
        hashes = []
        while True:
            step = loader.next_step()
            hashes.append(step.global_hash())
            if step.ended:
                return hashes


def test_a_remote_source_is_fetched_once_and_reads_as_the_local_one(
        tmp_path: Path, s3_bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs
    import s3fs.core

    files = write_sources(tmp_path)
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    for path in files:
        fs.put(str(path), f"{s3_bucket.name}/{path.name}")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_bucket.endpoint)
    s3fs.S3FileSystem.clear_instance_cache()  # sources reach the endpoint through the env
    fetched: dict[str, int] = {}
    fetch = s3fs.core.S3File._fetch_range

    def counted(self: Any, start: int, end: int) -> bytes:
        got: bytes = fetch(self, start, end)
        name = self.path.rsplit("/", 1)[-1]
        fetched[name] = fetched.get(name, 0) + len(got)
        return got

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counted)
    local = run(str(tmp_path))
    assert run(s3_bucket.uri) == local, "the remote run must be the local run, step by step"
    sizes = {p.name: p.stat().st_size for p in files}
    # token windows are read exactly; a JSONL chunk reads on a few KiB to finish its last
    # line; pyarrow reads a Parquet file's last 64 KiB (its footer) once per open: the plan
    # and each of the 4 lanes
    allowed = {"meg.idx": sizes["meg.idx"], "meg.bin": sizes["meg.bin"],
               "web.jsonl": 1.15 * sizes["web.jsonl"],
               "ids.parquet": sizes["ids.parquet"] + 5 * (64 << 10)}
    over = {name: (fetched.get(name, 0), sizes[name]) for name in sizes
            if fetched.get(name, 0) > allowed[name]}
    assert not over, (
        f"bytes fetched vs file bytes: {over}; every chunk a lane starts must fetch what it "
        f"reads, not a read-ahead beyond it")
