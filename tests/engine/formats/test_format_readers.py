"""The MDS, WebDataset, Arrow (HF) and Lance readers against their formats' own tools.

MDS: datalane's shard reader decodes every column of shards that MosaicML Streaming's
``MDSWriter`` wrote (``tests/data/mds``) to the values the generator wrote. WebDataset: the
header walk finds the members :mod:`tarfile` finds (pax, GNU long names, directories), and
samples split by key as ``webdataset`` splits them. Arrow: the message walk finds the record
batches pyarrow wrote (stream, file, legacy and compressed IPC). For each, the chunks of a
file hold every record exactly once, whatever the chunk size, and a chunk restarts at any
record. Dataset directories are listed as their own index files say.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pytest

from datalane.engine.files import SourceFile, expand
from datalane.engine.formats import FORMATS
from datalane.engine.formats.base import Chunk
from datalane.engine.formats.directories import directory_lister
from datalane.engine.formats.hf import arrow_index, list_hf_directory
from datalane.engine.formats.mds import list_mds_directory
from datalane.engine.formats.webdataset import TarMember, _members, _Tape, split_key
from datalane.spec import ConfigError, DataError
from datalane.spec.formats import compression_of, infer_format, unsupported_compression
from tests.data.make_mds import HERE as MDS_DATA
from tests.data.make_mds import TEXT_SAMPLES, sample

LOCAL = fsspec.filesystem("file")


def _files(listed: list[tuple[str, int, str]], fmt: str) -> list[SourceFile]:
    return [SourceFile(p, s, i, fmt, compression_of(p)) for p, s, i in listed]


def _all_records(fmt: str, files: list[SourceFile], field: str, chunks: list[Chunk]) -> list[Any]:
    reader = FORMATS[fmt].reader(files, field)
    return [(c.file, pos, raw) for c in chunks for pos, raw in reader.records(c)]


def _check_chunks_and_restarts(fmt: str, files: list[SourceFile], field: str,
                               chunk_bytes: int, chunk_rows: int | None) -> list[Any]:
    """Every record once, in file order, and each chunk restartable at each of its records."""
    reference = [(f, pos) for f, pos, _ in _all_records(
        fmt, files, field, [c for i, sf in enumerate(files)
                            for c in FORMATS[fmt].cut(i, sf, 1 << 40, None)])]
    chunks = [c for i, sf in enumerate(files)
              for c in FORMATS[fmt].cut(i, sf, chunk_bytes, chunk_rows)]
    got = _all_records(fmt, files, field, chunks)
    assert [(f, pos) for f, pos, _ in got] == reference
    reader = FORMATS[fmt].reader(files, field)
    for c in chunks[:: max(1, len(chunks) // 5)]:
        inside = [pos for f, pos, _ in got if f == c.file and
                  (c.start <= pos and (c.stop < 0 or pos < c.stop))]
        for k, pos in enumerate(inside):
            assert [p for p, _ in reader.records(c, pos)] == inside[k:]
    return got


# -- registry ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "fmt", "compression"), [
    ("d/shard.00000.mds", "mds", None), ("d/shard.00000.mds.zstd", "mds", "zstd"),
    ("d/shard.00000.mds.gz", "mds", "gzip"), ("s3://b/web.lance", "lance", None),
    ("x/shard-0001.tar", "webdataset", None), ("x/shard-0001.tar.gz", "webdataset", "gzip"),
    ("h/data-00000-of-00002.arrow", "hf", None),
    ("hf://datasets/org/name/data/train-00000-of-00001.parquet", "parquet", None)])
def test_new_formats_are_inferred_from_their_names(name: str, fmt: str,
                                                   compression: str | None) -> None:
    assert (infer_format(name), compression_of(name)) == (fmt, compression)


def test_mds_compressions_datalane_does_not_read_are_refused_by_name() -> None:
    assert unsupported_compression("shard.00000.mds.br") == "brotli"
    assert unsupported_compression("shard.00000.mds.snappy") == "snappy"
    assert unsupported_compression("shard.00000.mds.bz2") == "bzip2"


# -- MDS -----------------------------------------------------------------------------------------

def _mds_files(name: str = "text") -> list[SourceFile]:
    listed = list_mds_directory(LOCAL, os.path.join(MDS_DATA, name))
    assert listed is not None
    return _files(listed, "mds")


@pytest.mark.parametrize("column", ["id", "text", "raw", "meta", "score", "ids", "grid", "big",
                                    "small"])
def test_mds_columns_decode_to_what_the_writer_was_given(column: str) -> None:
    files = _mds_files()
    chunks = [c for i, sf in enumerate(files) for c in FORMATS["mds"].cut(i, sf, 1 << 20, None)]
    values = [FORMATS["mds"].decode(raw, column) for _, _, raw in
              _all_records("mds", files, column, chunks)]
    assert len(values) == TEXT_SAMPLES
    for i, (value, reason, _) in enumerate(values):
        expected = sample(i)[column]
        assert reason is None
        if isinstance(expected, np.ndarray):
            assert value.dtype == expected.dtype and value.shape == expected.shape
            np.testing.assert_array_equal(value, expected)
        else:
            assert value == expected, (i, column)


@pytest.mark.parametrize(("chunk_bytes", "chunk_rows"),
                         [(1, None), (700, None), (5000, None), (1 << 20, None), (1 << 20, 1),
                          (1 << 20, 7), (1 << 20, 1000)])
def test_mds_chunks_hold_every_sample_once_and_restart_anywhere(chunk_bytes: int,
                                                                chunk_rows: int | None) -> None:
    files = _mds_files()
    got = _check_chunks_and_restarts("mds", files, "text", chunk_bytes, chunk_rows)
    assert [FORMATS["mds"].decode(raw, "text")[0] for _, _, raw in got] == [
        sample(i)["text"] for i in range(TEXT_SAMPLES)]
    chunks = [c for i, sf in enumerate(files)
              for c in FORMATS["mds"].cut(i, sf, chunk_bytes, chunk_rows)]
    if chunk_rows == 7:
        assert [c.stop - c.start for c in chunks if c.file == 3] == [7, 7, 7, 7, 7, 2]
    if chunk_bytes == 1:  # every sample is a chunk of its own
        assert len(chunks) == TEXT_SAMPLES


def test_mds_compressed_shards_are_one_chunk_each() -> None:
    files = _mds_files("zstd")
    assert [f.compression for f in files] == ["zstd", "zstd"]
    assert [FORMATS["mds"].cut(i, sf, 1, 1) for i, sf in enumerate(files)] == [
        [Chunk(0, 0, 46)], [Chunk(1, 0, 14)]]
    _check_chunks_and_restarts("mds", files, "text", 1, None)
    assert FORMATS["mds"].decode(FORMATS["mds"].reader(files, "text").read_one((1, 3)),
                                 "text")[0].startswith("zmds doc 49 ")


def _index(tmp_path: Path, shards: list[dict[str, Any]]) -> Path:
    d = tmp_path / "ds"
    d.mkdir(exist_ok=True)
    (d / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))
    return d


def test_mds_listing_prefers_the_raw_shard_and_names_what_is_missing(tmp_path: Path) -> None:
    index = json.loads((Path(MDS_DATA) / "zstd" / "index.json").read_text())
    d = _index(tmp_path, index["shards"])
    shutil.copy(Path(MDS_DATA) / "zstd" / "shard.00000.mds.zstd", d)
    shutil.copy(Path(MDS_DATA) / "zstd" / "shard.00001.mds.zstd", d)
    (d / "shard.00001.mds").write_bytes(b"raw")
    listed = list_mds_directory(LOCAL, str(d))
    assert [os.path.basename(p) for p, _, _ in listed or []] == ["shard.00000.mds.zstd",
                                                                 "shard.00001.mds"]
    os.remove(d / "shard.00000.mds.zstd")
    with pytest.raises(ConfigError, match=r"shard 0 \(shard.00000.mds, shard.00000.mds.zstd\) "
                                          r"is missing"):
        list_mds_directory(LOCAL, str(d))
    d = _index(tmp_path, [{**index["shards"][0], "format": "json"}])
    with pytest.raises(ConfigError, match="shard 0 is in the 'json' format"):
        list_mds_directory(LOCAL, str(d))
    assert list_mds_directory(LOCAL, str(tmp_path / "nothing-here")) is None


@pytest.mark.parametrize(("encoding", "message"), [
    ("pkl", "never unpickles data"), ("png", "holds images"), ("zzz", "does not know")])
def test_mds_columns_datalane_cannot_read_are_refused(tmp_path: Path, encoding: str,
                                                      message: str) -> None:
    # the text column (the last one) re-labelled in the shard's config; same length, so the
    # sample offsets stay right
    raw = bytearray((Path(MDS_DATA) / "text" / "shard.00003.mds").read_bytes())
    at = raw.find(b'"str"]', raw.find(b'"column_encodings"'))
    raw[at:at + 6] = f'"{encoding}"]'.encode()
    path = tmp_path / "shard.00000.mds"
    path.write_bytes(bytes(raw))
    reader = FORMATS["mds"].reader([SourceFile(str(path), len(raw), "x", "mds", None)], "text")
    with pytest.raises(ConfigError, match=message):
        next(iter(reader.records(Chunk(0, 0, 3))))


# -- WebDataset ----------------------------------------------------------------------------------

def test_member_names_split_into_key_and_extension_as_webdataset_splits_them() -> None:
    from webdataset.tariterators import base_plus_ext

    names = ["000.txt", "a/b/000.txt", "a.b/000.txt", "000.meta.json", "x/y.z/k.seg.TXT",
             "noext", "dir/", ".hidden", "a/.txt", "k.", "k.tar.gz"]
    for name in names:
        key, ext = base_plus_ext(name)
        assert split_key(name) == (None if key is None else (key, ext.lower()))


def _walk(path: Path) -> list[TarMember]:
    with open(path, "rb") as f:
        return list(_members(_Tape(f, 0, True, str(path)), os.path.getsize(path)))


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_the_header_walk_finds_the_members_tarfile_finds(tmp_path: Path, fmt: int) -> None:
    path = tmp_path / "t.tar"
    names = ["k0.txt", "dir/k1.txt", "d" * 60 + "/" + "e" * 60 + ".txt", "k2.json"]
    if fmt != tarfile.USTAR_FORMAT:
        names += ["x" * 150 + ".txt", "naïve/ünïcode.txt"]
    with tarfile.open(path, "w", format=fmt) as tf:
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        for k, name in enumerate(names):
            info = tarfile.TarInfo(name)
            body = os.urandom(k * 300 + 1)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    with tarfile.open(path) as tf:
        expected = [(m.offset, m.name, m.offset_data, m.size) for m in tf.getmembers()
                    if m.isfile()]
    assert [(m.offset, m.name, m.data, m.size) for m in _walk(path)] == expected


# webdataset 1.0.2's tar iterator leaves the shard it read open (its reference read, not ours)
@pytest.mark.filterwarnings("ignore:unclosed file <_io.BufferedReader.*/s.tar:ResourceWarning")
def test_webdataset_chunks_match_webdatasets_own_reader(tmp_path: Path) -> None:
    import webdataset as wds

    path = tmp_path / "s.tar"
    with wds.TarWriter(str(path)) as w:
        for i in range(90):
            w.write({"__key__": f"k{i:04d}", "txt": f"text {i} " * (i % 9 + 1),
                     **({"json": {"i": i}} if i % 2 else {})})
    theirs = [(s["__key__"], s["txt"]) for s in wds.WebDataset(str(path), shardshuffle=False)]
    sf = SourceFile(str(path), os.path.getsize(path), "x", "webdataset", None)
    for chunk_bytes, chunk_rows in [(1, None), (3000, None), (1 << 20, None), (1 << 20, 4)]:
        got = _check_chunks_and_restarts("webdataset", [sf], "txt", chunk_bytes, chunk_rows)
        assert [(raw.key, raw.data) for _, _, raw in got] == theirs
    assert len(FORMATS["webdataset"].cut(0, sf, 1 << 20, 4)) == 23
    assert FORMATS["webdataset"].reader([sf], "txt").fields(0) == ["txt", "json"]


# -- Arrow IPC (HF) ------------------------------------------------------------------------------

_TABLE = pa.table({"text": [f"row {i}" for i in range(100)], "n": list(range(100))})


def _write_ipc(path: Path, kind: str) -> list[int]:
    """Write ``_TABLE`` in batches of 1..13 rows (and an empty one); the batches' rows."""
    sizes = [0, *[(k % 13) + 1 for k in range(14)]]
    sizes.append(100 - sum(sizes))
    options = pa.ipc.IpcWriteOptions(compression="zstd" if kind == "zstd" else None,
                                      use_legacy_format=kind == "legacy")
    opener = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with opener(str(path), _TABLE.schema, options=options) as w:
        row = 0
        for n in sizes:
            w.write_batch(_TABLE.slice(row, n).to_batches()[0] if n else
                          pa.record_batch([pa.array([], pa.string()), pa.array([], pa.int64())],
                                          schema=_TABLE.schema))
            row += n
    return sizes


@pytest.mark.parametrize("kind", ["stream", "file", "legacy", "zstd"])
def test_the_message_walk_finds_the_batches_pyarrow_wrote(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "data.arrow"
    sizes = _write_ipc(path, kind)
    sf = SourceFile(str(path), os.path.getsize(path), f"{kind}", "hf", None)
    index = arrow_index(sf)
    assert np.diff(index.first_rows).tolist() == sizes
    for chunk_bytes, chunk_rows in [(1, None), (400, None), (1 << 20, None), (1 << 20, 1),
                                    (1 << 20, 17)]:
        got = _check_chunks_and_restarts("hf", [sf], "text", chunk_bytes, chunk_rows)
        assert [raw for _, _, raw in got] == _TABLE.column("text").to_pylist()
    assert len(FORMATS["hf"].cut(0, sf, 1, None)) == len(sizes) - 1  # whole batches, empty out
    assert FORMATS["hf"].reader([sf], "n").read_one((0, 57)) == 57


def test_dictionary_columns_are_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "dict.arrow"
    table = pa.table({"text": pa.array(["a", "b", "a"]).dictionary_encode()})
    with pa.ipc.new_stream(str(path), table.schema) as w:
        w.write_table(table)
    sf = SourceFile(str(path), os.path.getsize(path), "x", "hf", None)
    with pytest.raises(ConfigError, match=f"{path} holds dictionary-encoded columns"):
        FORMATS["hf"].cut(0, sf, 1 << 20, None)


def test_a_file_that_is_no_arrow_stream_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "x.arrow"
    path.write_bytes(b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\x00" * 3)
    with pytest.raises(DataError, match=str(path)):
        FORMATS["hf"].cut(0, SourceFile(str(path), 11, "x", "hf", None), 1 << 20, None)


def test_an_arrow_stream_cut_at_a_batch_boundary_is_a_data_error(tmp_path: Path) -> None:
    # without its end-of-stream marker the file would read as a shorter, complete one
    path = tmp_path / "x.arrow"
    _write_ipc(path, "stream")
    whole = path.read_bytes()
    assert whole[-8:] == b"\xff\xff\xff\xff\x00\x00\x00\x00"
    path.write_bytes(whole[:-8])
    sf = SourceFile(str(path), len(whole) - 8, "cut", "hf", None)
    with pytest.raises(DataError, match="without the end-of-stream marker"):
        FORMATS["hf"].cut(0, sf, 1 << 20, None)


def test_hf_listing_follows_state_json(tmp_path: Path) -> None:
    d = tmp_path / "ds"
    d.mkdir()
    for name in ("data-00001-of-00002.arrow", "data-00000-of-00002.arrow"):
        _write_ipc(d / name, "stream")
    state = {"_data_files": [{"filename": "data-00001-of-00002.arrow"},
                             {"filename": "data-00000-of-00002.arrow"}]}
    (d / "state.json").write_text(json.dumps(state))
    listed = list_hf_directory(LOCAL, str(d))
    assert [os.path.basename(p) for p, _, _ in listed or []] == [
        "data-00001-of-00002.arrow", "data-00000-of-00002.arrow"]
    assert [p for p, _, _ in expand(str(d), "test", directory_lister(None))] == [
        p for p, _, _ in listed or []]
    os.remove(d / "data-00000-of-00002.arrow")
    with pytest.raises(ConfigError, match=r"lists data-00000-of-00002\.arrow, which is not there"):
        list_hf_directory(LOCAL, str(d))
    assert list_hf_directory(LOCAL, str(tmp_path)) is None


def test_a_directory_no_format_knows_is_still_refused(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match="is a directory; use a glob"):
        expand(str(tmp_path), "test", directory_lister(None))
    with pytest.raises(ConfigError, match="is a directory; use a glob"):
        expand(str(tmp_path), "test", directory_lister("parquet"))
