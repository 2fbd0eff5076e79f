"""What the stream-format fuzzers (JSONL, Parquet, token files) share: field-targeted mutations,
a wall bound per case, reading through the plan. (The dataset fuzzers of MDS, WebDataset, Arrow
and Lance share tests/engine/formats/fuzz/harness.py.)

A case is a small valid file (or dataset) of one format, mutated, then planned and read by
datalane's real plan and record reader (``Plan.build`` cuts the files with the format's own
``cut``; ``RecordReader`` reads every chunk; the format decodes each record), and compared
with what an independent reference reads from the same mutated bytes. The outcome is exactly
one of:

* ``error`` - a datalane :class:`DataError` or :class:`ConfigError` whose message names the
  file;
* ``bad`` - more records set aside with a bad-record reason (``too_large``,
  ``malformed_json``, ...) than in the original file, and every other record exactly what
  the reference reads;
* ``exact`` - the original documents, exactly;
* ``changed`` - documents other than the original ones, exactly what the reference reads
  from the mutated bytes: the mutation changed the content and left a valid file (a flipped
  bit inside a JSON string, a token id), which no reader can tell from the writer's intent.

Anything else fails the test: a raw exception of another type, a message without the file,
documents that differ from the reference (data changed silently), or a case that runs past
:data:`WALL_S` (a hang: the case runs on a thread that is abandoned).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datalane.corpus import tokenizer_path
from datalane.engine.chunks import RecordReader
from datalane.engine.formats import format_for
from datalane.engine.formats.base import TooLarge
from datalane.engine.plan import Plan
from datalane.spec.errors import ConfigError, DataError
from datalane.spec.limits import TOO_LARGE
from datalane.spec.recipe import load_recipe

WALL_S = 20.0  # one case: far above what any case takes (well under a second)

#: values a targeted mutation writes into a header or index field
HOSTILE = [0, 1, -1, 2, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 32,
           (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


@dataclass(frozen=True)
class Field:
    """A field of a file's layout: ``width`` bytes at ``offset``, little-endian."""

    offset: int
    width: int


def mutations(size: int, fields: list[Field]) -> st.SearchStrategy[tuple[Any, ...]]:
    """Bit flips anywhere, truncations, and hostile values written into the layout's fields
    (targeted: most mutations hit a header or index field, not random bytes)."""
    flips = st.tuples(st.just("flip"), st.integers(0, max(size * 8 - 1, 0)))
    cuts = st.tuples(st.just("truncate"), st.integers(0, max(size - 1, 0)))
    targeted = st.tuples(st.just("field"), st.sampled_from(fields) if fields else st.nothing(),
                         st.one_of(st.sampled_from(HOSTILE), st.integers(0, 64),
                                   st.integers(-(1 << 63), (1 << 64) - 1)))
    garbage = st.tuples(st.just("garbage"), st.sampled_from(fields) if fields else st.nothing(),
                        st.binary(min_size=1, max_size=8))
    return st.one_of(flips, cuts, targeted, targeted, garbage) if fields else st.one_of(
        flips, cuts)


def mutate(data: bytes, how: tuple[Any, ...]) -> bytes:
    out = bytearray(data)
    if how[0] == "flip":
        out[how[1] // 8] ^= 1 << (how[1] % 8)
    elif how[0] == "truncate":
        del out[how[1]:]
    elif how[0] == "field":
        f, value = how[1], how[2]
        out[f.offset:f.offset + f.width] = (value % (1 << (8 * f.width))).to_bytes(
            f.width, "little")
    else:
        f, junk = how[1], how[2]
        out[f.offset:f.offset + f.width] = (junk * f.width)[:f.width]
    return bytes(out[:len(data)]) if how[0] != "truncate" else bytes(out)


@contextmanager
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="datalane-fuzz-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


#: the modules that read records against MAX_RECORD_BYTES
BOUNDED = ["datalane.engine.formats.jsonl", "datalane.engine.formats.tokenfile",
           "datalane.engine.formats.flatbin", "datalane.engine.formats.parquet"]


def small_bound(monkeypatch: Any, limit: int) -> None:
    """Read records against a bound of ``limit`` bytes instead of 64 MiB, so that the small
    files of a fuzzer reach it: a mutation that joins two records (a newline or a boundary id
    flipped, a document index changed) makes one over it, which must be ``too_large``."""
    import importlib

    for name in BOUNDED:
        monkeypatch.setattr(importlib.import_module(name), "MAX_RECORD_BYTES", limit,
                            raising=False)


def within_wall(fn: Callable[[], Any], what: str) -> Any:
    """``fn()`` on a thread of its own; a case that runs past :data:`WALL_S` is a hang."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name="fuzz-case")
    t.start()
    t.join(WALL_S)
    if t.is_alive():
        raise AssertionError(f"{what}: no outcome within {WALL_S} s (a hang)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def read_source(source: dict[str, Any], **recipe_fields: Any,
                ) -> list[tuple[int, int, Any, str | None]]:
    """Plan a one-source recipe (``recipe_fields`` override its defaults: a tokenizer, the
    packing) and read every record of every chunk in file order:
    ``(file, position, decoded value, bad-record reason)``."""
    recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 16,
                          "tokenizer": {"uri": tokenizer_path()},
                          "sources": [{"name": "s", **source}], **recipe_fields})
    plan = Plan.build(recipe)
    sp = plan.sources[0]
    reader = RecordReader(sp.files, sp.source.field, sp.source)
    out = []
    try:
        for chunk in sorted(sp.chunks, key=lambda c: (c.file, c.start)):
            fmt = format_for(sp.files[chunk.file].format, sp.source)
            for pos, raw in reader.records(chunk):
                if isinstance(raw, TooLarge):
                    out.append((chunk.file, pos, None, TOO_LARGE))
                    continue
                value, reason, _ = fmt.decode(raw, sp.source.field)
                if isinstance(value, np.ndarray):
                    value = value.tolist()
                out.append((chunk.file, pos, value, reason))
    finally:
        reader.close()
    return out


def fuzzing(examples: int) -> settings:
    """Hypothesis settings of a fuzzer: a fixed budget, derandomized (the same cases on every
    run), no example database, no deadline (the per-case bound is :func:`within_wall`)."""
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))


ALL: list[Outcomes] = []  # every fuzzer's counts, reported when the session ends


class Outcomes:
    """Counts of each outcome, for the report (printed at the end of a session by
    ``tests/engine/formats/fuzz/conftest.py``, and appended to ``$DATALANE_FUZZ_REPORT`` if set)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: Counter[str] = Counter()
        ALL.append(self)

    def error(self, e: Exception, names: list[str]) -> None:
        assert isinstance(e, DataError | ConfigError), f"a raw {type(e).__name__}: {e}"
        assert any(n in str(e) for n in names), f"the error names no file: {e}"
        self.counts["error"] += 1

    def records(self, got: list[Any], expected: list[Any], original: list[Any]) -> None:
        """``expected``: what the reference reads from the mutated bytes (same form)."""
        assert got == expected, "documents differ from what the mutated bytes hold"
        if sum(r[-1] is not None for r in got) > sum(r[-1] is not None for r in original):
            self.counts["bad"] += 1
        elif got == original:
            self.counts["exact"] += 1
        else:
            self.counts["changed"] += 1

    def report(self) -> str:
        line = f"{self.name}: {sum(self.counts.values())} files fuzzed, " + ", ".join(
            f"{k} {self.counts[k]}" for k in ("error", "bad", "exact", "changed"))
        with open(os.environ.get("DATALANE_FUZZ_REPORT", os.devnull), "a") as f:
            f.write(line + "\n")
        return line


def check_case(outcomes: Outcomes, names: list[str], read: Callable[[], Any],
               reference: Callable[[], Any], original: list[Any], what: str) -> None:
    """One case: datalane's reading against the reference's (None: the reference refuses the
    bytes, and datalane must raise)."""
    try:
        got = within_wall(read, what)
    except AssertionError:
        raise
    except Exception as e:  # judged: a datalane error naming the file, or a failure
        outcomes.error(e, names)
        return
    expected = reference()
    assert expected is not None, (
        f"{what}: datalane read {len(got)} records from bytes the reference refuses")
    outcomes.records(got, expected, original)


def fuzz_file(outcomes: Outcomes, data: bytes, fields: list[Field], suffix: str,
              read: Callable[[Path], Any], reference: Callable[[bytes], Any], examples: int,
              what: str) -> list[Any]:
    """Fuzz one file: the clean ``data`` must read (``read(path)``) as ``reference(data)``
    reads it; then ``examples`` mutated copies, each a fresh file, judged by
    :func:`check_case`. Returns the clean file's records for the caller's own checks."""
    with workdir() as d:
        clean = d / f"clean{suffix}"
        clean.write_bytes(data)
        original: list[Any] = read(clean)
        assert original == reference(data), f"{what}: the clean file reads otherwise"
        counter = iter(range(1 << 30))

        @fuzzing(examples)
        @given(how=mutations(len(data), fields))
        def case(how: tuple[Any, ...]) -> None:
            bad = mutate(data, how)
            path = d / f"case{next(counter)}{suffix}"  # a fresh name: no index of another case
            path.write_bytes(bad)
            check_case(outcomes, [str(path)], lambda: read(path), lambda: reference(bad),
                       original, f"{what} {how}")

        case()
    return original


def parquet_bytes(table: Any, row_group_size: int = 8) -> tuple[bytes, list[Field]]:
    """An uncompressed Parquet file of ``table`` and its layout's fields: the magic, the footer
    length and every byte of the thrift footer (row counts, column chunk offsets and sizes),
    then 4- and 8-byte runs of it."""
    import io

    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=row_group_size, compression="none")
    data = out.getvalue()
    footer = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer
    fields = [Field(0, 4), Field(len(data) - 8, 4), Field(len(data) - 4, 4)]
    fields += [Field(i, 1) for i in range(start, len(data) - 8)]
    fields += [Field(i, 4) for i in range(start, len(data) - 12, 3)]
    fields += [Field(i, 8) for i in range(start, len(data) - 16, 5)]
    return data, fields


def text(v: Any) -> Any:
    """Bytes that are UTF-8 as the string they spell (datalane reads a row group holding a
    string that is not UTF-8 as bytes, value by value; the text kind decodes them later)."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v
    return v
