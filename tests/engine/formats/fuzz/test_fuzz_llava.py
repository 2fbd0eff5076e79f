"""LLaVA JSON files (datalane/engine/formats/llavajson.py, jsonarray.py, the llava kind) against
mutated records and mutated bytes.

A case is a JSON array of three records - two good ones around a mutated one - and the images
folder of the generated corpus. Record mutations (the marker fuzz): ``<image>`` markers added,
dropped or doubled in any turn, the ``image`` field made a list, a missing file, a ``..``, an
absolute path, a URI, a number or an object, turns given another ``from``, a non-string
``value``, a vision token, no assistant turn. An independent oracle says whether the record is
a document (its markers as many as its images, every path a file of the folder, every turn a
known ``from`` and a string, an assistant turn); a document makes three, and a bad record must
be counted under a reason the kind declares with the stream exactly the two good records'.
Byte mutations (a structural byte - bracket, brace, quote, comma, backslash - inserted,
deleted or replaced, or the file cut) must end in a DataError naming the file, or in every
element counted (kept plus set aside is what was read) under declared reasons. Never a hang
(each read runs under a wall bound), never another exception.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from datalane.engine.documents.llava import ROLE_OF, LlavaKind
from datalane.engine.formats.jsonl import JSONL
from datalane.engine.formats.llavajson import RECORD_REASONS
from datalane.engine.loader import Loader
from datalane.spec.errors import DataError
from datalane.spec.recipe import load_recipe
from datalane.testing.images import CHATML_TEMPLATE, LlavaCorpus, make_llava_corpus
from tests.engine.formats.fuzz.harness import FUZZ
from tests.support.common import bounded
from tests.support.kinds import VISION_TOKENIZER

pytestmark = pytest.mark.fuzz

EXAMPLES = 60
START = 1026
REASONS = LlavaKind.bad_reasons | RECORD_REASONS | JSONL.bad_reasons | {"too_large"}
MARKER = "<image>"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> LlavaCorpus:
    return make_llava_corpus(str(tmp_path_factory.mktemp("llava")), records=6)


def _read(path: Path, chunk_bytes: int = 1 << 20) -> tuple[list[bytes], Any]:
    """Every step's ids and the counters; one chunk by default (the record fuzzer compares
    streams of files of different sizes: chunks are dealt in a seeded order)."""
    recipe = load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 1023,
        "tokenizer": {"uri": str(VISION_TOKENIZER)}, "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 1},
        "sources": [{"name": "llava", "uris": [str(path)], "chunk_bytes": chunk_bytes,
                     "llava": {"template_text": CHATML_TEMPLATE, "max_images": 3}}]})

    def run() -> tuple[list[bytes], Any]:
        out = []
        with Loader(recipe, 0, 1) as loader:
            while True:
                step = loader.next_step()
                out.append(step.columns["input_ids"].tobytes())
                if step.ended:
                    return out, loader.counters()
                assert len(out) < 100
    return bounded(run, 60)


def _case(corpus: LlavaCorpus, records: list[Any] | None = None,
          raw: bytes | None = None) -> Path:
    """The case's JSON file, written beside the corpus's (its images are in its folder)."""
    path = Path(corpus.root) / "case.json"
    path.write_bytes(raw if raw is not None else json.dumps(records).encode())
    return path


# -- record mutations --------------------------------------------------------------------------

@st.composite
def _mutated(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    rec = json.loads(json.dumps(base))
    turns = rec["conversations"]
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["add_marker", "drop_marker", "image_list", "image_odd",
                                     "from", "value", "vision", "drop_gpt", "drop_image"]))
        k = draw(st.integers(0, len(turns) - 1)) if turns else 0
        if what == "add_marker" and turns:
            at = draw(st.integers(0, len(turns[k]["value"]) if isinstance(turns[k]["value"], str)
                                  else 0))
            v = turns[k]["value"]
            turns[k]["value"] = v[:at] + MARKER + v[at:] if isinstance(v, str) else v
        elif what == "drop_marker" and turns and isinstance(turns[k]["value"], str):
            turns[k]["value"] = turns[k]["value"].replace(MARKER, "", 1)
        elif what == "image_list":
            rec["image"] = draw(st.lists(st.sampled_from(
                ["images/000000_0.jpg", "images/000002_0.png", "images/none.jpg",
                 "images/../data.json", "/etc/hosts", "s3://b/k.jpg", "images"]),
                max_size=4))
        elif what == "image_odd":
            rec["image"] = draw(st.sampled_from([7, {"a": 1}, None, "", ["x", 3]]))
        elif what == "from" and turns:
            turns[k]["from"] = draw(st.sampled_from(["robot", "gpt", "human", "system", 3]))
        elif what == "value" and turns:
            turns[k]["value"] = draw(st.sampled_from([None, 1, ["a"], "plain"]))
        elif what == "vision" and turns and isinstance(turns[k]["value"], str):
            turns[k]["value"] += "<|image_pad|>"
        elif what == "drop_gpt":
            rec["conversations"] = turns = [t for t in turns if t.get("from") != "gpt"]
        elif what == "drop_image":
            rec.pop("image", None)
    return rec


def _is_document(rec: dict[str, Any], root: Path) -> bool:
    """The oracle: whether a mutated record is a document, from the rules alone."""
    image = rec.get("image")
    paths = [] if image is None else [image] if isinstance(image, str) else image
    if not isinstance(paths, list) or len(paths) > 3:
        return False
    for p in paths:
        if not isinstance(p, str) or not p or p.startswith("/") or ":" in p.split("/")[0] \
                or ".." in p.split("/") or not (root / p).is_file():
            return False
    turns = rec.get("conversations")
    if not isinstance(turns, list) or not turns:
        return False
    markers = 0
    for t in turns:
        if not isinstance(t.get("from"), str) or t["from"] not in ROLE_OF \
                or not isinstance(t.get("value"), str) or "<|" in t["value"]:
            return False
        markers += t["value"].count(MARKER)
    return markers == len(paths) and any(ROLE_OF[t["from"]] == "assistant" for t in turns)


@given(data=st.data())
@settings(FUZZ, max_examples=EXAMPLES)
def test_mutated_records(corpus: LlavaCorpus, data: st.DataObject) -> None:
    base = data.draw(st.sampled_from(corpus.records[:6]))
    good = [corpus.records[0], corpus.records[4]]  # one image; two images
    rec = data.draw(_mutated(base))
    got, counters = _read(_case(corpus, [good[0], rec, good[1]]))
    assert counters.docs == 3
    event(f"set aside: {sorted(counters.skipped)}")
    if _is_document(rec, Path(corpus.root)):
        assert counters.kept == 3 and counters.skipped == {}, (rec, counters)
        return
    assert counters.kept == 2, (rec, counters)
    (reason,) = counters.skipped
    assert reason in REASONS, (rec, reason)
    alone, _ = _read(_case(corpus, good))
    assert got == alone  # exactly the two good records' documents


# -- byte mutations ----------------------------------------------------------------------------

@given(data=st.data())
@settings(FUZZ, max_examples=EXAMPLES)
def test_mutated_bytes(corpus: LlavaCorpus, data: st.DataObject) -> None:
    raw = Path(corpus.json).read_bytes()
    sites = [i for i, b in enumerate(raw) if b in b'[]{}",\\:<']
    at = data.draw(st.sampled_from(sites))
    how = data.draw(st.sampled_from(["delete", "insert", "replace", "cut"]))
    byte = data.draw(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b",", b"\\", b" ", b"\xff"]))
    mutated = {"delete": raw[:at] + raw[at + 1:], "insert": raw[:at] + byte + raw[at:],
               "replace": raw[:at] + byte + raw[at + 1:], "cut": raw[:at]}[how]
    path = _case(corpus, raw=mutated)
    try:
        got, counters = _read(path, chunk_bytes=512)
    except DataError as e:
        assert str(path) in str(e), e
        event("error naming the file")
        return
    event(f"read: set aside {sorted(counters.skipped)}")
    assert counters.docs == counters.kept + sum(counters.skipped.values())
    assert set(counters.skipped) <= REASONS, counters.skipped
    starts = sum(int((np.frombuffer(b, np.int32) == START).sum()) for b in got)
    assert starts <= corpus.images + 3  # every run a record's image (max_images 3 each)


def test_the_fuzzers_reach_documents_and_bad_records(corpus: LlavaCorpus) -> None:
    """The oracle's two sides are both reached by plain cases."""
    good = corpus.records[0]
    assert _is_document(good, Path(corpus.root))
    bad = {**good, "conversations": [{"from": "human", "value": "no marker"},
                                     {"from": "gpt", "value": "x"}]}
    assert not _is_document(bad, Path(corpus.root))
    _, counters = _read(_case(corpus, [good, bad]))
    assert counters.kept == 1 and counters.skipped == {"malformed_sample": 1}
