"""A source file that changes after the plan was made is an error naming it, never fewer
documents or a parsing library's error.

Object stores overwrite objects in place. Every file a reader opens is compared with what the
plan listed - its size, and its ETag or modification time - once per open
(``files.open_file``). Before that, a JSONL token source truncated after planning delivered
225 of 300 documents and ended normally, a Parquet file raised a raw ArrowInvalid, and a
Megatron ``.bin`` rewritten with other tokens of the same size was read silently.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datalane import DataError, Knobs, Loader, load_recipe
from datalane.corpus import tokenizer_path
from datalane.engine.formats.flatbin import write_flat
from datalane.engine.formats.megatron import write_dataset
from datalane.engine.plan import Plan


def recipe(source: dict[str, Any]) -> Any:
    return load_recipe({"lanes": 1, "global_batch_size": 2, "seq_len": 32, "seed": 1,
                        "tokenizer": {"uri": tokenizer_path()},
                        "sources": [{"name": "s", "epochs": 1, **source}],
                        "shuffle": {"block_size": 4}})


def drain(loader: Loader, max_steps: int = 5000) -> int:
    for n in range(max_steps):
        if loader.next_step().ended:
            return n
    raise AssertionError("the stream did not end")


def ids(n: int) -> list[list[int]]:
    rng = np.random.default_rng(2)
    return [[0, *rng.integers(3, 1000, size=int(rng.integers(5, 40))).tolist(), 1]
            for _ in range(n)]


def changed(path: Path, planned: int, now: int) -> str:
    return (f"{path} changed after the plan was made: the plan saw {planned} bytes "
            f"(mtime=")


def rewrite(path: Path, data: bytes) -> None:
    """New content; the modification time moved on as a later write would move it."""
    before = path.stat().st_mtime_ns
    path.write_bytes(data)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def test_a_jsonl_token_source_truncated_after_planning_fails_naming_the_file(
        tmp_path: Path) -> None:
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in ids(300)))
    size = path.stat().st_size
    with Loader(recipe({"uris": [str(path)], "tokens": {}, "chunk_bytes": 2048}), 0, 1,
                Knobs(workers=1)) as loader:
        loader.next_step()
        with open(path, "r+b") as f:
            f.truncate(size * 3 // 4)
        with pytest.raises(DataError) as info:
            drain(loader)
    message = str(info.value)
    assert message.startswith(changed(path, size, size * 3 // 4)), message
    assert f"the file now has {size * 3 // 4} bytes" in message


@pytest.mark.parametrize("how", ["truncated", "rewritten"])
def test_a_parquet_file_changed_after_planning_fails_naming_the_file(tmp_path: Path,
                                                                    how: str) -> None:
    path = tmp_path / "t.parquet"
    table = pa.table({"text": [f"document number {i} " * 3 for i in range(200)]})
    pq.write_table(table, path, row_group_size=20)
    size = path.stat().st_size
    plan = Plan.build(recipe({"uris": [str(path)], "chunk_rows": 10}))
    data = path.read_bytes()
    if how == "truncated":
        rewrite(path, data[:size // 2])
    else:  # another file of the same size: only the identity tells
        rewrite(path, data[:100] + bytes(b ^ 0xFF for b in data[100:200]) + data[200:])
    with pytest.raises(DataError) as info, Loader(plan.recipe, 0, 1, plan=plan) as loader:
        drain(loader)
    assert str(info.value).startswith(changed(path, size, 0)), str(info.value)


def test_a_megatron_bin_rewritten_after_planning_fails_naming_it(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "m"), ids(60), "uint16")
    plan = Plan.build(recipe({"uris": [str(tmp_path / "m.idx")], "tokens": {},
                              "chunk_rows": 5}))
    bin_ = tmp_path / "m.bin"
    data = bin_.read_bytes()
    rewrite(bin_, data[::-1])  # the same size, other tokens
    with pytest.raises(DataError) as info, Loader(plan.recipe, 0, 1, plan=plan) as loader:
        drain(loader)
    assert str(info.value).startswith(changed(bin_, len(data), len(data))), str(info.value)


def test_a_flat_token_file_truncated_after_planning_fails_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "f.u16"
    write_flat(str(path), ids(80), "uint16")
    size = path.stat().st_size
    plan = Plan.build(recipe({"uris": [str(path)], "tokens": {"boundary": 1},
                              "chunk_bytes": 256}))
    rewrite(path, path.read_bytes()[:size - 64])
    with pytest.raises(DataError) as info, Loader(plan.recipe, 0, 1, plan=plan) as loader:
        drain(loader)
    assert str(info.value).startswith(changed(path, size, size - 64)), str(info.value)
    assert f"the file now has {size - 64} bytes" in str(info.value)


def test_an_object_overwritten_on_s3_after_planning_fails_naming_it(
        tmp_path: Path, s3_bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check asks the store (a HEAD), not the listing fsspec kept from planning."""
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_bucket.endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    lines = "".join(json.dumps({"text": f"line {i:04d}"}) + "\n" for i in range(400))
    uri = f"{s3_bucket.uri}/web.jsonl"
    fs.pipe(uri, lines.encode())
    plan = Plan.build(recipe({"uris": [f"{s3_bucket.uri}/*.jsonl"], "chunk_bytes": 1024}))
    fs.pipe(uri, lines.replace("line", "LINE").encode())  # same size, another ETag
    with pytest.raises(DataError) as info, Loader(plan.recipe, 0, 1, plan=plan) as loader:
        drain(loader)
    message = str(info.value)
    assert message.startswith(f"{uri} changed after the plan was made: the plan saw "
                              f"{len(lines)} bytes (ETag="), message
    assert f"the file now has {len(lines)} bytes (ETag=" in message


def _container(tmp_path: Path, fmt: str) -> tuple[Path, dict[str, Any]]:
    """A small dataset of ``fmt``, the file a rewrite should change, and its recipe source."""
    from tests.support.mdsbytes import text_dataset
    from tests.support.tarbytes import write_tar

    texts = [f"document number {i} " * 4 for i in range(40)]
    if fmt == "webdataset":
        path = tmp_path / "s.tar"
        write_tar(path, [(f"{i:04d}.txt", t.encode()) for i, t in enumerate(texts)])
        return path, {"uris": [str(path)], "format": "webdataset", "text_field": "txt"}
    if fmt == "mds":
        root = text_dataset(tmp_path / "mds", texts)
        return root / "shard.00000.mds", {"uris": [str(root)], "text_field": "text"}
    path = tmp_path / "data.arrow"
    with pa.ipc.new_stream(str(path), pa.schema([("text", pa.string())])) as w:
        for k in range(0, 40, 10):
            w.write_batch(pa.record_batch([pa.array(texts[k:k + 10])], names=["text"]))
    return path, {"uris": [str(path)], "format": "hf"}


@pytest.mark.parametrize("fmt", ["webdataset", "mds", "hf"])
def test_a_dataset_file_rewritten_after_planning_fails_naming_it(tmp_path: Path,
                                                                 fmt: str) -> None:
    # The same size, other bytes in one document: only the file's identity tells.
    path, source = _container(tmp_path, fmt)
    plan = Plan.build(recipe({**source, "chunk_rows": 5}))
    data = path.read_bytes()
    at = data.index(b"number 7 ")
    rewrite(path, data[:at] + b"NUMBER 7 " + data[at + 9:])
    with pytest.raises(DataError) as info, Loader(plan.recipe, 0, 1, plan=plan) as loader:
        drain(loader)
    assert str(info.value).startswith(changed(path, len(data), len(data))), str(info.value)
