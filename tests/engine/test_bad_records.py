"""Every bad record counted, none fatal under ``skip``.

Each class of broken input is written by hand next to good records, read through a real
loader, and checked twice: under ``skip`` the good documents all arrive (tokens equal a direct
encode) and the bad one is counted under its reason; under ``fail`` the error names the file
and the record's offset or row. Sources whose records lack the field fail at once naming the
fields that are there, and ``bad_records_max_fraction`` stops a run that is mostly broken.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datalane import ConfigError, DataError, Loader, load_recipe
from datalane.corpus import tokenizer_path
from tests.engine.test_bad_inputs import drain, expected_tokens

GOOD = ["first good document", "second good one", "third and last"]


def _recipe(uris: list[str], **top: Any) -> Any:
    return load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 64,
                        "tokenizer": {"uri": tokenizer_path()},
                        "sources": [{"name": "s", "uris": uris, "epochs": 1}],
                        "shuffle": {"block_size": 1}, **top})


def _jsonl(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


BROKEN_JSON = {
    "nested deeper than the parser's limit": ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                              "JSON nested deeper than the parser's limit"),
    "an integer beyond Python's digit limit": ('{"text": "x", "n": ' + "7" * 5000 + "}",
                                               "JSON the parser refuses: Exceeds the limit"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_JSON))
def test_json_the_parser_refuses_is_a_counted_bad_record(tmp_path: Path, case: str) -> None:
    line, detail = BROKEN_JSON[case]
    good = [json.dumps({"text": t}) for t in GOOD]
    path = _jsonl(tmp_path / "a.jsonl", [good[0], line, good[1], good[2]])
    tokens, counters = drain(_recipe([path]))
    np.testing.assert_array_equal(tokens, expected_tokens(tokenizer_path(), GOOD))
    assert counters.skipped == {"malformed_json": 1}
    with pytest.raises(DataError) as info:
        drain(_recipe([path], bad_records="fail"))
    offset = len(good[0]) + 1
    assert f"{detail}" in str(info.value) and f"{path} at byte {offset}" in str(info.value)


def test_a_lone_surrogate_is_a_counted_bad_record_not_a_crash(tmp_path: Path) -> None:
    # json.loads turns the escape into a lone surrogate, which tokenizers refuse for a batch
    lines = [json.dumps({"text": GOOD[0]}), '{"text": "broken \\udc80 text"}',
             json.dumps({"text": GOOD[1]}), json.dumps({"text": GOOD[2]})]
    path = _jsonl(tmp_path / "a.jsonl", lines)
    tokens, counters = drain(_recipe([path]))
    np.testing.assert_array_equal(tokens, expected_tokens(tokenizer_path(), GOOD))
    assert counters.skipped == {"invalid_unicode": 1}
    with pytest.raises(DataError) as info:
        drain(_recipe([path], bad_records="fail"))
    assert "field 'text' holds the lone surrogate U+DC80 at character 7" in str(info.value)
    assert f"{path} at byte {len(lines[0]) + 1}" in str(info.value)


def test_invalid_utf8_in_a_parquet_string_column_is_counted_per_value(tmp_path: Path) -> None:
    values = [GOOD[0].encode(), b"\xff\xfe broken", GOOD[1].encode(), GOOD[2].encode()]
    binary = pa.array(values, pa.binary())
    strings = pa.Array.from_buffers(pa.string(), len(values), binary.buffers())  # unvalidated
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": strings}), path)
    tokens, counters = drain(_recipe([str(path)]))
    np.testing.assert_array_equal(tokens, expected_tokens(tokenizer_path(), GOOD))
    assert counters.skipped == {"non_utf8": 1}
    with pytest.raises(DataError) as info:
        drain(_recipe([str(path)], bad_records="fail"))
    assert f"invalid UTF-8 at byte 0 of the value in {path} at row 1" in str(info.value)


def test_a_truncated_gzip_file_is_an_error_naming_it(tmp_path: Path) -> None:
    body = "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(400))
    whole = gzip.compress(body.encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError) as info:
        drain(_recipe([str(path)]), max_steps=10_000)
    assert str(path) in str(info.value) and "corrupt or truncated" in str(info.value)


@pytest.mark.parametrize(("name", "compression"), [("a.jsonl.bz2", "bzip2"),
                                                   ("a.jsonl.xz", "xz"),
                                                   ("a.jsonl.lz4", "lz4")])
def test_unsupported_compressions_are_refused_by_name(tmp_path: Path, name: str,
                                                      compression: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"\x00compressed bytes, never to be read as text\n")
    for declared in (None, "jsonl"):
        recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 8,
                              "tokenizer": {"uri": tokenizer_path()},
                              "sources": [{"name": "s", "uris": [str(path)],
                                           "format": declared}]})
        with pytest.raises(ConfigError) as info:
            Loader(recipe)
        assert str(info.value) == (
            f"sources[0].uris[0]: {path} is compressed with {compression}, which datalane "
            f"does not read (it reads gzip .gz and zstd .zst); recompress the file")


def test_a_misnamed_field_fails_at_once_naming_the_fields_there(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "a.jsonl",
                  [json.dumps({"id": i, "body": t}) for i, t in enumerate(GOOD * 50)])
    with pytest.raises(DataError) as info:
        drain(_recipe([path]))
    assert str(info.value) == (
        f"source 's': none of the first 100 records of lane 0 holds a document "
        f"(missing_field=100); the source reads the field 'text', but its records have the "
        f"fields 'id', 'body' (in {path})")


def test_a_few_bad_first_records_of_a_healthy_source_are_only_counted(tmp_path: Path) -> None:
    lines = ['{"broken', '{"no_text": 1}'] + [json.dumps({"text": t}) for t in GOOD]
    path = _jsonl(tmp_path / "a.jsonl", lines)
    tokens, counters = drain(_recipe([path]))
    np.testing.assert_array_equal(tokens, expected_tokens(tokenizer_path(), GOOD))
    assert counters.skipped == {"malformed_json": 1, "missing_field": 1}


def _mostly(tmp_path: Path, bad_every: int, n: int = 2000) -> str:
    lines = ['{"broken' if i % bad_every == 0 else json.dumps({"text": f"doc {i}"})
             for i in range(n)]
    return _jsonl(tmp_path / "m.jsonl", lines)


def test_max_fraction_stops_a_run_that_is_mostly_broken(tmp_path: Path) -> None:
    path = _mostly(tmp_path, bad_every=5)  # 20% malformed
    with pytest.raises(DataError) as info:
        drain(_recipe([path], bad_records_max_fraction=0.1))
    message = str(info.value)
    assert message.startswith("lane 0: ") and "records are malformed (malformed_json=" in message
    assert "more than bad_records_max_fraction 0.1" in message and str(path) in message
    # at or under the bound nothing stops, and everything is still counted
    _, counters = drain(_recipe([path], bad_records_max_fraction=0.25))
    assert counters.skipped == {"malformed_json": 400} and counters.kept == 1600
    _, unbounded = drain(_recipe([path]))
    assert unbounded.skipped == counters.skipped


def test_max_fraction_is_checked_only_from_the_thousandth_record(tmp_path: Path) -> None:
    path = _mostly(tmp_path, bad_every=2, n=900)  # 50% malformed, but fewer than 1,000 records
    _, counters = drain(_recipe([path], bad_records_max_fraction=0.1))
    assert counters.skipped == {"malformed_json": 450}


def test_max_fraction_is_part_of_the_recipe_and_checked() -> None:
    with pytest.raises(ConfigError) as info:
        _recipe(["x.jsonl"], bad_records_max_fraction=1.5)
    assert str(info.value) == "bad_records_max_fraction 1.5 must be <= 1"
    assert "bad_records_max_fraction" not in _recipe(["x.jsonl"]).to_dict()
