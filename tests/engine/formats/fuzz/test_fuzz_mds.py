"""Fuzzing the MDS reader: a dataset of two shards (an int, a text and a tag column) and its
index, mutated at the sample count, the offset table, each sample's column sizes, the column
config (sizes, encodings, names: the shard re-laid around the new config) and the index's
shard entries, and anywhere by flips, cuts and overwritten runs. See harness.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from tests.data.format_corpus import text_of
from tests.engine.formats.fuzz.harness import EDGES, Dataset, Site, fuzz
from tests.support.mdsbytes import Columns, config_of, shard_bytes

pytestmark = pytest.mark.fuzz

CASES = 300
COLUMNS: Columns = (["id", "text", "tag"], ["int", "str", "str"], [8, None, None])
U32 = st.sampled_from([n & 0xFFFFFFFF for n in EDGES]) | st.integers(0, 600)


def _samples(shard: int) -> list[list[bytes]]:
    return [[struct.pack("<q", i), text_of("mds", i).encode(), f"tag {i}".encode()]
            for i in range(4 * shard, 4 * shard + 4)]


def _u32(at: int) -> Any:
    def apply(raw: bytes, value: int) -> bytes:
        return raw[:at] + struct.pack("<I", value) + raw[at + 4:]
    return apply


def _config_site(name: str, shard: int) -> Site:
    def apply(_: bytes, change: tuple[str, int, Any]) -> bytes:
        key, i, value = change
        config = config_of(COLUMNS)
        config[key] = list(config[key])
        config[key][i] = value
        return shard_bytes(COLUMNS, _samples(shard), json.dumps(config).encode())

    values = (st.tuples(st.just("column_sizes"), st.integers(0, 2),
                        st.sampled_from([-8, 0, 7, 9, 1 << 40, "x", 1.5, None, True]))
              | st.tuples(st.just("column_encodings"), st.integers(0, 2),
                          st.sampled_from(["ndarray:foo", "pkl", "bytes", "json", "int",
                                           "str:x", "ndarray:int32:-1", "jpeg", "", "str_int",
                                           "uint32", 7]))
              | st.tuples(st.just("column_names"), st.integers(0, 2),
                          st.sampled_from(["id", "", 5, None])))
    return Site(name, "the column config", (4 + 4 * 5, 4 + 4 * 5 + 1), values, apply)


def _index_site(shards: list[tuple[str, int]]) -> Site:
    def apply(_: bytes, change: tuple[int, Any]) -> bytes:
        k, value = change
        entries: list[Any] = [{**config_of(COLUMNS), "raw_data": {"basename": n, "bytes": b},
                               "samples": 4, "zip_data": None} for n, b in shards]
        if k < 0:
            return json.dumps({"shards": value}).encode()
        entries[k]["raw_data"]["basename"] = value
        return json.dumps({"shards": entries}).encode()

    values = (st.tuples(st.integers(0, 1), st.sampled_from(
        ["../shard.00000.mds", "/etc/hostname", "", "shard.00009.mds", 5, None, "a//b",
         "shard.00001.mds"]))
        | st.tuples(st.just(-1), st.sampled_from([{}, 5, "x", [[]], [None]])))
    return Site("index.json", "an index entry", (0, 1), values, apply)


def dataset() -> Dataset:
    files: dict[str, bytes] = {}
    spans: list[tuple[str, int, int, int]] = []
    sites: list[Site] = []
    for shard in range(2):
        name = f"shard.{shard:05d}.mds"
        raw = shard_bytes(COLUMNS, _samples(shard))
        files[name] = raw
        offsets = struct.unpack_from("<5I", raw, 4)
        sites.append(Site(name, "the sample count", (0, 4), U32, _u32(0)))
        for k in range(5):
            sites.append(Site(name, f"offset {k}", (4 + 4 * k, 8 + 4 * k), U32,
                              _u32(4 + 4 * k)))
        config = (4 + 4 * 5, offsets[0])
        for j in range(4):
            spans.append((name, offsets[j], offsets[j + 1], 4 * shard + j))
            # the config lays out every sample: one that still adds up (a fixed size that
            # happens to match) reads other values, as its shard says, for any reader
            spans.append((name, *config, 4 * shard + j))
            for v in range(2):  # the sizes of the two variable columns
                at = offsets[j] + 4 * v
                sites.append(Site(name, f"sample {j}'s size {v}", (at, at + 4), U32, _u32(at)))
        sites.append(_config_site(name, shard))
    shards = [(n, len(b)) for n, b in files.items()]
    files["index.json"] = _index_site(shards).apply(b"", (0, "shard.00000.mds"))
    sites.append(_index_site(shards))
    docs = [text_of("mds", i) for i in range(8)]
    return Dataset("mds", files, "", {"chunk_rows": 2}, docs, spans, sites)


def test_fuzz_mds(tmp_path: Path) -> None:
    fuzz(dataset(), tmp_path, CASES)
