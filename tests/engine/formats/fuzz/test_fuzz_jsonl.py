"""JSONL readers (plain, gzip members, zstd frames) against mutated files
(tests/engine/formats/fuzz/stream_harness.py).

Content flips: a flipped bit inside a JSON document changes its text and leaves a valid file
of the same size, which no reader can tell from what the writer meant (JSONL has no checksum;
gzip and zstd have one, and a flip there is caught). So each case is planned on the *mutated*
file, as a user would plan it, and datalane's records are compared with what an independent
reference reads from the mutated bytes: the lines of the content (Python's ``gzip`` reader, or
python-zstandard frame by frame, decompress it; either refusing the bytes means datalane must
raise a DataError naming the file), each parsed with ``json.loads`` - the value of ``text`` of
a JSON object that has one, else a bad record. Positions must match too (a record's position
is its offset in the decompressed stream). Header and index fields - gzip flags, lengths,
CRCs and sizes; zstd frame header descriptors, content sizes, block headers and checksums;
newlines and quotes in plain JSONL - take most mutations.
"""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
import zstandard

import datalane.engine.compressed as compressed
from tests.engine.formats.fuzz.stream_harness import (
    Field,
    Outcomes,
    fuzz_file,
    read_source,
    small_bound,
)

pytestmark = pytest.mark.fuzz

EXAMPLES = 100
BOUND = 130  # bytes of a line: one line written here has 322, the others at most 122


def content() -> bytes:
    rng = random.Random(3)
    lines = []
    for i in range(24):
        words = " ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 6)))
                         for _ in range(rng.randint(0, 14)))
        if i == 10:  # a line over the bound: a bad record too_large in every reading
            words = "long " * 60
        lines.append(json.dumps({"id": i, "text": words}))
        if i % 7 == 3:
            lines.append(" ")
    return ("\n".join(lines) + "\n").encode()


def pieces(data: bytes, n: int) -> list[bytes]:
    step = len(data) // n + 1
    return [data[i:i + step] for i in range(0, len(data), step)]


def plain_file() -> tuple[bytes, list[Field]]:
    data = content()
    return data, [Field(i, 1) for i, b in enumerate(data) if b in b'\n{}":']


def gzip_file() -> tuple[bytes, list[Field]]:
    out, fields = b"", []
    for part in pieces(content(), 3):
        member = gzip.compress(part, mtime=0)
        at = len(out)
        # flags, mtime, xfl, os; the trailer's CRC-32 and size
        fields += [Field(at + 3, 1), Field(at + 4, 4), Field(at + 8, 1), Field(at + 9, 1),
                   Field(at + len(member) - 8, 4), Field(at + len(member) - 4, 4)]
        out += member
    return out, fields


def zstd_file() -> tuple[bytes, list[Field]]:
    out, fields = b"", []
    params = zstandard.ZstdCompressionParameters.from_level(3, write_checksum=True,
                                                             write_content_size=True)
    for part in pieces(content(), 4):
        frame = zstandard.ZstdCompressor(compression_params=params).compress(part)
        at = len(out)
        fhd = frame[4]
        single = fhd >> 5 & 1
        fcs = (1 if single else 0, 2, 4, 8)[fhd >> 6]
        hlen = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + fcs
        fields += [Field(at, 4), Field(at + 4, 1)]
        if not single:
            fields.append(Field(at + 5, 1))  # window descriptor
        if fcs:
            fields.append(Field(at + hlen - fcs, fcs))  # content size
        pos = hlen
        while True:  # block headers: last flag, type, size
            fields.append(Field(at + pos, 3))
            v = int.from_bytes(frame[pos:pos + 3], "little")
            pos += 3 + (1 if v >> 1 & 3 == 1 else v >> 3)
            if v & 1:
                break
        fields.append(Field(at + pos, 4))  # checksum
        out += frame
    return out, fields


def ref_gzip(data: bytes) -> bytes | None:
    try:
        return gzip.GzipFile(fileobj=io.BytesIO(data)).read()
    except (OSError, EOFError, ValueError):
        return None


def ref_zstd(data: bytes) -> bytes | None:
    out, rest = [], data
    while rest:
        dec = zstandard.ZstdDecompressor().decompressobj()
        try:
            out.append(dec.decompress(rest))
        except zstandard.ZstdError:
            return None
        if not dec.eof:
            return None
        rest = dec.unused_data
    return b"".join(out)


def lines_of(text: bytes) -> list[tuple[int, int, Any, str | None]]:
    """The reference: each non-blank line at its offset, parsed with json.loads (a line over
    the bound is a bad record, whatever it holds)."""
    out, pos = [], 0
    for line in text.split(b"\n"):
        if len(line) > BOUND:
            out.append((0, pos, None, "bad"))
        elif line.strip():
            try:
                obj = json.loads(line.decode("utf-8"))
            except (ValueError, RecursionError):
                obj = None
            good = isinstance(obj, dict) and obj.get("text") is not None
            out.append((0, pos, obj["text"] if good else None, None if good else "bad"))
        pos += len(line) + 1
    return out


LAYOUTS = {
    "plain": (".jsonl", plain_file, lambda d: d, 64),
    "gzip": (".jsonl.gz", gzip_file, ref_gzip, 200),
    "zstd": (".jsonl.zst", zstd_file, ref_zstd, 150),
}
OUTCOMES = {name: Outcomes(f"jsonl {name}") for name in LAYOUTS}


def _read(path: Path, chunk_bytes: int) -> list[Any]:
    compressed.clear_index_memo()
    got = read_source({"uris": [str(path)], "chunk_bytes": chunk_bytes})
    return [(f, p, v, None if r is None else "bad") for f, p, v, r in got]



@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mutated_jsonl_files_read_as_their_bytes_say_or_fail_naming_the_file(
        layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    small_bound(monkeypatch, BOUND)
    ext, make, decompress, chunk_bytes = LAYOUTS[layout]
    data, fields = make()

    def reference(raw: bytes) -> Any:
        text = decompress(raw)
        return None if text is None else lines_of(text)

    original = fuzz_file(OUTCOMES[layout], data, fields, ext,
                         lambda path: _read(path, chunk_bytes), reference, EXAMPLES, layout)
    assert original == lines_of(content()) and len(original) == 24
    assert sorted(len(ln) for ln in content().split(b"\n"))[-2:][0] <= BOUND
    assert [r[1:] for r in original if r[-1] == "bad"] == [(original[10][1], None, "bad")]
