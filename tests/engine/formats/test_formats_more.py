"""MDS, Lance, WebDataset and Hugging Face datasets as sources.

Each format's data is written by that format's own tools (``tests/data/format_corpus.py``).
Per format: nothing is lost (every document arrives exactly once per epoch, counted from the
decoded tokens, not from datalane's counters), the document stream resumes anywhere, the bad
records of that format are counted under ``skip`` and named under ``fail``, and
``datalane verify`` finds one stream on worlds 1, 2, 4, 8, workers 1 and 3 and resumes, for a
recipe mixing a text source with the format. Also: fsspec URIs (``memory://``) and
``hf://`` Parquet routed to the Parquet format.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import struct
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from fsspec.implementations.local import LocalFileSystem
from tokenizers import Tokenizer

from datalane import ConfigError, DataError, Loader, load_recipe
from datalane.corpus import tokenizer_path
from datalane.engine.docstream import DocStream
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.knobs import Knobs
from datalane.spec.state import Counters, SourceCursor
from datalane.verify import verify
from tests.data.format_corpus import WRITERS, FormatData, text_of
from tests.data.make_mds import HERE as MDS_DATA
from tests.engine.test_bad_inputs import drain
from tests.guarantees.test_resume import assert_resume_anywhere

NEW_FORMATS = ["mds", "webdataset", "hf", "lance"]
_DOC = re.compile(r"^(\w+) doc (\d+) ")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FormatData]:
    root = tmp_path_factory.mktemp("formats")
    return {name: write(root) for name, write in WRITERS.items()}


def _tokenizer() -> Tokenizer:
    return Tokenizer.from_file(tokenizer_path())


def _recipe(sources: list[dict[str, Any]], **top: Any) -> Any:
    return load_recipe({"lanes": 4, "global_batch_size": 8, "seq_len": 128, "seed": 3,
                        "tokenizer": {"uri": tokenizer_path()}, "sources": sources,
                        "packing": {"algorithm": "bestfit", "bestfit_bins": 4},
                        "shuffle": {"block_size": 16}, **top})


def _documents(step: Any, eos: int) -> Iterator[list[int]]:
    """Each document of a step's sequences (bestfit: a short document is never split)."""
    for ids, pos in zip(step.input_ids, step.positions, strict=True):
        real = ids[pos >= 0]
        if not len(real):  # an all-padding sequence at the end of the data
            continue
        starts = np.flatnonzero(pos[pos >= 0] == 0)
        for s, e in zip(starts, [*starts[1:], len(real)], strict=True):
            doc = real[s:e].tolist()
            assert doc[-1] == eos, "a document was cut (longer than a sequence?)"
            yield doc[:-1]


def _read_everything(recipe: Any) -> Counter[tuple[str, int]]:
    """``(prefix, id)`` of every document the loader emits, each checked against its text."""
    tok = _tokenizer()
    eos = tok.token_to_id("<|eos|>")
    seen: Counter[tuple[str, int]] = Counter()
    with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:
        for step in loader:
            for doc in _documents(step, eos):
                text = tok.decode(doc)
                m = _DOC.match(text)
                assert m is not None, f"not a test document: {text!r}"
                prefix, i = m.group(1), int(m.group(2))
                assert text == text_of(prefix, i)
                seen[prefix, i] += 1
            if step.ended:
                break
    return seen


# -- nothing lost ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_every_document_is_read_exactly_once_per_epoch(data: dict[str, FormatData],
                                                       fmt: str) -> None:
    d = data[fmt]
    recipe = _recipe([{"name": "s", **d.source, "epochs": 2}])
    plan = Plan.build(recipe)
    assert {f.format for f in plan.sources[0].files} == {fmt}
    assert len(plan.sources[0].chunks) >= recipe.lanes  # many lanes share the files
    seen = _read_everything(recipe)
    assert seen == Counter({(d.prefix, i): 2 for i in d.ids})


def test_a_text_source_and_every_new_format_in_one_recipe(data: dict[str, FormatData]) -> None:
    sources = [{"name": fmt, **data[fmt].source, "epochs": 1} for fmt in NEW_FORMATS]
    seen = _read_everything(_recipe(sources))
    assert seen == Counter({(data[f].prefix, i): 1 for f in NEW_FORMATS for i in data[f].ids})


# -- resume anywhere ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_the_document_stream_resumes_anywhere(data: dict[str, FormatData], fmt: str) -> None:
    plan = Plan.build(_recipe([{"name": "s", **data[fmt].source, "epochs": 2}]))
    stage = plan.map_stages()[0]
    knobs = Knobs(workers=3, prefetch=2, task_docs=5)
    with TaskPool(3) as pool:

        def make(state: Any) -> DocStream:
            cursor = SourceCursor.decode(state, "cursor") if state is not None else None
            return DocStream(plan.sources[0], 1, stage, pool, knobs, 16, "skip", Counters(),
                             cursor)

        def advance(s: DocStream) -> Any:
            got = s.next_doc()
            return None if got is None else (got.columns[0].tobytes(), got.ref)

        probe = make(None)
        total = 0
        while probe.next_doc() is not None:
            total += 1
        assert 2 * len(data[fmt].ids) // 8 < total < 2 * len(data[fmt].ids) // 2
        assert_resume_anywhere(make, advance, lambda s: s.cursor.encode(), total + 2,
                               points=[*range(0, total + 3, 9), 15, 16, 17, total - 1, total])


# -- datalane verify ------------------------------------------------------------------------------


def _write_parquet_text(path: Path, n: int = 200) -> str:
    pq.write_table(pa.table({"text": [text_of("web", i) for i in range(n)]}), path,
                   row_group_size=25)
    return str(path)


@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_verify_a_text_source_mixed_with_each_format(data: dict[str, FormatData], fmt: str,
                                                     tmp_path: Path, capsys: Any) -> None:
    recipe = {"lanes": 8, "global_batch_size": 16, "seq_len": 64, "seed": 11,
              "tokenizer": {"uri": tokenizer_path()},
              "sources": [{"name": "web", "uris": [_write_parquet_text(tmp_path / "w.parquet")],
                           "weight": 0.5, "epochs": None},
                          {"name": fmt, **data[fmt].source, "weight": 0.5, "epochs": None}],
              "packing": {"algorithm": "bestfit", "bestfit_bins": 4},
              "shuffle": {"block_size": 8}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert verify(str(path), 10, [1, 2, 4, 8], [1, 3], [0, 3, 7])
    assert "OK: 32 runs" in capsys.readouterr().out


# -- fsspec URIs and hf:// ----------------------------------------------------------------------


def _to_memory(local: Path, prefix: str) -> str:
    fs = fsspec.filesystem("memory")
    for dirpath, _, names in os.walk(local):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), local)
            with open(os.path.join(dirpath, name), "rb") as f:
                fs.pipe(f"{prefix}/{rel}", f.read())
    return f"memory://{prefix}"


@pytest.mark.parametrize("fmt", ["mds", "webdataset", "hf"])
def test_any_fsspec_uri_reads_the_same_documents(data: dict[str, FormatData], fmt: str) -> None:
    d = data[fmt]
    local = d.source["uris"][0]
    root = Path(local.split("/*")[0])
    uri = _to_memory(root, f"/formats-{fmt}")
    source = {**d.source, "uris": [local.replace(str(root), uri)]}
    plan = Plan.build(_recipe([{"name": "s", **source}]))
    assert all(f.uri.startswith("memory://") for f in plan.sources[0].files)
    assert _read_everything(_recipe([{"name": "s", **source}])) == Counter(
        {(d.prefix, i): 1 for i in d.ids})


class _LocalHub(LocalFileSystem):  # type: ignore[misc]
    """``hf://PATH`` as a local directory: the Hub's fsspec filesystem, without the Hub."""

    protocol = ("hf",)
    root = "/nonexistent"

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        path = str(path)
        path = path[len("hf://"):] if path.startswith("hf://") else path
        if path.startswith(cls.root):
            return path
        return os.path.join(cls.root, path.lstrip("/"))

    def unstrip_protocol(self, name: str) -> str:
        return "hf://" + os.path.relpath(name, self.root)


@pytest.fixture
def local_hub(tmp_path: Path) -> Iterator[Path]:
    from fsspec.registry import _registry

    before = _registry.get("hf")
    _LocalHub.root = str(tmp_path / "hub")
    fsspec.register_implementation("hf", _LocalHub, clobber=True)
    _LocalHub.clear_instance_cache()
    try:
        yield tmp_path / "hub"
    finally:
        if before is None:
            _registry.pop("hf", None)
        else:
            fsspec.register_implementation("hf", before, clobber=True)


def test_parquet_under_hf_uris_is_read_by_the_parquet_format(local_hub: Path) -> None:
    data_dir = local_hub / "datasets" / "org" / "corpus" / "data"
    data_dir.mkdir(parents=True)
    for k in range(2):
        pq.write_table(pa.table({"text": [text_of("hub", k * 60 + i) for i in range(60)]}),
                       data_dir / f"train-{k:05d}-of-00002.parquet", row_group_size=15)
    source = {"name": "hub", "uris": ["hf://datasets/org/corpus/data/*.parquet"], "epochs": 1}
    plan = Plan.build(_recipe([source]))
    assert [(f.uri, f.format) for f in plan.sources[0].files] == [
        (f"hf://datasets/org/corpus/data/train-{k:05d}-of-00002.parquet", "parquet")
        for k in range(2)]
    assert _read_everything(_recipe([source])) == Counter({("hub", i): 1 for i in range(120)})


def test_hf_uris_use_huggingface_hubs_filesystem_and_name_the_extra(monkeypatch: Any) -> None:
    from huggingface_hub import HfFileSystem

    assert fsspec.get_filesystem_class("hf") is HfFileSystem  # what production opens hf:// with

    real = fsspec.core.url_to_fs

    def missing(uri: str, **kw: Any) -> Any:
        if uri.startswith("hf://"):
            raise ImportError("Install huggingface_hub to access HfFileSystem")
        return real(uri, **kw)

    monkeypatch.setattr(fsspec.core, "url_to_fs", missing)
    with pytest.raises(ConfigError, match=r"pip install 'datalane\[hf\]'"):
        Plan.build(_recipe([{"name": "s", "uris": ["hf://datasets/org/x/*.parquet"]}]))


# -- bad records, per format ----------------------------------------------------------------------


def _one_lane(uris: list[str], bad_records: str = "skip", **source: Any) -> Any:
    return load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 64,
                        "tokenizer": {"uri": tokenizer_path()},
                        "sources": [{"name": "s", "uris": uris, "epochs": 1, **source}],
                        "shuffle": {"block_size": 1}, "bad_records": bad_records})


def _expected(texts: list[str]) -> np.ndarray:
    tok = _tokenizer()
    eos = tok.token_to_id("<|eos|>")
    return np.array([t for x in texts for t in [*tok.encode(x, add_special_tokens=False).ids,
                                                 eos]], dtype=np.int32)


def _fail_message(recipe_uris: list[str], **source: Any) -> str:
    with pytest.raises(DataError) as info:
        drain(_one_lane(recipe_uris, bad_records="fail", **source))
    return str(info.value)


def _mds_shard(tmp_path: Path) -> tuple[Path, bytearray, list[int]]:
    """A copy of the last committed shard (37 samples: ids 203-239) and its offsets."""
    raw = bytearray((Path(MDS_DATA) / "text" / "shard.00003.mds").read_bytes())
    (n,) = struct.unpack_from("<I", raw, 0)
    offsets = list(struct.unpack_from(f"<{n + 1}I", raw, 4))
    return tmp_path / "shard.00003.mds", raw, offsets


def test_mds_bad_records_are_counted_and_named(tmp_path: Path) -> None:
    path, raw, offsets = _mds_shard(tmp_path)
    ids = list(range(203, 240))
    assert len(offsets) == len(ids) + 1
    # sample 3 (id 206): its text is no UTF-8; sample 5 (id 208): its first size field
    # (column 'big', variable-size) runs past the sample, so no column can be found
    text = text_of("mds", 206).encode()
    at = raw.find(text)
    assert at > 0 and raw.count(text) == 1
    raw[at + 4] = 0xFF
    struct.pack_into("<I", raw, offsets[5], 1 << 30)
    path.write_bytes(bytes(raw))
    tokens, counters = drain(_one_lane([str(path)]))
    good = [i for i in ids if i not in (206, 208)]
    np.testing.assert_array_equal(tokens, _expected([text_of("mds", i) for i in good]))
    assert counters.skipped == {"non_utf8": 1, "malformed_sample": 1}
    message = _fail_message([str(path)])
    assert f"{path} at sample 3" in message and "invalid UTF-8 at byte 4" in message


def test_a_truncated_mds_shard_and_a_missing_column_stop_with_the_file(tmp_path: Path) -> None:
    path, raw, _ = _mds_shard(tmp_path)
    path.write_bytes(bytes(raw[:-10]))
    with pytest.raises(DataError, match=rf"{path}: the MDS shard is truncated"):
        Plan.build(_one_lane([str(path)]))
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError) as info:
        drain(_one_lane([str(path)], text_field="body"))
    assert "'big', 'grid', 'id', 'ids', 'meta', 'raw', 'score', 'small', 'text'" in str(
        info.value)


def test_a_compressed_mds_dataset_is_read_and_its_truncation_named(tmp_path: Path) -> None:
    tokens, counters = drain(_one_lane([os.path.join(MDS_DATA, "zstd")]))
    assert counters.kept == 60 and counters.skipped == {}
    # one chunk per compressed shard; lanes=1 reads the 2 shards in a permuted order
    expected = {_expected([text_of("zmds", i) for i in r]).tobytes()
                for r in (range(46), range(46, 60))}
    assert tokens.tobytes() in {a + b for a in expected for b in expected if a != b}
    shard = tmp_path / "shard.00000.mds.zstd"
    whole = (Path(MDS_DATA) / "zstd" / "shard.00000.mds.zstd").read_bytes()
    shard.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError) as info:
        drain(_one_lane([str(shard)]))
    assert str(shard) in str(info.value)


def _tar(path: Path, members: list[tuple[str, bytes]]) -> dict[str, int]:
    """Write ``members`` in order; the header offset of each member's first appearance."""
    offsets: dict[str, int] = {}
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            offsets.setdefault(name, tf.offset)
            tf.addfile(info, io.BytesIO(body))
    return offsets


def test_webdataset_bad_records_are_counted_and_named(tmp_path: Path) -> None:
    good = [text_of("wds", i) for i in range(4)]
    path = tmp_path / "bad.tar"
    at = _tar(path, [("a/k0.txt", good[0].encode()), ("a/k0.cls", b"1"),
                     ("a/k1.txt", b"\xff\xfe not utf-8"),
                     ("a/k2.json", b"{}"),  # no .txt member
                     ("a/k3.txt", good[1].encode()), ("a/k3.txt", b"again"),  # duplicate
                     ("a/" + "long" * 40 + ".txt", good[2].encode()),  # a GNU long name
                     ("a/k5.TXT", good[3].encode())])  # extensions are lowercased
    tokens, counters = drain(_one_lane([str(path)], text_field="txt"))
    np.testing.assert_array_equal(tokens, _expected([good[0], good[2], good[3]]))
    assert counters.skipped == {"non_utf8": 1, "missing_field": 1, "malformed_sample": 1}
    message = _fail_message([str(path)], text_field="txt")
    assert f"{path} at byte {at['a/k1.txt']}" in message


def test_truncated_tars_stop_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "whole.tar"
    _tar(path, [(f"k{i}.txt", text_of("wds", i).encode() * 30) for i in range(20)])
    whole = path.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[:len(whole) // 2 + 100])
    with pytest.raises(DataError, match=rf"{cut}: the tar is truncated"):
        Plan.build(_one_lane([str(cut)], text_field="txt"))
    members = tmp_path / "no-end.tar"  # cut on a member boundary: the end blocks are missing
    with tarfile.open(path) as tf:
        boundary = tf.getmembers()[10].offset
    members.write_bytes(whole[:boundary])
    with pytest.raises(DataError, match="without its end-of-archive block"):
        Plan.build(_one_lane([str(members)], text_field="txt"))
    gz = tmp_path / "cut.tar.gz"
    packed = gzip.compress(whole)
    gz.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(DataError) as info:
        drain(_one_lane([str(gz)], text_field="txt"))
    assert str(gz) in str(info.value)


def test_a_compressed_tar_is_one_chunk_read_as_a_stream(tmp_path: Path) -> None:
    path = tmp_path / "whole.tar"
    _tar(path, [(f"k{i:03d}.txt", text_of("wds", i).encode()) for i in range(50)])
    gz = tmp_path / "docs.tar.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    recipe = _one_lane([str(gz)], text_field="txt")
    assert [(c.start, c.stop) for c in Plan.build(recipe).sources[0].chunks] == [(0, -1)]
    tokens, _ = drain(recipe)
    np.testing.assert_array_equal(tokens, _expected([text_of("wds", i) for i in range(50)]))


def test_hf_bad_records_are_counted_and_named(tmp_path: Path) -> None:
    good = [text_of("hf", i) for i in range(3)]
    values = [good[0].encode(), b"\xff\xfe broken", None, good[1].encode(), good[2].encode()]
    binary = pa.array(values, pa.binary())
    strings = pa.Array.from_buffers(pa.string(), len(values), binary.buffers(),
                                    null_count=1)  # not validated, as a careless writer does
    path = tmp_path / "data-00000-of-00001.arrow"
    with pa.ipc.new_stream(str(path), pa.schema([("text", pa.string())])) as w:
        w.write_batch(pa.record_batch([strings], names=["text"]))
    tokens, counters = drain(_one_lane([str(path)]))
    np.testing.assert_array_equal(tokens, _expected(good))
    assert counters.skipped == {"non_utf8": 1, "missing_field": 1}
    assert f"{path} at row 1" in _fail_message([str(path)])
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(DataError, match=rf"{cut}: the Arrow file is truncated"):
        Plan.build(_one_lane([str(cut)]))


def test_a_dataset_dict_directory_is_refused_naming_its_splits(tmp_path: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a", "b"]}),
                               "test": datasets.Dataset.from_dict({"text": ["c"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"DatasetDict with the splits train, test; name one "
                                          r"split's directory"):
        Plan.build(_one_lane([str(tmp_path / "dd")], format="hf"))
    tokens, _ = drain(_one_lane([str(tmp_path / "dd" / "train")], format="hf"))
    np.testing.assert_array_equal(tokens, _expected(["a", "b"]))


def test_lance_bad_records_are_counted_and_named(tmp_path: Path) -> None:
    import lance

    good = [text_of("lance", i) for i in range(3)]
    path = tmp_path / "t.lance"
    lance.write_dataset(pa.table({"text": [good[0], None, good[1], "", good[2]]}), str(path))
    tokens, counters = drain(_one_lane([str(path)]))
    np.testing.assert_array_equal(tokens, _expected(good))
    assert counters.skipped == {"missing_field": 1, "empty_text": 1}
    assert f"{path} at row 1" in _fail_message([str(path)])


def test_a_lance_source_reads_the_version_it_was_planned_at(tmp_path: Path) -> None:
    import lance

    path = tmp_path / "t.lance"
    lance.write_dataset(pa.table({"text": [text_of("lance", i) for i in range(10)]}), str(path))
    recipe = _one_lane([str(path)])
    plan = Plan.build(recipe)
    assert plan.sources[0].files[0].ident == "lance-version=1"
    lance.write_dataset(pa.table({"text": ["appended later"]}), str(path), mode="append")
    with Loader(recipe, plan=plan) as ld:
        steps = []
        for step in ld:
            steps.append(step.input_ids[step.positions >= 0])
            if step.ended:
                break
    np.testing.assert_array_equal(np.concatenate(steps),
                                  _expected([text_of("lance", i) for i in range(10)]))
    assert Plan.build(recipe).fingerprint != plan.fingerprint  # a new version, a new plan


def test_without_pylance_a_lance_source_names_the_extra(tmp_path: Path, monkeypatch: Any) -> None:
    import sys

    (tmp_path / "t.lance" / "_versions").mkdir(parents=True)
    monkeypatch.setitem(sys.modules, "lance", None)  # import lance raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'datalane\[lance\]'"):
        Plan.build(_one_lane([str(tmp_path / "t.lance")]))


def test_a_json_member_is_parsed(tmp_path: Path) -> None:
    # a .json member's value is the parsed JSON: a chat source reads conversations from it
    from datalane.engine.formats import FORMATS

    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path = tmp_path / "chat.tar"
    _tar(path, [("c0.json", json.dumps(conv).encode()), ("c1.json", b"{not json")])
    source = Plan.build(_one_lane([str(path)], text_field="json")).sources[0]
    wds = FORMATS["webdataset"]
    raws = [raw for _, raw in wds.reader(source.files, "json").records(source.chunks[0])]
    assert wds.decode(raws[0], "json") == (conv, None, None)
    assert wds.decode(raws[1], "json")[1] == "malformed_json"
