"""Every declared format keeps the format contract, with the fixture writer of
tests/support/formats.py registered for it.

The contract (datalane/engine/formats/base.py): the chunks of a file hold every record exactly
once, in file order, whatever the chunk size; a chunk's reading restarts at any of its
records (``records(chunk, start=pos)`` is the tail from ``pos``), which is how a lane resumes;
``read_one(ref)`` gives the record the bulk read gave (how a packer's carry-over is re-read);
each record decodes to the value the writer wrote. The declaration (datalane/spec/formats.py)
agrees with the implementation: a format declared as token ids refuses a text source, a
format declared with a dataset directory lists the writer's directory. A format declared with
no fixture writer fails here by name, so a new format cannot ship without this test reading
it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.engine.formats import FORMATS, format_for
from datalane.engine.formats.base import Chunk, FormatBase
from datalane.engine.formats.directories import LISTERS
from datalane.spec import ConfigError
from datalane.spec.formats import DECLARED, FORMAT_NAMES
from datalane.spec.recipe import Source
from tests.support.formats import WRITERS, Written

BIG = 1 << 40


def test_every_declared_format_has_a_fixture_writer() -> None:
    missing = [f.name for f in DECLARED if f.name not in WRITERS]
    assert not missing, (f"formats declared in datalane/spec/formats.py without a fixture "
                         f"writer in tests/support/formats.py WRITERS: {missing}")
    stray = sorted(set(WRITERS) - set(FORMAT_NAMES))
    assert not stray, f"fixture writers for formats nobody declares: {stray}"


def test_every_format_object_of_the_engine_is_declared() -> None:
    """A format module whose format was never declared (forgotten line) is caught by name."""
    import importlib
    import pkgutil

    import datalane.engine.formats as package

    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, FormatBase):
                found[value.name] = f"{module.__name__}"
    undeclared = {n: m for n, m in found.items() if n not in FORMAT_NAMES}
    assert not undeclared, (f"formats implemented but not declared in "
                            f"datalane/spec/formats.py DECLARED: {undeclared}")
    assert set(FORMATS) == set(FORMAT_NAMES)


@pytest.fixture(scope="module", params=FORMAT_NAMES)
def written(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Written]:
    name: str = request.param
    if name not in WRITERS:
        pytest.fail(f"format {name!r} has no fixture writer in tests/support/formats.py")
    return name, WRITERS[name](tmp_path_factory.mktemp(name))


def _plain(value: Any) -> Any:
    """A decoded value as the writer gave it: token ids as a list, text as str (a format may
    hand the text kind UTF-8 bytes, which it decodes)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.decode() if isinstance(value, bytes) else value


def _chunks(fmt: Any, w: Written, chunk_bytes: int, chunk_rows: int | None) -> list[Chunk]:
    return [c for i, sf in enumerate(w.files) for c in fmt.cut(i, sf, chunk_bytes, chunk_rows)]


def _records(reader: Any, chunks: list[Chunk]) -> list[tuple[int, int, Any]]:
    return [(c.file, pos, raw) for c in chunks for pos, raw in reader.records(c)]


def test_records_decode_to_what_was_written(written: tuple[str, Written]) -> None:
    name, w = written
    assert {sf.format for sf in w.files} == {name}, "the writer's files infer to its format"
    fmt = format_for(name, w.source)
    reader = fmt.reader(w.files, w.source.field)
    try:
        got = []
        for _, _, raw in _records(reader, _chunks(fmt, w, BIG, None)):
            value, reason, detail = fmt.decode(raw, w.source.field)
            assert reason is None, f"{name}: a record the writer wrote is bad: {detail}"
            got.append(_plain(value))
    finally:
        reader.close()
    assert got == w.values


def test_records_and_formats_cross_to_a_map_process(written: tuple[str, Written]) -> None:
    """``map_processes`` pickles each task's raw records and the files' formats
    (datalane/engine/mapprocs.py): what arrives decodes to what was written."""
    import pickle

    name, w = written
    fmt = format_for(name, w.source)
    reader = fmt.reader(w.files, w.source.field)
    try:
        records = _records(reader, _chunks(fmt, w, BIG, None))
    finally:
        reader.close()
    there_records, there_fmt = pickle.loads(pickle.dumps((records, fmt), protocol=5))
    got = []
    for (f, pos, _), (f2, pos2, raw) in zip(records, there_records, strict=True):
        assert (f, pos) == (f2, pos2)
        value, reason, detail = there_fmt.decode(raw, w.source.field)
        assert reason is None, f"{name}: a record that crossed is bad: {detail}"
        got.append(_plain(value))
    assert got == w.values


def test_every_record_is_in_exactly_one_chunk(written: tuple[str, Written]) -> None:
    name, w = written
    fmt = format_for(name, w.source)
    reader = fmt.reader(w.files, w.source.field)
    try:
        whole = [(f, pos) for f, pos, _ in _records(reader, _chunks(fmt, w, BIG, None))]
        assert len(set(whole)) == len(whole) == len(w.values)
        # a byte-unit format is also cut at every byte: a record that starts exactly on a
        # chunk's first byte belongs to that chunk, whatever the writer's record sizes
        every_byte = [(1, None)] if fmt.unit == "byte" else []
        for chunk_bytes, chunk_rows in [*w.chunkings, *every_byte]:
            chunks = _chunks(fmt, w, chunk_bytes, chunk_rows)
            assert len(chunks) > len(w.files), (
                f"{name}: chunk_bytes={chunk_bytes} chunk_rows={chunk_rows} cuts no file in "
                f"several chunks; the writer's chunkings must")
            got = [(f, pos) for f, pos, _ in _records(reader, chunks)]
            assert got == whole, (f"{name}: chunks of chunk_bytes={chunk_bytes} "
                                  f"chunk_rows={chunk_rows} hold other records than the files")
    finally:
        reader.close()


def test_reading_restarts_at_any_record(written: tuple[str, Written]) -> None:
    name, w = written
    fmt = format_for(name, w.source)
    chunk_bytes, chunk_rows = w.chunkings[-1]
    chunks = _chunks(fmt, w, chunk_bytes, chunk_rows)
    reader = fmt.reader(w.files, w.source.field)
    try:
        for c in chunks:
            inside = [(pos, _plain(fmt.decode(raw, w.source.field)[0]))
                      for pos, raw in reader.records(c)]
            for k, (pos, _) in enumerate(inside):
                tail = [(p, _plain(fmt.decode(raw, w.source.field)[0]))
                        for p, raw in reader.records(c, pos)]
                assert tail == inside[k:], f"{name}: chunk {c} restarted at {pos}"
    finally:
        reader.close()


def test_read_one_agrees_with_the_bulk_read(written: tuple[str, Written]) -> None:
    name, w = written
    fmt = format_for(name, w.source)
    bulk = fmt.reader(w.files, w.source.field)
    one = fmt.reader(w.files, w.source.field)  # a fresh reader, as a restored lane has
    try:
        records = _records(bulk, _chunks(fmt, w, *w.chunkings[0]))
        for f, pos, raw in reversed(records):  # backwards: no reader state to lean on
            again = one.read_one((f, pos))
            assert (_plain(fmt.decode(again, w.source.field)[0])
                    == _plain(fmt.decode(raw, w.source.field)[0])), f"{name}: ({f}, {pos})"
    finally:
        bulk.close()
        one.close()


def test_the_declaration_agrees_with_the_implementation(written: tuple[str, Written]) -> None:
    name, w = written
    spec = next(f for f in DECLARED if f.name == name)
    text = Source(name="t", uris=w.source.uris, format=name)
    if spec.token_ids:
        with pytest.raises(ConfigError, match="token ids"):
            FORMATS[name].for_source(text)
    else:
        assert FORMATS[name].for_source(text) is not None
    assert (name in LISTERS) == (spec.directory is not None)
    if spec.directory is not None:
        assert type(FORMATS[name]).list_directory is not FormatBase.list_directory, (
            f"{name} is declared with a dataset directory but implements no list_directory")


def test_a_declared_format_without_an_implementation_is_named(monkeypatch: Any,
                                                              tmp_path: Path) -> None:
    from datalane.engine.formats import implementation
    from datalane.spec.formats import FormatSpec

    with pytest.raises(ImportError, match=r"format 'nosuch' is declared in "
                                          r"datalane.spec.formats, but its implementation "
                                          r"datalane.engine.formats.nosuch:NOSUCH cannot be "
                                          r"loaded"):
        implementation(FormatSpec("nosuch", (".nosuch",)))
