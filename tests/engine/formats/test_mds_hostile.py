"""Hostile MDS datasets: encodings the reader does not know, indexes nested past the parser's
limit or naming shards outside the dataset, negative fixed column sizes, column sizes that do
not add up, samples that claim gigabytes. Each is a ConfigError or DataError naming the file
and the field, or a counted bad record with every other document intact."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane import ConfigError, DataError
from datalane.engine.plan import Plan
from datalane.spec.limits import MAX_RECORD_BYTES
from datalane.spec.state import Counters
from tests.data.format_corpus import text_of
from tests.support.common import bounded, drain, expected, fail_message, one_lane
from tests.support.mdsbytes import TEXT_ONLY, shard_bytes, text_dataset, write_index

GOOD = [text_of("mds", i) for i in range(4)]


def _read(root: Path, **source: Any) -> tuple[np.ndarray, Counters]:
    return bounded(lambda: drain(one_lane([str(root)], **source)), 60)


def test_the_dataset_writer_of_these_tests_is_read_as_written(tmp_path: Path) -> None:
    tokens, _ = _read(text_dataset(tmp_path / "ds", GOOD))
    np.testing.assert_array_equal(tokens, expected(GOOD))


def test_an_ndarray_column_of_an_unknown_dtype_is_refused(tmp_path: Path) -> None:
    columns = (["id", "ids"], ["int", "ndarray:foo"], [8, None])
    root = tmp_path / "ds"
    root.mkdir()
    raw = shard_bytes(columns, [[struct.pack("<q", i), np.arange(3, dtype=np.int32).tobytes()]
                                for i in range(3)])
    (root / "shard.00000.mds").write_bytes(raw)
    write_index(root, columns, [("shard.00000.mds", len(raw), 3)])
    with pytest.raises(ConfigError) as info:
        _read(root, text_field="ids")
    assert f"{root / 'shard.00000.mds'}: column 'ids' has the MDS encoding 'ndarray:foo'" in \
        str(info.value)


def test_an_index_nested_past_the_parsers_limit_is_a_config_error(tmp_path: Path) -> None:
    root = text_dataset(tmp_path / "ds", GOOD)
    (root / "index.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match=rf"{root / 'index.json'} is not an MDS index: its "
                                          rf"JSON is nested deeper than the parser's limit"):
        bounded(lambda: Plan.build(one_lane([str(root)])), 20)


def test_a_shard_config_nested_past_the_parsers_limit_is_a_data_error(tmp_path: Path) -> None:
    root = text_dataset(tmp_path / "ds", GOOD)
    shard = root / "shard.00000.mds"
    config = b"[" * 100_000 + b"]" * 100_000
    n = 0
    shard.write_bytes(struct.pack("<II", n, 8 + len(config)) + config)
    with pytest.raises(DataError, match=rf"{shard} is not an MDS shard: its column config "
                                        rf"cannot be read \(RecursionError"):
        bounded(lambda: Plan.build(one_lane([str(root)])), 20)


def test_a_negative_fixed_column_size_is_refused_naming_it(tmp_path: Path) -> None:
    # 'id' declared 8 bytes wide in the writer, -8 in the shard: the text was read 16 bytes
    # too early, as garbage documents
    root = text_dataset(tmp_path / "ds", GOOD)
    shard = root / "shard.00000.mds"
    raw = shard.read_bytes()
    assert raw.count(b'"column_sizes": [8, null]') == 1
    shard.write_bytes(raw.replace(b"[8, null]", b"[-8,null]"))  # the same length
    with pytest.raises(DataError) as info:
        _read(root)
    assert f"{shard} is not an MDS shard: its column config cannot be read" in str(info.value)
    assert "the column size -8 is no byte count" in str(info.value)


@pytest.mark.parametrize("basename", ["../outside/shard.00000.mds", "ABSOLUTE",
                                      "sub/../../outside/shard.00000.mds"])
def test_a_shard_basename_outside_the_dataset_is_refused(tmp_path: Path, basename: str) -> None:
    outside = text_dataset(tmp_path / "outside", ["a secret document outside the dataset"])
    if basename == "ABSOLUTE":
        basename = str(outside / "shard.00000.mds")
    root = tmp_path / "ds"
    root.mkdir()
    size = (outside / "shard.00000.mds").stat().st_size
    index = write_index(root, TEXT_ONLY, [(basename, size, 1)])
    with pytest.raises(ConfigError) as info:
        _read(root)
    assert f"{index}: shard 0's basename is {basename!r}, which is no path inside the " \
           f"dataset directory" in str(info.value)


def test_a_merged_index_reads_its_subdirectories(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    part = text_dataset(root / "part0", GOOD)
    size = (part / "shard.00000.mds").stat().st_size
    write_index(root, TEXT_ONLY, [("part0/shard.00000.mds", size, len(GOOD))])
    tokens, _ = _read(root)
    np.testing.assert_array_equal(tokens, expected(GOOD))


def test_column_sizes_that_do_not_add_up_are_a_malformed_sample(tmp_path: Path) -> None:
    # sample 1's text size shrunk by 3: its text used to be read cut short, silently
    root = text_dataset(tmp_path / "ds", GOOD)
    shard = root / "shard.00000.mds"
    raw = bytearray(shard.read_bytes())
    offsets = struct.unpack_from("<5I", raw, 4)
    (size,) = struct.unpack_from("<I", raw, offsets[1])
    assert size == len(GOOD[1].encode())
    struct.pack_into("<I", raw, offsets[1], size - 3)
    shard.write_bytes(bytes(raw))
    tokens, counters = _read(root)
    np.testing.assert_array_equal(tokens, expected([GOOD[0], GOOD[2], GOOD[3]]))
    assert counters.skipped == {"malformed_sample": 1}
    message = fail_message([str(root)])
    assert f"{shard} at sample 1" in message and "do not add up to its" in message


def test_a_sample_over_the_record_bound_is_a_counted_record_never_read(tmp_path: Path) -> None:
    root = text_dataset(tmp_path / "ds", GOOD)
    shard = root / "shard.00000.mds"
    raw = shard.read_bytes()
    n = len(GOOD)
    offsets = list(struct.unpack_from(f"<{n + 1}I", raw, 4))
    huge = 3 << 30  # sample 2 claims 3 GiB, a hole in the file
    head = raw[:offsets[2]]
    tail = raw[offsets[3]:]
    moved = [o if k <= 2 else o - (offsets[3] - offsets[2]) + huge
             for k, o in enumerate(offsets)]
    with open(shard, "wb") as f:
        f.write(struct.pack(f"<I{n + 1}I", n, *moved) + head[4 + 4 * (n + 1):])
        f.seek(huge, 1)
        f.write(tail)
    assert shard.stat().st_size == moved[-1]
    tokens, counters = _read(root)
    np.testing.assert_array_equal(tokens, expected([GOOD[0], GOOD[1], GOOD[3]]))
    assert counters.skipped == {"too_large": 1}
    message = fail_message([str(root)])
    assert f"{shard} at sample 2" in message
    assert f"the sample holds {huge} bytes, more than the {MAX_RECORD_BYTES}" in message


def test_a_sample_count_beyond_the_file_is_refused(tmp_path: Path) -> None:
    root = text_dataset(tmp_path / "ds", GOOD)
    shard = root / "shard.00000.mds"
    raw = bytearray(shard.read_bytes())
    struct.pack_into("<I", raw, 0, 0xFFFFFFFF)
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=rf"{shard} is not an MDS shard: its sample count "
                                        rf"4294967295 needs an offset table of 17179869184 "
                                        rf"bytes, more than the shard holds"):
        bounded(lambda: Plan.build(one_lane([str(root)])), 20)
