"""The JSON array scanner (datalane/engine/formats/jsonarray.py): elements at their byte
offsets, whatever the read size and the chunking, strings holding brackets, commas, quotes and
escapes across reads, an element over the record bound counted and not held.
"""

from __future__ import annotations

import io
import json

import pytest

from datalane.engine.formats import jsonarray
from datalane.engine.formats.base import TooLarge
from datalane.engine.formats.jsonarray import array_chunks, array_start, elements

#: elements whose strings hold every byte the scanner looks at
VALUES = [{"a": "[{,}]"}, {"b": 'a "quoted" \\ back\\slash \\"'}, [1, [2, {"c": "]"}]], "s,]",
          7, {"d": "\\\\"}, {}, [], None, {"e": "é ☃ \\u2603"}]


def _file() -> tuple[bytes, list[tuple[int, bytes]]]:
    """An array of :data:`VALUES` with odd whitespace, and each element's (offset, bytes)."""
    out = b" \n[ "
    want = []
    for k, v in enumerate(VALUES):
        text = json.dumps(v, ensure_ascii=False).encode()
        want.append((len(out), text))
        out += text + (b" ,\n  " if k < len(VALUES) - 1 else b"\n]\n")
    return out, want


@pytest.mark.parametrize("read", [1, 2, 3, 7, 64, 1 << 20])
def test_elements_are_found_at_their_offsets_for_any_read_size(
        read: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonarray, "READ", read)
    data, want = _file()
    f = io.BytesIO(data)
    begin = array_start(f, "x.json")
    assert begin == 3
    f.seek(begin)
    got = list(elements(f, begin, -1, "x.json", True))
    assert got == want
    assert [json.loads(b) for _, b in got] == VALUES


@pytest.mark.parametrize("chunk_bytes", [1, 10, 40, 1 << 20])
def test_chunks_hold_every_element_once_and_read_one_finds_each(chunk_bytes: int) -> None:
    data, want = _file()
    chunks = array_chunks(0, io.BytesIO(data), "x.json", chunk_bytes)
    assert chunks[0].start == 3 and chunks[-1].stop == data.rindex(b"]") + 1
    got = []
    for c in chunks:
        f = io.BytesIO(data)
        f.seek(c.start)
        got += list(elements(f, c.start, c.stop, "x.json", c.start == 3))
    assert got == want
    if chunk_bytes == 1:
        assert [c.start for c in chunks[1:]] == [p for p, _ in want[1:]]
    for pos, text in want:
        f = io.BytesIO(data)
        f.seek(pos)
        assert next(elements(f, pos, -1, "x.json", False)) == (pos, text)


def test_an_element_over_the_bound_is_counted_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonarray, "MAX_RECORD_BYTES", 100)
    monkeypatch.setattr(jsonarray, "READ", 16)
    big = json.dumps({"x": "y" * 300}).encode()
    data = b"[" + big + b", {}]"
    f = io.BytesIO(data)
    f.seek(1)
    got = list(elements(f, 1, -1, "x.json", True))
    assert got == [(1, TooLarge(len(big), "array element")), (len(big) + 3, b"{}")]


def test_jsonl_and_empty_files_are_no_arrays() -> None:
    assert array_start(io.BytesIO(b'{"a": 1}\n'), "x") is None
    assert array_start(io.BytesIO(b""), "x") is None
    assert array_start(io.BytesIO(b"\xef\xbb\xbf [1]"), "x") == 5
