"""Large compressed shards: zstd frames and gzip members are chunk boundaries, read strictly.

Files are written here, frame by frame, with python-zstandard and zlib (the seekable format's
seek table and BGZF's headers by hand, from their specifications), and every writer records
where each frame starts in compressed and in decompressed bytes: the index the reader must
find. Expectations are computed from the content bytes (line starts), independently of
datalane: every record once per epoch, at its offset in the decompressed stream.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import random
import shutil
import struct
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zstandard
from tokenizers import Tokenizer

import datalane.engine.compressed as compressed
import datalane.engine.formats.jsonl as jsonl_mod
from datalane import ConfigError, DataError, Knobs, Loader, load_recipe
from datalane.corpus import tokenizer_path
from datalane.engine.chunks import Chunk, RecordReader, cut_file
from datalane.engine.docstream import DocStream
from datalane.engine.files import SourceFile, compression_of, expand, format_of
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.runner import run_world
from datalane.spec.state import Counters, SourceCursor
from datalane.verify import verify
from tests.guarantees.test_resume import assert_resume_anywhere
from tests.support.indexes import fresh_indexes  # noqa: F401  (autouse)

# -- writers: content, frames, and where each frame starts ----------------------------------------


Starts = list[tuple[int, int]]  # (compressed offset, decompressed offset) of each data frame


def content_of(n: int, seed: int = 0, long_every: int = 0) -> bytes:
    """``n`` JSON lines ``{"id": i, "text": ...}`` with blank lines between some; every
    ``long_every``-th text is long (it spans several frames of the layouts below)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        size = rng.randint(3000, 9000) if long_every and i % long_every == 3 else \
            rng.randint(0, 120)
        text = " ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 6)))
                        for _ in range(size // 4 + 1))
        lines.append(json.dumps({"id": i, "text": text}))
        if i % 13 == 4:
            lines.append("  ")
    return ("\n".join(lines) + "\n").encode()


def split_at(content: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(cuts)), len(content)]
    return [content[a:b] for a, b in itertools.pairwise(edges) if b > a]


def random_cuts(content: bytes, n: int, seed: int = 1) -> list[int]:
    """``n`` frame boundaries anywhere: inside records, on line starts, on blank lines."""
    return random.Random(seed).sample(range(1, len(content)), n)


def zstd_frames(parts: list[bytes], content_size: bool = True,
                skippable: bool = False) -> tuple[bytes, Starts]:
    """One zstd frame per part; ``skippable`` puts a 4-byte skippable frame before each (as
    pzstd does, which also leaves the content size out)."""
    c = zstandard.ZstdCompressor(write_content_size=content_size, write_checksum=True)
    out, starts, dpos = bytearray(), [], 0
    for p in parts:
        if skippable:
            out += struct.pack("<II", 0x184D2A50, 4) + struct.pack("<I", 0)
        starts.append((len(out), dpos))
        out += c.compress(p)
        dpos += len(p)
    return bytes(out), starts


def seekable(parts: list[bytes], checksums: bool) -> tuple[bytes, Starts]:
    """The zstd seekable format: frames without content size, then the seek table in a
    skippable frame (magic 0x184D2A5E) and the footer (magic 0x8F92EAB1)."""
    c = zstandard.ZstdCompressor(write_content_size=False, write_checksum=checksums)
    frames = [c.compress(p) for p in parts]
    entries = b"".join(struct.pack("<II", len(f), len(p)) + (f[-4:] if checksums else b"")
                       for f, p in zip(frames, parts, strict=True))
    table = (struct.pack("<II", 0x184D2A5E, len(entries) + 9) + entries
             + struct.pack("<IBI", len(parts), 0x80 if checksums else 0, 0x8F92EAB1))
    starts = [(sum(len(f) for f in frames[:i]), sum(len(p) for p in parts[:i]))
              for i in range(len(parts))]
    return b"".join(frames) + table, starts


def gzip_members(parts: list[bytes]) -> tuple[bytes, Starts]:
    out, starts, dpos = bytearray(), [], 0
    for p in parts:
        starts.append((len(out), dpos))
        out += gzip.compress(p, mtime=0)
        dpos += len(p)
    return bytes(out), starts


def bgzf_member(data: bytes) -> bytes:
    """A BGZF member: gzip with the extra field 'BC' holding the member's length - 1."""
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    deflated = co.compress(data) + co.flush()
    header = (b"\x1f\x8b\x08\x04" + b"\0\0\0\0" + b"\0\xff" + struct.pack("<H", 6) + b"BC"
              + struct.pack("<HH", 2, 18 + len(deflated) + 8 - 1))
    return header + deflated + struct.pack("<II", zlib.crc32(data), len(data))


def bgzf(parts: list[bytes]) -> tuple[bytes, Starts]:
    out, starts, dpos = bytearray(), [], 0
    for p in parts:
        starts.append((len(out), dpos))
        out += bgzf_member(p)
        dpos += len(p)
    starts.append((len(out), dpos))  # the end-of-file marker: an empty member
    return bytes(out + bgzf_member(b"")), starts


LAYOUTS: dict[str, tuple[str, Callable[[list[bytes]], tuple[bytes, Starts]]]] = {
    "zstd": ("zst", zstd_frames),
    "zstd-no-content-size": ("zst", lambda p: zstd_frames(p, content_size=False)),
    "pzstd": ("zst", lambda p: zstd_frames(p, content_size=False, skippable=True)),
    "seekable": ("zst", lambda p: seekable(p, checksums=False)),
    "seekable-checksums": ("zst", lambda p: seekable(p, checksums=True)),
    "gzip-members": ("gz", gzip_members),
    "bgzf": ("gz", bgzf),
}


def write(tmp_path: Path, name: str, data: bytes) -> SourceFile:
    path = tmp_path / name
    path.write_bytes(data)
    [(uri, size, ident)] = expand(str(path), "test")
    return SourceFile(uri, size, ident, format_of(uri, None, "test"), compression_of(uri))


def layout_file(tmp_path: Path, layout: str, parts: list[bytes],
                name: str = "data") -> tuple[SourceFile, Starts]:
    ext, writer = LAYOUTS[layout]
    data, starts = writer(parts)
    return write(tmp_path, f"{name}.jsonl.{ext}", data), starts


def expected_lines(data: bytes) -> list[tuple[int, bytes]]:
    """``(offset of the line start, line)`` of every non-blank line of ``data``."""
    out, pos = [], 0
    for line in data.split(b"\n"):
        if line.strip():
            out.append((pos, line))
        pos += len(line) + 1
    return out


def read_all(reader: RecordReader, chunks: list[Chunk]) -> list[tuple[int, Any]]:
    return [rec for chunk in chunks for rec in reader.records(chunk)]


def expected_bounds(starts: Starts, csize: int, dsize: int, chunk_bytes: int) -> list[int]:
    """The documented rule, written out: a chunk ends at the first frame that starts at or
    after the next multiple of chunk_bytes of compressed data."""
    bounds = [0]
    k = 1
    while k * chunk_bytes < csize:
        later = [d for c, d in starts if c >= k * chunk_bytes]
        if later and bounds[-1] < later[0] < dsize:
            bounds.append(later[0])
        k += 1
    return [*bounds, dsize]


# -- the frame index ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_index_lists_every_frame_where_the_writer_put_it(tmp_path: Path,
                                                             layout: str) -> None:
    content = content_of(300)
    parts = split_at(content, random_cuts(content, 24))
    sf, starts = layout_file(tmp_path, layout, parts)
    index = compressed.frame_index(sf)
    assert list(zip(index.coffsets.tolist(), index.doffsets.tolist(), strict=True)) == starts
    assert (index.csize, index.dsize) == (sf.size, len(content))


@pytest.mark.parametrize("layout", ["zstd", "seekable", "seekable-checksums", "bgzf"])
def test_frames_with_sizes_in_their_headers_are_indexed_without_decompressing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    content = content_of(200)
    sf, starts = layout_file(tmp_path, layout, split_at(content, random_cuts(content, 9)))

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decompressed while indexing")

    monkeypatch.setattr(compressed, "_Stream", refuse)
    assert compressed.frame_index(sf).coffsets.tolist() == [c for c, _ in starts]


def test_a_one_member_gzip_file_is_known_without_inflating_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    content = content_of(2000, long_every=20)
    sf = write(tmp_path, "one.jsonl.gz", gzip.compress(content))
    assert sf.size > 100_000
    monkeypatch.setattr(compressed, "_Stream", None)  # any inflating would fail
    index = compressed.frame_index(sf)
    assert index.frames == 1 and index.dsize == -1
    assert cut_file(0, sf, 1000, None) == [Chunk(0, 0, -1)]


def test_a_gzip_member_start_inside_the_first_member_is_tried_and_rejected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # content that holds the member magic: stored (level 0) deflate keeps the bytes as they
    # are, so the scan finds '1f 8b 08 00' candidates that do not inflate
    content = (b'{"text": "a"}\n' + b"\x1f\x8b\x08\x00garbage\n") * 50
    sf = write(tmp_path, "magic.jsonl.gz", gzip.compress(content, compresslevel=0))
    assert sf.size > 1000 and b"\x1f\x8b\x08\x00" in Path(sf.uri).read_bytes()[1:]
    monkeypatch.setattr(compressed, "_Stream", None)  # a candidate taken would inflate all
    assert compressed.frame_index(sf).frames == 1
    assert cut_file(0, sf, 100, None) == [Chunk(0, 0, -1)]


def test_indexes_of_large_files_are_cached_on_disk(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    content = content_of(200)
    sf, starts = layout_file(tmp_path, "gzip-members", split_at(content, random_cuts(content, 9)))
    small, _ = layout_file(tmp_path, "gzip-members", split_at(content, [10]), name="small")
    monkeypatch.setattr(compressed, "CACHE_MIN_BYTES", small.size + 1)
    compressed.frame_index(small)  # too small to be worth caching
    built = compressed.frame_index(sf)
    [cached] = (tmp_path / "cache" / "frames").glob("*.frames")
    compressed.clear_index_memo()

    def refuse(sf: SourceFile) -> Any:
        raise AssertionError("indexed again")

    monkeypatch.setattr(compressed, "_build", refuse)
    again = compressed.frame_index(sf)
    assert again is not built
    assert again.coffsets.tolist() == [c for c, _ in starts] == built.coffsets.tolist()
    assert again.doffsets.tolist() == [d for _, d in starts]
    assert again.dsize == built.dsize == len(content)
    # another identity (the file changed) is another key
    with pytest.raises(AssertionError, match="indexed again"):
        compressed.frame_index(SourceFile(sf.uri, sf.size, "mtime=1", "jsonl", "gzip"))
    # an unreadable cache file is indexed again, not trusted
    cached.write_bytes(b"not an index")
    compressed.clear_index_memo()
    with pytest.raises(AssertionError, match="indexed again"):
        compressed.frame_index(sf)


# -- chunks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("chunk_bytes", [1, 700, 2500, 9000])
def test_chunks_are_whole_frames_and_every_record_is_read_once(
        tmp_path: Path, layout: str, chunk_bytes: int) -> None:
    content = content_of(400, long_every=50)
    parts = split_at(content, random_cuts(content, 40, seed=chunk_bytes))
    sf, starts = layout_file(tmp_path, layout, parts)
    chunks = cut_file(2, sf, chunk_bytes, None)
    bounds = expected_bounds(starts, sf.size, len(content), chunk_bytes)
    assert [(c.file, c.start, c.stop) for c in chunks] == [
        (2, a, b) for a, b in itertools.pairwise(bounds)]
    assert len(chunks) > 1

    reader = RecordReader([sf, sf, sf], "text")
    got = read_all(reader, chunks)
    assert got == expected_lines(content)
    ids = Counter(json.loads(raw)["id"] for _, raw in got)
    assert ids == Counter(range(400))
    for chunk in chunks:  # the chunk owns the records whose preceding newline it holds
        for pos, _ in reader.records(chunk):
            assert pos == 0 or chunk.start <= pos - 1 < chunk.stop


def test_a_frame_starting_exactly_at_chunk_bytes_starts_the_next_chunk(tmp_path: Path) -> None:
    content = content_of(200)
    sf, starts = layout_file(tmp_path, "zstd", split_at(content, random_cuts(content, 10)))
    chunk_bytes = starts[3][0]  # frames 0-2 fill exactly one chunk_bytes
    chunks = cut_file(0, sf, chunk_bytes, None)
    assert chunks[0] == Chunk(0, 0, starts[3][1])
    assert chunks[1].start == starts[3][1]


def test_records_on_and_across_frame_boundaries(tmp_path: Path) -> None:
    lines = [b'{"text": "aaaa"}', b'{"text": "bbbbbbbb"}', b"", b'{"text": "cc"}',
             b'{"text": "d"}']
    content = b"\n".join(lines) + b"\n"
    # frame cuts: inside record 0, exactly on record 1's start, on the blank line, on record
    # 3's start, inside record 4
    assert len(content) == 68  # line starts 0, 17, 38 (blank), 39, 54
    cuts = [5, 17, 38, 39, 58]
    sf, frames = layout_file(tmp_path, "zstd", split_at(content, cuts))
    assert [d for _, d in frames] == [0, 5, 17, 38, 39, 58]
    chunks = cut_file(0, sf, 1, None)  # every frame a chunk of its own
    assert [(c.start, c.stop) for c in chunks] == [(0, 5), (5, 17), (17, 38), (38, 39),
                                                   (39, 58), (58, 68)]
    reader = RecordReader([sf], "text")
    per_chunk = [[pos for pos, _ in reader.records(c)] for c in chunks]
    # record 1 starts on a boundary (17): the chunk before it owns it; record 2 (the blank
    # line at 38) is no record; record 3 starts on a boundary (39) after the one-byte chunk
    # [38, 39) that holds its newline; record 4 starts inside the frame [39, 58)
    assert per_chunk == [[0], [17], [], [39], [54], []]
    assert [r for recs in per_chunk for r in recs] == [p for p, _ in expected_lines(content)]


@pytest.mark.parametrize("layout", ["zstd", "pzstd", "seekable", "gzip-members", "bgzf"])
def test_a_restart_decompresses_from_the_frame_that_holds_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    content = content_of(300, long_every=40)
    sf, starts = layout_file(tmp_path, layout, split_at(content, random_cuts(content, 30)))
    chunks = cut_file(0, sf, 2000, None)
    reader = RecordReader([sf], "text")
    opened: list[int] = []
    real = jsonl_mod.open_stream

    def recording(uri: str, compression: str, offset: int = 0) -> Any:
        opened.append(offset)
        return real(uri, compression, offset)

    monkeypatch.setattr(jsonl_mod, "open_stream", recording)
    lines = dict(expected_lines(content))
    for chunk in chunks:
        recs = list(reader.records(chunk))
        for i, (pos, raw) in enumerate(recs):
            holder = max((c, d) for c, d in starts if d <= pos)
            del opened[:]
            assert list(reader.records(chunk, pos)) == recs[i:]
            assert reader.read_one((0, pos)) == raw == lines[pos]
            # both decompress from the last frame starting at or before the record
            assert opened == [holder[0], holder[0]]


def test_a_single_frame_file_is_one_chunk_whatever_its_size(tmp_path: Path) -> None:
    content = content_of(2000)
    for sf in (write(tmp_path, "one.jsonl.zst", zstandard.ZstdCompressor().compress(content)),
               write(tmp_path, "one.jsonl.gz", gzip.compress(content))):
        assert sf.size > 10_000
        chunks = cut_file(0, sf, 100, None)
        assert chunks == [Chunk(0, 0, -1)]
        reader = RecordReader([sf], "text")
        assert list(reader.records(chunks[0])) == expected_lines(content)


def test_a_file_no_larger_than_chunk_bytes_is_one_chunk_without_an_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    content = content_of(100)
    sf, _ = layout_file(tmp_path, "zstd", split_at(content, random_cuts(content, 10)))
    monkeypatch.setattr(jsonl_mod, "frame_index", None)  # calling it would fail
    assert cut_file(0, sf, sf.size, None) == [Chunk(0, 0, -1)]
    assert list(RecordReader([sf], "text").records(Chunk(0, 0, -1))) == \
        expected_lines(content)


# -- truncated and corrupt files ------------------------------------------------------------------


def _raises_naming(sf: SourceFile, action: Callable[[], Any]) -> str:
    with pytest.raises(DataError) as info:
        action()
    message = str(info.value)
    assert message.startswith(f"{sf.uri}: the compressed stream is corrupt or truncated: ")
    return message


def test_a_zstd_file_cut_in_the_middle_of_its_frame_is_an_error_naming_it(
        tmp_path: Path) -> None:
    # fsspec's zstd reader used to give a shorter stream here (0 records), with no error
    whole = zstandard.ZstdCompressor().compress(content_of(400))
    sf = write(tmp_path, "cut.jsonl.zst", whole[:len(whole) // 2])
    reader = RecordReader([sf], "text")
    message = _raises_naming(sf, lambda: list(reader.records(Chunk(0, 0, -1))))
    assert message.endswith(f"the zstd frame that starts at byte 0 is cut off at the end of "
                            f"the file (byte {len(whole) // 2})")
    _raises_naming(sf, lambda: reader.read_one((0, 10**6)))


def test_a_multi_frame_zstd_file_cut_mid_frame_fails_when_planned(tmp_path: Path) -> None:
    content = content_of(300)
    data, starts = zstd_frames(split_at(content, random_cuts(content, 12)))
    cut = (starts[6][0] + starts[7][0]) // 2
    sf = write(tmp_path, "cut.jsonl.zst", data[:cut])
    message = _raises_naming(sf, lambda: cut_file(0, sf, 100, None))
    assert f"the zstd frame that starts at byte {starts[6][0]} is cut off" in message


@pytest.mark.parametrize("layout", ["zstd", "gzip-members"])
def test_a_file_cut_between_frames_is_a_shorter_valid_file(tmp_path: Path,
                                                          layout: str) -> None:
    """Nothing in a zstd or gzip file says more frames were to come: a prefix of whole frames
    reads like zstd -d and gzip -d read it."""
    content = content_of(300)
    parts = split_at(content, random_cuts(content, 12))
    ext, writer = LAYOUTS[layout]
    data, starts = writer(parts)
    sf = write(tmp_path, f"prefix.jsonl.{ext}", data[:starts[7][0]])
    kept = content[:starts[7][1]]
    chunks = cut_file(0, sf, 100, None)
    assert read_all(RecordReader([sf], "text"), chunks) == expected_lines(kept)


@pytest.mark.parametrize("layout", ["zstd", "gzip-members"])
def test_a_file_cut_between_frames_after_planning_is_an_error(tmp_path: Path,
                                                             layout: str) -> None:
    content = content_of(300)
    sf, starts = layout_file(tmp_path, layout, split_at(content, random_cuts(content, 12)))
    chunks = cut_file(0, sf, 500, None)
    data = Path(sf.uri).read_bytes()
    Path(sf.uri).write_bytes(data[:starts[-2][0]])  # the last frame is gone
    reader = RecordReader([sf], "text")  # as planned: the index says more is there
    with pytest.raises(DataError) as info:
        read_all(reader, chunks)
    # the size the plan saw is checked when the file is opened (files.open_file)
    assert str(info.value).startswith(
        f"{sf.uri} changed after the plan was made: the plan saw {len(data)} bytes")


def test_a_gzip_file_of_members_cut_mid_member_fails_when_planned(tmp_path: Path) -> None:
    content = content_of(300)
    data, starts = gzip_members(split_at(content, random_cuts(content, 12)))
    sf = write(tmp_path, "cut.jsonl.gz", data[:starts[5][0] + 30])
    message = _raises_naming(sf, lambda: cut_file(0, sf, 100, None))
    assert f"the gzip member that starts at byte {starts[5][0]} is cut off" in message


@pytest.mark.parametrize("layout", ["zstd", "gzip-members", "bgzf", "seekable-checksums"])
def test_a_corrupt_byte_is_an_error_naming_the_file(tmp_path: Path, layout: str) -> None:
    content = content_of(300)
    ext, writer = LAYOUTS[layout]
    data, starts = writer(split_at(content, random_cuts(content, 8)))
    bad = bytearray(data)
    at = (starts[3][0] + starts[4][0]) // 2  # inside the fourth frame's compressed data
    bad[at] ^= 0x55
    sf = write(tmp_path, f"bad.jsonl.{ext}", bytes(bad))

    def read() -> None:
        read_all(RecordReader([sf], "text"), cut_file(0, sf, 100, None))

    _raises_naming(sf, read)


def test_garbage_after_the_frames_is_an_error_but_gzip_zero_padding_is_not(
        tmp_path: Path) -> None:
    content = content_of(50)
    zst = write(tmp_path, "tail.jsonl.zst",
                zstandard.ZstdCompressor().compress(content) + b"not zstd")
    message = _raises_naming(zst, lambda: list(RecordReader([zst], "text").records(
        Chunk(0, 0, -1))))
    assert "Unknown frame descriptor" in message or "unknown" in message.lower()
    gz = write(tmp_path, "pad.jsonl.gz", gzip.compress(content) + b"\0" * 100)
    assert list(RecordReader([gz], "text").records(Chunk(0, 0, -1))) == \
        expected_lines(content)


# -- the engine: lanes sharing one file ----------------------------------------------------------


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 7)))
                    for _ in range(n))


def shard(tmp_path: Path, docs: int, frames: int, layout: str = "zstd",
          seed: int = 0) -> tuple[Path, list[str]]:
    """One shard of ``docs`` documents in about ``frames`` frames cut anywhere."""
    rng = random.Random(seed)
    texts = [_words(rng, rng.randint(300, 700) if i % 25 == 0 else rng.randint(1, 60))
             for i in range(docs)]
    content = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    ext, writer = LAYOUTS[layout]
    data, _ = writer(split_at(content, random_cuts(content, frames - 1, seed)))
    path = tmp_path / f"shard.jsonl.{ext}"
    path.write_bytes(data)
    return path, texts


def recipe_for(tmp_path: Path, path: Path, chunk_bytes: int, **over: Any) -> dict[str, Any]:
    tok = tmp_path / "tokenizer.json"
    shutil.copyfile(tokenizer_path(), tok)
    data: dict[str, Any] = {
        "lanes": 8, "global_batch_size": 8, "seq_len": 64, "seed": 11,
        "tokenizer": {"uri": str(tok), "add_bos": False, "add_eos": True},
        "sources": [{"name": "big", "uris": [str(path)], "epochs": 1,
                     "chunk_bytes": chunk_bytes}],
        "shuffle": {"block_size": 8},
    }
    data.update(over)
    return data


@pytest.mark.parametrize("layout", ["zstd", "gzip-members"])
def test_eight_lanes_share_one_file_and_read_every_document_once(tmp_path: Path,
                                                                 layout: str) -> None:
    path, texts = shard(tmp_path, 600, 60, layout)
    recipe = load_recipe(recipe_for(tmp_path, path, chunk_bytes=2000))
    plan = Plan.build(recipe)
    assert len(plan.sources[0].chunks) >= 16
    t = Tokenizer.from_file(recipe.tokenizer.uri)
    eos = t.token_to_id("<|eos|>")
    expected = np.zeros(t.get_vocab_size(), dtype=np.int64)
    for text in texts:
        ids = [*t.encode(text, add_special_tokens=False).ids, eos]
        expected += np.bincount(ids, minlength=expected.size)
    got = np.zeros_like(expected)
    with Loader(recipe, 0, 1, Knobs(workers=2), plan=plan) as loader:
        for _ in range(5000):
            step = loader.next_step()
            got += np.bincount(step.input_ids[step.positions >= 0], minlength=got.size)
            if step.ended:
                break
        counters = loader.counters()
    assert step.ended
    assert counters.kept == len(texts)
    np.testing.assert_array_equal(got, expected)


def test_a_lane_over_a_multi_frame_file_resumes_anywhere(tmp_path: Path) -> None:
    path, _ = shard(tmp_path, 400, 50)
    plan = Plan.build(load_recipe(recipe_for(tmp_path, path, chunk_bytes=1500)))
    stage = plan.map_stages()[0]
    assert len(plan.sources[0].lane_chunks(3, 0)) >= 3
    with TaskPool(3) as pool:
        def make(state: Any) -> DocStream:
            cursor = SourceCursor.decode(state, "cursor") if state is not None else None
            return DocStream(plan.sources[0], 3, stage, pool,
                             Knobs(workers=3, prefetch=2, task_docs=5), 8, "skip",
                             Counters(), cursor)

        def advance(s: DocStream) -> Any:
            got = s.next_doc()
            return None if got is None else (got.columns[0].tobytes(), got.ref)

        probe = make(None)
        total = 0
        while probe.next_doc() is not None:
            total += 1
        assert total > 30
        assert_resume_anywhere(make, advance, lambda s: s.cursor.encode(), total + 2,
                               points=sorted({*range(0, total + 3, 4), total - 1, total}))


def test_verify_agrees_on_a_multi_frame_zst_shared_by_8_lanes(tmp_path: Path,
                                                               capsys: Any) -> None:
    path, _ = shard(tmp_path, 2500, 600)
    recipe = recipe_for(tmp_path, path, chunk_bytes=1024)
    recipe["sources"][0]["epochs"] = None  # repeated: every step is full
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))
    loaded = load_recipe(str(recipe_path))
    plan = Plan.build(loaded)
    assert os.path.getsize(path) > 300_000 and len(plan.sources[0].chunks) >= 200
    steps = 96
    # the lanes read across chunk boundaries (two a lane on average) before the last step:
    # resume points fall in chunks other than the first
    end = run_world(loaded, 1, Knobs(workers=1), steps, plan=plan,
                    save_at=frozenset({steps - 1})).checkpoints[steps - 1]
    assert sum(lane.sources[0].chunk for lane in end.lanes.values()) >= 16
    assert verify(str(recipe_path), steps, [1, 2, 4, 8], [1, 3], [0, 13, 50, steps - 1])
    out = capsys.readouterr().out
    assert "OK: 40 runs" in out and "DIFFERS" not in out


def test_too_few_chunks_name_single_frame_compressed_files(tmp_path: Path) -> None:
    content = content_of(50)
    for k in range(3):
        (tmp_path / f"s{k}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(content))
    data = recipe_for(tmp_path, tmp_path / "s*.jsonl.zst", chunk_bytes=1)
    with pytest.raises(ConfigError) as info:
        Plan.build(load_recipe(data))
    assert str(info.value) == (
        "sources[0] 'big' has 3 chunk(s) in 3 file(s), but 8 lanes each need at least one per "
        "epoch; compressed files with one frame are one chunk each: write them with several "
        "frames (pzstd, bgzip, the zstd seekable format) or split them, or use fewer lanes")
    # frames are there, but the chunks are too large for them: chunk_bytes is the fix
    path, _ = shard(tmp_path, 100, 20)
    with pytest.raises(ConfigError) as info:
        Plan.build(load_recipe(recipe_for(tmp_path, path, chunk_bytes=os.path.getsize(path))))
    assert str(info.value).endswith(
        "has 1 chunk(s) in 1 file(s), but 8 lanes each need at least one per epoch; set a "
        "smaller sources[0].chunk_bytes, add files, or use fewer lanes")


def test_a_file_cut_at_frames_puts_its_chunk_count_in_the_fingerprint(tmp_path: Path) -> None:
    path, _ = shard(tmp_path, 200, 20)
    one_lane = {"lanes": 1, "global_batch_size": 1}
    plan = Plan.build(load_recipe(recipe_for(tmp_path, path, chunk_bytes=500, **one_lane)))
    n = len(plan.sources[0].chunks)
    assert n > 1
    assert plan.fingerprint_doc["compressed_chunks"] == {"big": {str(path): n}}
    # one chunk: no entry, so such recipes keep the fingerprint they always had
    whole = Plan.build(load_recipe(recipe_for(tmp_path, path, chunk_bytes=1 << 30, **one_lane)))
    assert whole.sources[0].chunks == [Chunk(0, 0, -1)]
    assert "compressed_chunks" not in whole.fingerprint_doc


def test_a_file_cut_into_two_chunks_is_named_in_the_fingerprint(tmp_path: Path) -> None:
    """Two chunks is already a cut: the file is named with its count (one chunk is not)."""
    path, _ = shard(tmp_path, 40, 2)
    plan = Plan.build(load_recipe(recipe_for(tmp_path, path, chunk_bytes=1, lanes=1,
                                             global_batch_size=1)))
    assert len(plan.sources[0].chunks) == 2, "one chunk per frame of the two"
    assert plan.fingerprint_doc["compressed_chunks"] == {"big": {str(path): 2}}
