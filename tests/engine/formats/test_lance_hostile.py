"""Lance datasets: recognised by what the directory holds whatever its name, corrupt data
files a DataError naming the dataset (pylance's LanceError and ArrowInvalid are not datalane's
errors), values over the record bound counted ``too_large``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datalane import DataError
from datalane.engine.plan import Plan
from datalane.spec.limits import MAX_RECORD_BYTES
from tests.data.format_corpus import text_of
from tests.support.common import bounded, drain, expected, fail_message, one_lane

lance = pytest.importorskip("lance")

GOOD = [text_of("lance", i) for i in range(6)]


def test_a_lance_directory_without_the_suffix_is_recognised(tmp_path: Path) -> None:
    path = tmp_path / "web-docs"
    lance.write_dataset(pa.table({"text": GOOD}), str(path))
    assert {p.name for p in path.iterdir()} >= {"_versions", "data"}
    plan = Plan.build(one_lane([str(path)]))
    assert [(f.uri, f.format, f.ident) for f in plan.sources[0].files] == [
        (str(path), "lance", "lance-version=1")]
    tokens, _ = bounded(lambda: drain(one_lane([str(path)])), 60)
    np.testing.assert_array_equal(tokens, expected(GOOD))


def _data_files(path: Path) -> list[Path]:
    return sorted((path / "data").iterdir())


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_corrupt_data_file_is_a_data_error_naming_the_dataset(tmp_path: Path,
                                                                damage: str) -> None:
    path = tmp_path / "t.lance"
    lance.write_dataset(pa.table({"text": GOOD}), str(path), max_rows_per_file=3)
    victim = _data_files(path)[0]
    raw = victim.read_bytes()
    victim.write_bytes(raw[:len(raw) // 2] if damage == "truncate" else os.urandom(len(raw)))
    with pytest.raises(DataError) as info:
        bounded(lambda: drain(one_lane([str(path)])), 60)
    assert f"the Lance dataset {path}:" in str(info.value)


def test_a_value_over_the_record_bound_is_a_counted_record(tmp_path: Path) -> None:
    path = tmp_path / "t.lance"
    lance.write_dataset(pa.table({"text": [GOOD[0], "x" * (MAX_RECORD_BYTES + 1), GOOD[1]]}),
                        str(path))
    tokens, counters = bounded(lambda: drain(one_lane([str(path)])), 60)
    np.testing.assert_array_equal(tokens, expected(GOOD[:2]))
    assert counters.skipped == {"too_large": 1}
    message = fail_message([str(path)])
    assert f"{path} at row 1" in message and f"a value of {MAX_RECORD_BYTES + 1:,} bytes" in message
