"""Bad inputs, end to end through ``datalane.Loader`` and the ``datalane run`` command.

Every case builds its files in ``tmp_path`` and asserts the error text: a bad record names the
file and the byte offset (JSONL) or row (Parquet); a bad recipe, URI, tokenizer or topology
names the field and what would work. With ``bad_records: skip`` a bad record is counted by
reason and nothing else is lost.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer

from datalane import (
    ConfigError,
    DataError,
    DatalaneError,
    Knobs,
    Loader,
    MismatchError,
    Recipe,
    load_recipe,
)
from datalane.corpus import DemoCorpus, tokenizer_path
from datalane.engine.plan import Plan
from datalane.spec.state import Checkpoint, Counters
from tests.conftest import base_recipe_dict
from tests.support import paths

REPO = paths.REPO
GOOD = ["first good document", "second good document, a little longer than the first",
        "third and last good document"]


@pytest.fixture
def tok(tmp_path: Path) -> str:
    path = tmp_path / "tokenizer.json"
    shutil.copyfile(tokenizer_path(), path)
    return str(path)


def recipe_dict(tok: str, uris: list[str], *, lanes: int = 1, batch: int | None = None,
                bad_records: str = "skip", **source: Any) -> dict[str, Any]:
    """One source, no shuffling (block size 1): documents come out in file order."""
    return {
        "lanes": lanes,
        "global_batch_size": batch or 2 * lanes,
        "seq_len": 16,
        "tokenizer": {"uri": tok},
        "sources": [{"name": "s", "uris": uris, **source}],
        "shuffle": {"block_size": 1},
        "bad_records": bad_records,
    }


def recipe(tok: str, uris: list[str], **kw: Any) -> Recipe:
    return load_recipe(recipe_dict(tok, uris, **kw))


def drain(r: Recipe, max_steps: int = 500) -> tuple[np.ndarray, Counters]:
    """Run until every lane has ended: (document tokens in stream order, counters)."""
    pieces = []
    with Loader(r, 0, 1, Knobs(workers=1, prefetch=2)) as loader:
        for _ in range(max_steps):
            step = loader.next_step()
            pieces.append(step.input_ids[step.positions >= 0])
            if step.ended:
                return np.concatenate(pieces), loader.counters()
    raise AssertionError(f"the stream did not end within {max_steps} steps")


def expected_tokens(tok: str, texts: list[str]) -> np.ndarray:
    t = Tokenizer.from_file(tok)
    eos = t.token_to_id("<|eos|>")
    return np.array([i for text in texts for i in [*t.encode(text, add_special_tokens=False).ids,
                                                   eos]], dtype=np.int32)


def jsonl(path: Path, lines: list[bytes], final_newline: bool = True) -> str:
    path.write_bytes(b"\n".join(lines) + (b"\n" if final_newline else b""))
    return str(path)


def good_line(i: int) -> bytes:
    return json.dumps({"id": i, "text": GOOD[i]}).encode()


# -- bad records ----------------------------------------------------------------------------------

BAD_LINES = {
    # reason: (the bad line, the detail the fail policy reports)
    "malformed_json": (b'{"id": 9, "text": "cut off', "malformed JSON (Unterminated string "
                                                      "starting at: column 19)"),
    "non_utf8": (b'{"id": 9, "text": "caf\xe9 cr\xe8me"}', "invalid UTF-8 at byte 22 of the line"),
    "missing_field": (b'{"id": 9, "body": "the text is elsewhere"}', "no field 'text'"),
    "empty_text": (b'{"id": 9, "text": ""}', "field 'text' is empty"),
    "not_text": (b'{"id": 9, "text": {"nested": true}}', "field 'text' holds dict"),
}


def _bad_file(tmp_path: Path, reason: str, name: str = "data.jsonl") -> tuple[str, int]:
    """Two good lines, the bad one, the third good one (no final newline); the bad offset."""
    lines = [good_line(0), good_line(1), BAD_LINES[reason][0], good_line(2)]
    path = jsonl(tmp_path / name, lines, final_newline=False)
    return path, len(lines[0]) + len(lines[1]) + 2


@pytest.mark.parametrize("reason", sorted(BAD_LINES))
def test_bad_jsonl_record_is_skipped_and_counted(tmp_path: Path, tok: str, reason: str) -> None:
    path, _ = _bad_file(tmp_path, reason)
    tokens, counters = drain(recipe(tok, [path]))
    assert counters.skipped == {reason: 1}
    assert counters.docs == 4
    assert counters.kept == 3
    np.testing.assert_array_equal(tokens, expected_tokens(tok, GOOD))  # nothing else lost
    assert counters.tokens == tokens.size


@pytest.mark.parametrize("reason", sorted(BAD_LINES))
def test_bad_jsonl_record_fails_naming_file_and_byte(tmp_path: Path, tok: str,
                                                     reason: str) -> None:
    path, offset = _bad_file(tmp_path, reason)
    with pytest.raises(DataError) as info:
        drain(recipe(tok, [path], bad_records="fail"))
    assert str(info.value) == (f"source 's': {BAD_LINES[reason][1]} in {path} at byte {offset} "
                               f"(bad_records is 'fail')")


def test_bad_record_in_a_later_chunk_reports_its_file_offset(tmp_path: Path, tok: str) -> None:
    lines = [good_line(i % 3) for i in range(40)]
    lines[33] = BAD_LINES["malformed_json"][0]
    path = jsonl(tmp_path / "many.jsonl", lines)
    offset = sum(len(b) + 1 for b in lines[:33])
    r = recipe(tok, [path], bad_records="fail", chunk_bytes=100)
    with pytest.raises(DataError) as info:
        drain(r)
    assert f"in {path} at byte {offset} (bad_records is 'fail')" in str(info.value)
    _, counters = drain(recipe(tok, [path], chunk_bytes=100))
    assert (counters.docs, counters.kept, counters.skipped) == (40, 39, {"malformed_json": 1})


def test_bad_record_in_gzip_reports_the_decompressed_offset(tmp_path: Path, tok: str) -> None:
    lines = [good_line(0), good_line(1), BAD_LINES["non_utf8"][0], good_line(2)]
    path = tmp_path / "data.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    offset = len(lines[0]) + len(lines[1]) + 2
    with pytest.raises(DataError) as info:
        drain(recipe(tok, [str(path)], bad_records="fail"))
    assert str(info.value) == (f"source 's': invalid UTF-8 at byte 22 of the line in {path} at "
                               f"byte {offset} (bad_records is 'fail')")
    tokens, counters = drain(recipe(tok, [str(path)]))
    assert counters.skipped == {"non_utf8": 1}
    np.testing.assert_array_equal(tokens, expected_tokens(tok, GOOD))


def test_every_bad_record_counted_by_reason(tmp_path: Path, tok: str) -> None:
    lines = [good_line(0)]
    for reason in sorted(BAD_LINES):
        lines += [BAD_LINES[reason][0], BAD_LINES[reason][0]]
    lines += [b"", b"   ", good_line(1), good_line(2)]  # blank lines are not records
    path = jsonl(tmp_path / "mixed.jsonl", lines)
    tokens, counters = drain(recipe(tok, [path]))
    assert counters.skipped == {reason: 2 for reason in BAD_LINES}
    assert (counters.docs, counters.kept) == (3 + 2 * len(BAD_LINES), 3)
    np.testing.assert_array_equal(tokens, expected_tokens(tok, GOOD))


def _parquet(path: Path, column: str = "text", values: list[Any] | None = None,
             kind: Any = None) -> str:
    values = values if values is not None else list(GOOD)
    pq.write_table(pa.table({"id": list(range(len(values))),
                             column: pa.array(values, kind or pa.string())}), path)
    return str(path)


@pytest.mark.parametrize(("values", "kind", "reason", "row", "detail"), [
    ([GOOD[0], None, GOOD[1], GOOD[2]], None, "missing_field", 1, "no value in field 'text'"),
    ([GOOD[0], GOOD[1], "", GOOD[2]], None, "empty_text", 2, "field 'text' is empty"),
    ([GOOD[0].encode(), GOOD[1].encode(), GOOD[2].encode(), b"\xc3("], pa.binary(),
     "non_utf8", 3, "invalid UTF-8 at byte 0 of the value"),
])
def test_bad_parquet_value_skip_and_fail(tmp_path: Path, tok: str, values: list[Any],
                                         kind: Any, reason: str, row: int, detail: str) -> None:
    path = _parquet(tmp_path / "data.parquet", values=values, kind=kind)
    tokens, counters = drain(recipe(tok, [path]))
    assert counters.skipped == {reason: 1}
    assert (counters.docs, counters.kept) == (4, 3)
    np.testing.assert_array_equal(tokens, expected_tokens(tok, GOOD))
    with pytest.raises(DataError) as info:
        drain(recipe(tok, [path], bad_records="fail"))
    assert str(info.value) == (f"source 's': {detail} in {path} at row {row} "
                               f"(bad_records is 'fail')")


def test_parquet_without_the_text_column(tmp_path: Path, tok: str) -> None:
    path = _parquet(tmp_path / "data.parquet", column="content")
    # a source whose records lack the field fails at once, naming the fields there
    # (under `skip` it used to give 0 tokens without a word)
    with pytest.raises(DataError) as info:
        drain(recipe(tok, [path]))
    assert str(info.value) == (
        f"source 's': none of the first 3 records of lane 0 holds a document "
        f"(missing_field=3); the source reads the field 'text', but its records have the "
        f"fields 'id', 'content' (in {path})")
    with pytest.raises(DataError) as info:
        drain(recipe(tok, [path], bad_records="fail"))
    assert str(info.value) == (f"source 's': no value in field 'text' in {path} at row 0 "
                               f"(bad_records is 'fail')")
    # naming the right column reads it
    tokens, _ = drain(recipe(tok, [path], text_field="content"))
    np.testing.assert_array_equal(tokens, expected_tokens(tok, GOOD))


def test_corrupt_parquet_file_is_named(tmp_path: Path, tok: str) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 but nothing else")
    with pytest.raises(DataError) as info:
        Loader(recipe(tok, [str(path)]))
    assert str(info.value).startswith(f"{path} is not a readable Parquet file: ")


# -- empty files ----------------------------------------------------------------------------------


def test_empty_file_next_to_a_good_one_loses_nothing(tmp_path: Path, tok: str) -> None:
    empty = jsonl(tmp_path / "a-empty.jsonl", [], final_newline=False)
    good = jsonl(tmp_path / "b-good.jsonl", [good_line(i) for i in range(3)])
    tokens, counters = drain(recipe(tok, [empty, good]))
    assert counters.skipped == {}
    assert counters.docs == 3
    np.testing.assert_array_equal(tokens, expected_tokens(tok, GOOD))


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "both"])
def test_source_of_empty_files_says_so(tmp_path: Path, tok: str, kind: str) -> None:
    paths = []
    if kind in ("jsonl", "both"):
        paths.append(jsonl(tmp_path / "empty.jsonl", [], final_newline=False))
    if kind in ("parquet", "both"):
        paths.append(_parquet(tmp_path / "empty.parquet", values=[]))
    with pytest.raises(ConfigError) as info:
        Loader(recipe(tok, paths))
    assert str(info.value) == (f"sources[0] 's' has no data: its {len(paths)} file(s) are "
                               f"empty ({', '.join(paths)})")


def test_file_of_blank_lines_ends_at_once(tmp_path: Path, tok: str) -> None:
    path = jsonl(tmp_path / "blank.jsonl", [b"", b"  ", b"\t", b""])
    tokens, counters = drain(recipe(tok, [path]))
    assert tokens.size == 0
    assert (counters.docs, counters.skipped) == (0, {})


def test_repeated_source_without_any_record_fails_instead_of_spinning(
        tmp_path: Path, tok: str) -> None:
    path = jsonl(tmp_path / "blank.jsonl", [b"", b"  ", b""])
    with Loader(recipe(tok, [path], epochs=None)) as loader, pytest.raises(DataError) as info:
        loader.next_step()
    assert str(info.value) == (
        "source 's': lane 0 read no record in 17 epochs in a row (up to epoch 16); its files "
        "hold no documents")


# -- unreadable URIs ------------------------------------------------------------------------------


def test_unreadable_uris_name_the_field_and_the_uri(tmp_path: Path, tok: str) -> None:
    good = jsonl(tmp_path / "good.jsonl", [good_line(0)])
    cases = {
        str(tmp_path / "nope.jsonl"): "does not exist",
        str(tmp_path / "none-*.jsonl"): "matches no file",
        "nosuch://bucket/x.jsonl": "cannot be opened: Protocol not known: nosuch",
        str(tmp_path): (f"is a directory; use a glob such as "
                        f"'{str(tmp_path).rstrip('/')}/*.parquet'"),
        f"file://{tmp_path}/missing.jsonl": "does not exist",
    }
    for uri, problem in cases.items():
        with pytest.raises(ConfigError) as info:
            Loader(recipe(tok, [good, uri]))
        assert str(info.value) == f"sources[0].uris[1] {uri!r} {problem}"


def test_unknown_extension_asks_for_the_format(tmp_path: Path, tok: str) -> None:
    path = tmp_path / "data.csv"
    path.write_text('{"text": "a"}\n')
    with pytest.raises(ConfigError) as info:
        Loader(recipe(tok, [str(path)]))
    assert str(info.value) == (f"sources[0]: cannot infer the format of {str(path)!r} from its "
                               f"extension; set sources[0].format to 'parquet' or 'jsonl'")
    tokens, _ = drain(recipe(tok, [str(path)], format="jsonl"))  # the suggested fix works
    np.testing.assert_array_equal(tokens, expected_tokens(tok, ["a"]))


def test_missing_tokenizer(tmp_path: Path) -> None:
    good = jsonl(tmp_path / "good.jsonl", [good_line(0)])
    missing = str(tmp_path / "models" / "tokenizer.json")
    with pytest.raises(ConfigError) as info:
        Loader(recipe(missing, [good]))
    assert str(info.value) == f"tokenizer.uri {missing!r} does not exist"


def test_tokenizer_pin_mismatch(tmp_path: Path, tok: str) -> None:
    good = jsonl(tmp_path / "good.jsonl", [good_line(0)])
    data = recipe_dict(tok, [good])
    data["tokenizer"]["sha256"] = "f" * 64
    with pytest.raises(MismatchError) as info:
        Loader(load_recipe(data))
    assert str(info.value).startswith(f"tokenizer.sha256 pins {'f' * 64}, but {tok} has SHA-256 ")


# -- topology -------------------------------------------------------------------------------------


def test_world_size_above_the_lanes(make_recipe: Callable[..., Recipe]) -> None:
    """Any world size up to the lane count works; more ranks than lanes cannot."""
    for world in (9, 16):
        with pytest.raises(ConfigError) as info:
            Loader(make_recipe(), 0, world)
        assert str(info.value) == (f"8 lanes cannot be split over {world} ranks (a rank owns "
                                   f"at least one lane); use a world size of 1 to 8")
    with Loader(make_recipe(), 2, 3) as loader:
        assert loader.lanes == range(5, 8)


def test_rank_outside_the_world(make_recipe: Callable[..., Recipe]) -> None:
    with pytest.raises(ConfigError) as info:
        Loader(make_recipe(), 4, 4)
    assert str(info.value) == "rank 4 is outside 0..3 for world size 4"


def test_batch_not_a_multiple_of_lanes(corpus: DemoCorpus) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(base_recipe_dict(corpus, global_batch_size=100))
    assert str(info.value) == "global_batch_size 100 is not a multiple of lanes 8; try 96 or 104"


@pytest.mark.parametrize(("fmt", "knob"), [("jsonl", "chunk_bytes"), ("parquet", "chunk_rows")])
def test_too_few_chunks_for_the_lanes_suggests_smaller_chunks(
        tmp_path: Path, tok: str, fmt: str, knob: str) -> None:
    if fmt == "jsonl":
        path = jsonl(tmp_path / "small.jsonl", [good_line(i % 3) for i in range(12)])
        fix = {"chunk_bytes": 64}
    else:
        path = _parquet(tmp_path / "small.parquet", values=GOOD * 4)
        fix = {"chunk_rows": 2}
    with pytest.raises(ConfigError) as info:
        Loader(recipe(tok, [path], lanes=4))
    assert str(info.value) == (
        f"sources[0] 's' has 1 chunk(s) in 1 file(s), but 4 lanes each need at least one per "
        f"epoch; set a smaller sources[0].{knob}, add files, or use fewer lanes")
    # the suggested fix works, and every document is still read exactly once
    r = recipe(tok, [path], lanes=4, **fix)
    with Loader(r, 0, 1, Knobs(workers=1)) as loader:
        for _ in range(50):
            if loader.next_step().ended:
                break
        assert (loader.counters().docs, loader.counters().kept) == (12, 12)


def test_microbatch_size_must_divide_the_local_batch(tmp_path: Path, tok: str) -> None:
    path = jsonl(tmp_path / "d.jsonl", [good_line(i % 3) for i in range(12)])
    r = recipe(tok, [path], lanes=2, batch=12, chunk_bytes=64)
    with Loader(r, 1, 2, Knobs(workers=1)) as loader:
        for size in (0, 4, 7):
            with pytest.raises(ConfigError) as info:
                next(loader.microbatches(size))
            assert str(info.value) == (
                f"microbatch size {size} does not divide the local batch of 6 sequences "
                f"(B=12, L=2, W=2); use one of [1, 2, 3, 6]")
        first = next(loader.microbatches(3))  # a valid size works
        assert first.input_ids.shape == (3, 17)


# -- restoring state ------------------------------------------------------------------------------


def _state_after(r: Recipe, steps: int, rank: int = 0, world: int = 1) -> dict[str, Any]:
    with Loader(r, rank, world, Knobs(workers=1)) as loader:
        for _ in range(steps):
            loader.next_step()
        state = loader.state_dict()
    plain: dict[str, Any] = json.loads(json.dumps(state))  # it is plain JSON
    return plain


def _restore_error(r: Recipe, state: dict[str, Any], rank: int = 0, world: int = 1, *,
                   unsealed: bool = False) -> str:
    with Loader(r, rank, world, Knobs(workers=1)) as loader, \
            pytest.raises(MismatchError) as info:
        loader.load_state_dict(state, allow_unsealed=unsealed)
        loader.next_step()  # the lanes open, and check their states, at the first step
    return str(info.value)


def test_restore_with_another_recipe_names_the_field(make_recipe: Callable[..., Recipe]) -> None:
    state = _state_after(make_recipe(), 1)
    other = make_recipe(seed=6)
    with Loader(other, 0, 1) as loader:
        current = loader.plan.fingerprint
    assert _restore_error(other, state) == (
        f"the checkpoint was saved with recipe fingerprint {state['fingerprint'][:16]}..., but "
        f"this recipe has {current[:16]}...; these fields differ:\n"
        f"  recipe.seed: saved 5, now 6")


def test_restore_diff_lists_every_differing_field(make_recipe: Callable[..., Recipe]) -> None:
    state = _state_after(make_recipe(), 1)
    message = _restore_error(make_recipe(seq_len=64, shuffle={"block_size": 8}), state)
    assert message.endswith("these fields differ:\n"
                            "  recipe.seq_len: saved 128, now 64\n"
                            "  recipe.shuffle.block_size: saved 16, now 8")


def test_restore_after_a_source_file_changed(tmp_path: Path, tok: str) -> None:
    path = jsonl(tmp_path / "d.jsonl", [good_line(i) for i in range(3)])
    state = _state_after(recipe(tok, [path]), 1)
    with open(path, "ab") as f:
        f.write(good_line(0) + b"\n")
    message = _restore_error(recipe(tok, [path]), state)
    [line] = [ln for ln in message.splitlines() if ln.startswith("  ")]
    [[_, size, ident]] = state["fingerprint_doc"]["files"]["s"]
    [[_, new_size, new_ident]] = Plan.build(recipe(tok, [path])).fingerprint_doc["files"]["s"]
    assert new_size == size + len(good_line(0)) + 1
    assert line == (f"  files.s: 1 of 1 file changed: {path} (the first: saved "
                    f"{[size, ident]!r}, now {[new_size, new_ident]!r})")


def test_restore_names_the_changed_files_among_a_thousand(tmp_path: Path, tok: str) -> None:
    """One changed file among a thousand is named alone (it listed every file, twice)."""
    folder = tmp_path / "many"
    folder.mkdir()
    paths = [jsonl(folder / f"f{i:04d}.jsonl", [good_line(i % 3)]) for i in range(1000)]
    state = _state_after(recipe(tok, [f"{folder}/*.jsonl"]), 1)
    with open(paths[500], "ab") as f:
        f.write(good_line(1) + b"\n")
    os.remove(paths[17])
    added = [jsonl(folder / f"g{i}.jsonl", [good_line(0)]) for i in range(5)]
    message = _restore_error(recipe(tok, [f"{folder}/*.jsonl"]), state)
    lines = [ln for ln in message.splitlines() if ln.startswith("  ")]
    [[_, size, ident]] = [f for f in state["fingerprint_doc"]["files"]["s"] if f[0] == paths[500]]
    new = next(f for f in Plan.build(recipe(tok, [f"{folder}/*.jsonl"])).fingerprint_doc[
        "files"]["s"] if f[0] == paths[500])
    assert lines == [
        f"  files.s: 1 of 1000 files changed: {paths[500]} (the first: saved "
        f"{[size, ident]!r}, now {new[1:]!r})",
        f"  files.s: 5 files added: {added[0]}, {added[1]}, {added[2]} and 2 more",
        f"  files.s: 1 file removed: {paths[17]}",
    ]
    assert len(message) < 1500  # not a thousand file names


def test_restore_with_another_tokenizer_file(tmp_path: Path, tok: str) -> None:
    path = jsonl(tmp_path / "d.jsonl", [good_line(i) for i in range(3)])
    state = _state_after(recipe(tok, [path]), 1)
    Path(tok).write_text(json.dumps(json.loads(Path(tok).read_text()), indent=1))
    message = _restore_error(recipe(tok, [path]), state)
    assert message.splitlines()[1].startswith(
        f"  tokenizer_sha256: saved {state['fingerprint_doc']['tokenizer_sha256']!r}, now '")


def test_restore_a_rank_whose_lanes_are_missing(make_recipe: Callable[..., Recipe]) -> None:
    r = make_recipe()
    rank0 = _state_after(r, 1, rank=0, world=2)
    assert sorted(rank0["lanes"]) == ["0", "1", "2", "3"]
    assert _restore_error(r, rank0, rank=1, world=2) == (
        "rank 1 of 2 needs lanes 4-7, but the checkpoint of step 1 holds lanes 0, 1, 2, 3 "
        "(missing [4, 5, 6, 7]); merge every rank's checkpoint of that step")
    assert _restore_error(r, rank0, rank=3, world=4) == (
        "rank 3 of 4 needs lanes 6-7, but the checkpoint of step 1 holds lanes 0, 1, 2, 3 "
        "(missing [6, 7]); merge every rank's checkpoint of that step")
    # the lanes it does hold restore fine: rank 1 of 4 owns lanes 2-3
    with Loader(r, 1, 4, Knobs(workers=1)) as loader:
        loader.load_state_dict(rank0)
        assert loader.step == 1


def test_restore_rejects_a_tampered_or_foreign_state(make_recipe: Callable[..., Recipe]) -> None:
    r = make_recipe()
    state = _state_after(r, 1)
    state["lanes"]["3"]["seqs"] = 5
    assert _restore_error(r, state).startswith(
        "checkpoint fails its integrity check: it carries sha256 ")
    del state["sha256"]  # a state without a seal (an older datalane's) is checked field by field
    assert _restore_error(r, state, unsealed=True) == (
        "lane 3 of the checkpoint is 5 sequences in, but step 1 is 2")
    assert _restore_error(r, {"format": "zephon/v2", "step": 1}) == (
        "checkpoint is not a datalane checkpoint (format 'zephon/v2', expected "
        "'datalane.checkpoint/v1')")
    broken = _unsealed(_state_after(r, 1))
    del broken["lanes"]["0"]["src"]
    assert _restore_error(r, broken, unsealed=True) == "checkpoint lane 0 lacks the key 'src'"


# -- the CLI --------------------------------------------------------------------------------------


def datalane(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datalane.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


def test_cli_run_reports_config_errors(write_recipe: Callable[..., str],
                                       tmp_path: Path) -> None:
    proc = datalane("run", write_recipe(), "--world", "9", "--steps", "1")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == ("datalane run: error: 8 lanes cannot be split over 9 ranks (a rank "
                           "owns at least one lane); use a world size of 1 to 8\n")
    proc = datalane("run", write_recipe(global_batch_size=100), "--steps", "1")
    assert proc.returncode == 2
    assert proc.stderr == ("datalane run: error: global_batch_size 100 is not a multiple of "
                           "lanes 8; try 96 or 104\n")


def test_cli_verify_needs_at_least_one_step(write_recipe: Callable[..., str]) -> None:
    proc = datalane("verify", write_recipe(), "--steps", "0")
    assert proc.returncode == 2
    assert "argument --steps: 0 is not at least 1" in proc.stderr
    assert "OK" not in proc.stdout


def test_cli_run_bad_records_fail_and_skip(tmp_path: Path, tok: str) -> None:
    path, offset = _bad_file(tmp_path, "malformed_json")
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe_dict("tokenizer.json", ["data.jsonl"],
                                                      bad_records="fail")))
    proc = datalane("run", str(recipe_path))
    assert proc.returncode == 2
    assert proc.stderr == (f"datalane run: error: source 's': {BAD_LINES['malformed_json'][1]} "
                           f"in {path} at byte {offset} (bad_records is 'fail')\n")

    recipe_path.write_text(yaml.safe_dump(recipe_dict("tokenizer.json", ["data.jsonl"])))
    proc = datalane("run", str(recipe_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("step=0 sha256=")
    assert all(ln.startswith(f"step={i} sha256=") for i, ln in enumerate(lines[:-2]))
    summary = lines[-2]
    assert " documents_read=4 skipped=1 (malformed_json=1) " in summary
    assert lines[-1] == "mixture: s=1.0000 (weight 1.0000)"
    tokens = expected_tokens(tok, GOOD).size
    assert f"tokens={tokens} " in summary


# -- added with the engine fixes for repeat-forever sources, predicates and recipe files ------


def test_repeated_source_whose_records_are_all_dropped_stops_with_an_error(tmp_path) -> None:
    from datalane import DataError, Loader, load_recipe
    from datalane.corpus import tokenizer_path

    data = tmp_path / "bad.jsonl"
    data.write_text("".join(f'{{"text": "{i}"}}\n' for i in range(40)))  # all too short
    recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 16,
                          "tokenizer": {"uri": tokenizer_path()},
                          "filters": {"min_chars": 5},
                          "sources": [{"name": "s", "uris": [str(data)], "epochs": None}]})
    with Loader(recipe) as loader, pytest.raises(DataError) as info:
        loader.next_step()
    assert "source 's': lane 0 kept no document in 17 epochs in a row" in str(info.value)
    assert "min_chars=" in str(info.value)


def test_a_predicate_that_raises_stops_the_stream_naming_the_record(tmp_path, monkeypatch,
                                                                    make_recipe) -> None:
    from datalane import DataError, Loader

    (tmp_path / "boom_filters.py").write_text(
        "def keep(text):\n    raise ValueError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = make_recipe(filters={"predicate": "boom_filters:keep"}, bad_records="skip")
    with Loader(recipe) as loader, pytest.raises(DataError) as info:
        loader.next_step()
    text = str(info.value)
    assert "filters.predicate 'boom_filters:keep' raised ValueError: boom in " in text
    assert " at row " in text or " at byte " in text


def test_a_key_given_twice_in_a_recipe_file_is_an_error(tmp_path) -> None:
    from datalane import ConfigError, load_recipe

    path = tmp_path / "r.yaml"
    path.write_text("lanes: 2\nseed: 1\nlanes: 4\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(info.value) == f"recipe {path} line 3: the key 'lanes' appears twice in one mapping"
    jpath = tmp_path / "r.json"
    jpath.write_text('{"lanes": 2, "lanes": 4}')
    with pytest.raises(ConfigError) as info:
        load_recipe(jpath)
    assert "the key 'lanes' appears twice" in str(info.value)
    empty = tmp_path / "e.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=f"recipe {empty} is empty"):
        load_recipe(empty)


# -- persisted states: sealed, range-checked, bounded ---------------------------------------------


def test_a_state_carries_a_sha256_of_its_content_and_unsealed_ones_load_only_when_allowed(
        make_recipe: Callable[..., Recipe]) -> None:
    r = make_recipe()
    state = _state_after(r, 3)
    assert list(state)[-1] == "sha256"
    body = {k: v for k, v in state.items() if k not in ("sha256", "fingerprint_doc")}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert state["sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    unsealed = {k: v for k, v in state.items() if k != "sha256"}  # as datalane 0.1 wrote it
    with pytest.raises(MismatchError, match=r"^checkpoint carries no sha256 of its content"):
        Checkpoint.from_json(unsealed)  # refused unless allowed explicitly
    assert Checkpoint.from_json(unsealed, allow_unsealed=True).to_json() == state


def test_every_single_bit_flip_of_a_state_file_is_refused(
        make_recipe: Callable[..., Recipe], tmp_path: Path) -> None:
    """A single-bit flip of a resume point is refused (13 of 44 flips changed the stream)."""
    data = Checkpoint.from_json(_state_after(make_recipe(), 2)).dumps().encode()
    path = tmp_path / "s.json"
    accepted = []
    for offset in range(len(data)):
        for bit in (0, 7):  # a digit or letter changes, or the byte is no longer UTF-8
            flipped = bytearray(data)
            flipped[offset] ^= 1 << bit
            path.write_bytes(bytes(flipped))
            try:
                Checkpoint.load(str(path))
            except DatalaneError:
                continue
            accepted.append((offset, bit, data[offset - 10:offset + 10]))
    assert accepted == []


def _unsealed(state: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(state)
    out.pop("sha256", None)  # (states of older versions carry none)
    return out


def _lane_1(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda s: s["lanes"]["1"].__setitem__(key, value)


OUT_OF_RANGE = {
    "negative step": (lambda s: s.__setitem__("step", -1),
                      "checkpoint: step must be at least 0, got -1"),
    "step past the layout": (lambda s: s.__setitem__("step", 10**12),
                             "checkpoint: step must be at most 999999999999, got 1000000000000"),
    "no lanes at all": (lambda s: s.__setitem__("lanes_total", 0),
                        "checkpoint: lanes_total must be at least 1, got 0"),
    "lanes as a list": (lambda s: s.__setitem__("lanes", [1, 2]),
                        "checkpoint: lanes must be an object of lane number -> lane state, "
                        "got list [1, 2]"),
    "lane outside lanes_total": (lambda s: s["lanes"].__setitem__("8", s["lanes"].pop("1")),
                                 "checkpoint holds lane 8, outside 0..7 of its 8 lanes"),
    "negative sequences": (_lane_1("seqs", -2), "checkpoint lane 1.seqs must be at least 0, "
                                                "got -2"),
    "cursor before the chunk": (lambda s: s["lanes"]["1"]["src"].__setitem__(0, [0, 0, 0, -2, 0]),
                                "checkpoint lane 1.src[0] pos must be at least -1, got -2"),
    "negative epoch": (lambda s: s["lanes"]["1"]["src"].__setitem__(1, [-1, 0, 0, -1, 0]),
                       "checkpoint lane 1.src[1] epoch must be at least 0, got -1"),
    "mixture past int64": (_lane_1("mix", [2**64, 0]),
                           "checkpoint lane 1.mix[0] must be at most 2^63 - 1, got "
                           "18446744073709551616"),
    "negative token counter": (_lane_1("n", [1, 1, -5, 0, {}]),
                               "checkpoint lane 1.n tokens must be at least 0, got -5"),
    "cursor as a number": (_lane_1("src", 7), "checkpoint lane 1.src must be a list, got int 7"),
    "end flag of 2": (_lane_1("end", 2), "checkpoint lane 1.end must be 1 when present, got 2"),
    "unknown top-level key": (lambda s: s.__setitem__("stepp", 1),
                              "checkpoint has unknown keys ['stepp']"),
    "edited fingerprint document": (
        lambda s: s["fingerprint_doc"]["recipe"].__setitem__("seed", 6),
        "checkpoint: its fingerprint document does not hash to its fingerprint"),
}


@pytest.fixture(scope="module")
def saved_state(corpus: DemoCorpus) -> dict[str, Any]:
    return _state_after(load_recipe(base_recipe_dict(corpus)), 3)


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_a_damaged_unsealed_state_is_refused_naming_the_value(saved_state: dict[str, Any],
                                                               case: str) -> None:
    change, message = OUT_OF_RANGE[case]
    bad = _unsealed(saved_state)
    change(bad)
    with pytest.raises(MismatchError) as info:
        Checkpoint.from_json(bad, allow_unsealed=True)
    assert str(info.value).startswith(message)


def test_a_carry_over_no_lane_could_hold_is_refused(make_recipe: Callable[..., Recipe],
                                                    saved_state: dict[str, Any]) -> None:
    """20,000 carried pieces are refused at once (each was re-read, for over a minute)."""
    bad = _unsealed(saved_state)
    bad["lanes"]["1"]["pack"] = {"wrap": {"held": [[0, [0, 0], 0, 1]] * 20_000}}
    assert _restore_error(make_recipe(), bad, unsealed=True) == (
        "lane 1 state: open sequence 0 of the packer's carry-over holds 20000 pieces of 20000 "
        "tokens, more than a sequence of 129 tokens can hold; the state is damaged")
    r = make_recipe(packing={"algorithm": "bestfit", "bestfit_bins": 2})
    state = _unsealed(_state_after(r, 3))
    state["lanes"]["1"]["pack"] = {"bestfit": {"bins": [[[0, [0, 0], 0, 1]]] * 3,
                                               "pending": None}}
    assert _restore_error(r, state, unsealed=True) == (
        "lane 1 state: the packer's carry-over has 3 open sequences; the recipe's packing "
        "keeps at most 2")


def test_state_files_that_are_not_utf8_or_too_deep(tmp_path: Path,
                                                   saved_state: dict[str, Any]) -> None:
    text = json.dumps(saved_state).encode()
    path = tmp_path / "s.json"
    path.write_bytes(text.replace(b'"fingerprint"', b'"fingerpr\xefnt"', 1))
    offset = text.index(b'"fingerprint"') + 9
    with pytest.raises(MismatchError) as info:
        Checkpoint.load(str(path))
    assert str(info.value) == f"state file {path} is not UTF-8 text: byte 0xef at offset {offset}"
    for depth in (100, 100_000):
        path.write_text("[" * depth + "]" * depth)
        with pytest.raises(MismatchError) as info:
            Checkpoint.load(str(path))
        assert str(info.value) == (f"state file {path} is nested deeper than 64 levels; no "
                                   f"datalane file is")


def test_recipe_files_that_are_not_utf8_or_too_deep(tmp_path: Path, tok: str) -> None:
    yaml_path = tmp_path / "r.yaml"
    yaml_path.write_bytes(b"lanes: 1\nseed: 0\n# caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(yaml_path)
    assert str(info.value) == f"recipe {yaml_path} is not UTF-8 text: byte 0xe9 at offset 22"
    json_path = tmp_path / "r.json"
    for path, text in ((json_path, '{"lanes": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                       (yaml_path, "lanes: " + "[" * 100_000 + "]" * 100_000 + "\n"),
                       (yaml_path, "lanes: " + "[" * 80 + "]" * 80 + "\n")):
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_recipe(path)
        assert str(info.value) == (f"recipe {path} is nested deeper than 64 levels; no "
                                   f"datalane file is")
