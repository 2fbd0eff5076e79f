"""Hostile JSONL: long lines, lines over the record bound, decompression bombs, a tampered
frame-index cache.

* A line costs time linear in its length (the last line of a chunk was finished by appending
  each read to the bytes so far: 8/32 MiB lines took 1.2/19 s).
* A line over ``MAX_RECORD_BYTES`` (64 MiB) is a bad record ``too_large``: counted under
  ``bad_records: skip`` with every other document exact, named with its file and offset under
  ``fail``, and read past without being held - in plain, gzip and zstd files alike.
* A small compressed file that expands a thousandfold (a zstd file of RLE blocks: 16 KB for a
  256 MiB line) is read in bounded memory (tracemalloc's peak).
* A cached frame index with any bit flipped is built again, never read as another index: the
  documents are those of a clean run.
"""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

import datalane.engine.compressed as compressed
from datalane import DataError
from datalane.engine.chunks import RecordReader, cut_file
from datalane.engine.files import SourceFile, compression_of, expand
from datalane.engine.formats.base import TooLarge
from datalane.spec.limits import MAX_RECORD_BYTES
from tests.engine.test_bad_inputs import GOOD, drain, expected_tokens, recipe


@pytest.fixture(autouse=True)
def _fresh_indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("DATALANE_CACHE_DIR", str(tmp_path / "cache"))
    compressed.clear_index_memo()
    yield
    compressed.clear_index_memo()


@pytest.fixture
def tok(tmp_path: Path) -> str:
    from datalane.corpus import tokenizer_path

    return tokenizer_path()


def source_file(path: Path) -> SourceFile:
    [(uri, size, ident)] = expand(str(path), "test")
    return SourceFile(uri, size, ident, "jsonl", compression_of(uri))


def records(sf: SourceFile, chunk_bytes: int = 1 << 20) -> list[tuple[int, Any]]:
    reader = RecordReader([sf], "text")
    return [(pos, raw) for c in cut_file(0, sf, chunk_bytes, None)
            for pos, raw in reader.records(c)]


def documents(tokens: np.ndarray) -> list[list[int]]:
    """The documents of a token stream (each ends with EOS = 1), sorted."""
    cuts = np.flatnonzero(tokens == 1) + 1
    return sorted(d.tolist() for d in np.split(tokens, cuts) if len(d))


def good(i: int) -> bytes:
    return json.dumps({"text": GOOD[i]}).encode()


def padded(size: int) -> bytes:
    """A JSON line of exactly ``size`` bytes whose text is short (cheap to tokenize if kept)."""
    head, tail = b'{"pad": "', b'", "text": "kept only if the bound is not applied"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


# -- long lines -----------------------------------------------------------------------------------


def test_a_long_line_is_read_in_time_linear_in_its_length(tmp_path: Path) -> None:
    line = padded(32 << 20)
    path = tmp_path / "long.jsonl"
    path.write_bytes(good(0) + b"\n" + line + b"\n" + good(1) + b"\n")
    sf = source_file(path)
    t = time.perf_counter()
    got = records(sf)
    took = time.perf_counter() - t
    assert [pos for pos, _ in got] == [0, len(good(0)) + 1, len(good(0)) + len(line) + 2]
    assert got[1][1] == line
    # 0.17 s here; appending each read to the line so far took 19 s
    assert took < 4.0, f"a 32 MiB line took {took:.1f} s"


LAYOUTS = {"plain": ("jsonl", lambda b: b),
           "gzip": ("jsonl.gz", lambda b: gzip.compress(b, compresslevel=1)),
           "zstd": ("jsonl.zst", lambda b: zstandard.ZstdCompressor(level=1).compress(b))}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_line_over_the_bound_is_a_too_large_bad_record(tmp_path: Path, tok: str,
                                                         layout: str) -> None:
    ext, pack = LAYOUTS[layout]
    big = padded(MAX_RECORD_BYTES + 1)
    lines = [good(0), big, good(1), good(2)]
    path = tmp_path / f"big.{ext}"
    path.write_bytes(pack(b"\n".join(lines) + b"\n"))
    offset = len(good(0)) + 1
    tokens, counters = drain(recipe(tok, [str(path)]))
    # chunks of the plain file are read in the plan's order: compare the documents as a set
    assert documents(tokens) == documents(expected_tokens(tok, GOOD))  # nothing else lost
    assert (counters.docs, counters.kept, counters.skipped) == (4, 3, {"too_large": 1})
    with pytest.raises(DataError) as info:
        drain(recipe(tok, [str(path)], bad_records="fail"))
    assert str(info.value) == (
        f"source 's': a line of {MAX_RECORD_BYTES + 1:,} bytes, over the limit of "
        f"{MAX_RECORD_BYTES:,} bytes per record in {path} at byte {offset} (bad_records is "
        f"'fail')")


def test_a_line_at_the_bound_is_a_record_and_one_byte_more_is_too_large(
        tmp_path: Path) -> None:
    at, over = padded(MAX_RECORD_BYTES), padded(MAX_RECORD_BYTES + 1)
    path = tmp_path / "edge.jsonl"
    path.write_bytes(at + b"\n" + over + b"\n" + good(0))  # the last line has no newline
    got = records(source_file(path))
    assert [pos for pos, _ in got] == [0, len(at) + 1, len(at) + len(over) + 2]
    assert got[0][1] == at and got[2][1] == good(0)
    assert got[1][1] == TooLarge(MAX_RECORD_BYTES + 1, "line")


# -- decompression bombs --------------------------------------------------------------------------


def zstd_rle_bomb(line_bytes: int) -> bytes:
    """A zstd frame of ``{"text": "a"}``, a line of ``line_bytes`` bytes of 'x' made of RLE
    blocks (4 bytes of file for 128 KiB), and ``{"text": "b"}`` - written by hand from the
    format's specification (RFC 8878): a frame header without a content size (window 128 KiB),
    raw blocks, RLE blocks."""
    def block(kind: int, size: int, body: bytes, last: bool = False) -> bytes:
        return ((size << 3) | (kind << 1) | int(last)).to_bytes(3, "little") + body

    head = b'{"text": "a"}\n{"pad": "'
    tail = b'", "text": "b"}\n{"text": "c"}\n'
    out = bytearray(b"\x28\xb5\x2f\xfd\x00\x38")  # magic, descriptor, window 2^17
    out += block(0, len(head), head)
    left = line_bytes
    while left:
        n = min(left, 128 << 10)
        out += block(1, n, b"x")
        left -= n
    out += block(0, len(tail), tail, last=True)
    return bytes(out)


def gzip_bomb(line_bytes: int) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [z.compress(b'{"text": "a"}\n{"pad": "')]
    piece = b"x" * (1 << 20)
    for _ in range(line_bytes >> 20):
        out.append(z.compress(piece))
    out.append(z.compress(b'", "text": "b"}\n{"text": "c"}\n'))
    out.append(z.flush())
    return b"".join(out)


@pytest.mark.parametrize(("layout", "line"), [("zstd", 512 << 20), ("gzip", 256 << 20)])
def test_a_decompression_bomb_is_read_in_bounded_memory(tmp_path: Path, layout: str,
                                                        line: int) -> None:
    data = zstd_rle_bomb(line) if layout == "zstd" else gzip_bomb(line)
    path = tmp_path / f"bomb.jsonl.{'zst' if layout == 'zstd' else 'gz'}"
    path.write_bytes(data)
    assert len(data) < 1 << 20  # 16 KB (zstd), 255 KB (gzip)
    sf = source_file(path)
    tracemalloc.start()
    try:
        got = records(sf)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    pad = len('{"pad": "') + line + len('", "text": "b"}')
    assert got == [(0, b'{"text": "a"}'), (14, TooLarge(pad, "line")),
                   (14 + pad + 1, b'{"text": "c"}')]
    # the line itself (64 MiB + 1 held to learn that it is over the bound) and a bounded
    # buffer; reading it whole held it at least once, and zstd made 512 MiB in one call
    assert peak < 2 * MAX_RECORD_BYTES + (16 << 20), f"peak {peak >> 20} MiB"


# -- the frame-index cache ------------------------------------------------------------------------


def multi_frame(tmp_path: Path) -> tuple[SourceFile, bytes]:
    lines = [json.dumps({"id": i, "text": f"document {i} " + "w " * (i % 30)}).encode()
             for i in range(150)]
    content = b"\n".join(lines) + b"\n"
    frames = [zstandard.ZstdCompressor(level=1).compress(content[a:a + 997])
              for a in range(0, len(content), 997)]
    path = tmp_path / "framed.jsonl.zst"
    path.write_bytes(b"".join(frames))
    return source_file(path), content


def test_a_tampered_frame_index_cache_is_built_again_never_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flip a bit of every byte of the cache file (the digest, the array's header, each index
    row), and every bit of one compressed and one decompressed offset: every read gives the
    clean run's records, and the cache is written again."""
    sf, content = multi_frame(tmp_path)
    monkeypatch.setattr(compressed, "CACHE_MIN_BYTES", 1)
    clean = records(sf, chunk_bytes=300)
    assert [raw for _, raw in clean] == [ln for ln in content.split(b"\n") if ln]
    [cache] = (tmp_path / "cache" / "frames").iterdir()
    sealed = cache.read_bytes()
    frames = compressed.frame_index(sf).frames
    assert frames > 4
    rows = len(sealed) - (frames + 1) * 16  # where the index rows start
    bits = [8 * i + i % 8 for i in range(len(sealed))]
    bits += [8 * (rows + 16 * 2) + b for b in range(64)]  # frame 2's compressed offset
    bits += [8 * (rows + 16 * 3 + 8) + b for b in range(64)]  # frame 3's decompressed offset
    for bit in bits:
        flipped = bytearray(sealed)
        flipped[bit // 8] ^= 1 << (bit % 8)
        cache.write_bytes(bytes(flipped))
        compressed.clear_index_memo()
        assert records(sf, chunk_bytes=300) == clean, f"bit {bit} of the cache file"
        assert cache.read_bytes() == sealed, f"bit {bit}: the cache is not written again"


def test_a_zstd_frame_claiming_more_content_than_it_can_hold_is_an_error(
        tmp_path: Path) -> None:
    """A frame header's content size is read from the file: 2^64 - 1 bytes in a frame of 18
    bytes was put into the index as it was (an OverflowError from numpy)."""
    body = b'{"text": "a"}\n'
    raw_block = ((len(body) << 3) | 1).to_bytes(3, "little") + body  # raw, last
    liar = b"\x28\xb5\x2f\xfd\xe0" + ((1 << 64) - 1).to_bytes(8, "little") + raw_block
    good_frame = zstandard.ZstdCompressor().compress(body)
    path = tmp_path / "liar.jsonl.zst"
    path.write_bytes(good_frame + liar + good_frame)
    sf = source_file(path)
    with pytest.raises(DataError) as info:
        cut_file(0, sf, 8, None)
    assert str(info.value) == (
        f"{sf.uri}: the compressed stream is corrupt or truncated: the zstd frame at byte "
        f"{len(good_frame)} claims {(1 << 64) - 1} bytes of content in {len(liar)} bytes")
