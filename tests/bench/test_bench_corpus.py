"""The benchmark corpus generator lives in the repository and is deterministic."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq

from tests.support import paths

ROOT = paths.REPO


def _maker():
    spec = importlib.util.spec_from_file_location("make_corpus", ROOT / "bench" / "make_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_corpus_is_byte_identical_for_the_same_arguments(tmp_path: Path) -> None:
    maker = _maker()
    a, b = tmp_path / "a", tmp_path / "b"
    assert maker.make(a, docs=400, seed=5) == {"web_docs": 400, "code_docs": 20, "files": 13}
    maker.make(b, docs=400, seed=5)
    assert (a / "MANIFEST.json").read_bytes() == (b / "MANIFEST.json").read_bytes()
    maker.make(b, docs=400, seed=6)
    assert (a / "MANIFEST.json").read_bytes() != (b / "MANIFEST.json").read_bytes()


def test_the_layout_is_what_the_benchmarks_read(tmp_path: Path) -> None:
    _maker().make(tmp_path, docs=1200, seed=1)
    shards = sorted((tmp_path / "web").glob("*.parquet"))
    assert len(shards) == 8
    meta = pq.ParquetFile(shards[0]).metadata
    assert meta.num_rows == 150 and meta.row_group(0).num_rows == 150  # 1,200 / 8 shards
    texts = pq.read_table(shards[0]).column("text").to_pylist()
    assert all(50 <= len(t) <= 5000 for t in texts)
    lines = (tmp_path / "code" / "shard-00000.jsonl").read_text().splitlines()
    assert len(lines) == 30 and all(2000 <= len(json.loads(x)["text"]) <= 40000 for x in lines)
    manifest = json.loads((tmp_path / "MANIFEST.json").read_text())
    assert "tokenizer/tokenizer.json" in manifest["files"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    assert tok.token_to_id("<|eos|>") is not None and tok.get_vocab_size() <= 8192
