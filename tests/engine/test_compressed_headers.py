"""Frame indexes built from hand-written headers: zstd frames and blocks, the seekable format's
seek table, BGZF members - and the hostile values in them.

Every file here is written byte by byte from the format specifications (RFC 8878 for zstd
frames and blocks, the zstd seekable format, SAM/BGZF), so each expected offset and size is
computed by hand from the bytes written, not by datalane. A size, count or offset read from a
header that the file cannot hold is a :class:`DataError` naming the file and the value.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import zstandard

import datalane.engine.compressed as compressed
from datalane import DataError
from datalane.engine.chunks import Chunk, RecordReader, cut_file
from datalane.engine.files import SourceFile, compression_of, expand, format_of
from datalane.spec.errors import StorageError
from tests.support.indexes import fresh_indexes  # noqa: F401  (autouse)


def write(tmp_path: Path, name: str, data: bytes) -> SourceFile:
    path = tmp_path / name
    path.write_bytes(data)
    [(uri, size, ident)] = expand(str(path), "test")
    return SourceFile(uri, size, ident, format_of(uri, None, "test"), compression_of(uri))


def index_of(sf: SourceFile) -> tuple[list[tuple[int, int]], int, int]:
    index = compressed.frame_index(sf)
    return (list(zip(index.coffsets.tolist(), index.doffsets.tolist(), strict=True)),
            index.csize, index.dsize)


def refused(sf: SourceFile) -> str:
    with pytest.raises(DataError) as info:
        compressed.frame_index(sf)
    message = str(info.value)
    assert message.startswith(f"{sf.uri}: the compressed stream is corrupt or truncated: ")
    return message


def no_decompressing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decompressed while indexing")

    monkeypatch.setattr(compressed, "_Stream", refuse)


# -- zstd, by hand (RFC 8878) ---------------------------------------------------------------------


MAGIC = struct.pack("<I", 0xFD2FB528)
WINDOW = b"\x50"  # window descriptor: exponent 10, window log 20 (1 MiB)


def block(last: bool, kind: int, size: int) -> bytes:
    """A 3-byte block header: bit 0 last, bits 1-2 type (0 raw, 1 RLE, 2 compressed, 3
    reserved), bits 3-23 the size (the regenerated size for RLE)."""
    return (size << 3 | kind << 1 | int(last)).to_bytes(3, "little")


def raw(data: bytes, last: bool = True) -> bytes:
    return block(last, 0, len(data)) + data


def rle(byte: bytes, n: int, last: bool = True) -> bytes:
    return block(last, 1, n) + byte


def frame(blocks: bytes, fcs: int | None = None, fcs_bytes: int = 0,
          checksum: bool = False) -> bytes:
    """A frame header (window descriptor, no dictionary) and ``blocks``. ``fcs_bytes`` 2, 4 or
    8 writes the content size ``fcs`` in that many bytes (2: minus 256, as the format says)."""
    flag = {0: 0, 2: 1, 4: 2, 8: 3}[fcs_bytes]
    fhd = flag << 6 | (0x04 if checksum else 0)
    head = MAGIC + bytes([fhd]) + WINDOW
    if fcs_bytes:
        assert fcs is not None
        head += (fcs - 256 if fcs_bytes == 2 else fcs).to_bytes(fcs_bytes, "little")
    return head + blocks


def skippable(payload: bytes, magic: int = 0x184D2A53) -> bytes:
    return struct.pack("<II", magic, len(payload)) + payload


ONE, TWO = frame(raw(b"ab\n")), frame(raw(b"cdef\n"))  # 12 and 14 bytes; 3 and 5 of content


def test_frames_of_raw_and_rle_blocks_are_measured_from_their_block_headers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no content size in the headers: the sizes are the raw blocks' lengths and the RLE
    # blocks' regenerated sizes; an RLE block is 4 bytes whatever its size
    f1 = frame(raw(b"abc\n", last=False) + rle(b"x", 5, last=False) + raw(b"\n"))  # 4 + 5 + 1
    f2 = frame(rle(b"y", 300, last=False) + raw(b"z\n"))  # 300 + 2
    assert (len(f1), len(f2)) == (6 + 7 + 4 + 4, 6 + 4 + 5)
    sf = write(tmp_path, "plain.jsonl.zst", f1 + f2)
    no_decompressing(monkeypatch)
    assert index_of(sf) == ([(0, 0), (21, 10)], 36, 312)


def test_content_sizes_are_read_from_two_four_and_eight_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a compressed block hides its size: the header's content size is the only one there is
    data = b" ".join(b"%d" % (i * i) for i in range(200))[:700]
    body = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    blocks = body[6:]  # past magic, descriptor and window: the frame's blocks
    assert body[4] == 0x00 and blocks[0] >> 1 & 3 == 2  # no size, checksum; a compressed block
    frames = [frame(blocks, 700, 2), frame(blocks, 700, 4), frame(blocks, 700, 8)]
    sizes = [len(f) for f in frames]
    assert sizes == [len(blocks) + 8, len(blocks) + 10, len(blocks) + 14]
    sf = write(tmp_path, "sizes.jsonl.zst", b"".join(frames))
    no_decompressing(monkeypatch)
    assert index_of(sf) == ([(0, 0), (sizes[0], 700), (sizes[0] + sizes[1], 1400)],
                            sum(sizes), 2100)


def test_frames_after_one_without_a_size_are_measured_by_decompressing_from_it(
        tmp_path: Path) -> None:
    sized = frame(raw(b"one\n"))  # 4 bytes, measured from its block
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"two\n" * 100)
    tail = frame(raw(b"three\n"), 6, 8)
    sf = write(tmp_path, "mixed.jsonl.zst", sized + unsized + tail)
    a, b = len(sized), len(sized) + len(unsized)
    assert index_of(sf) == ([(0, 0), (a, 4), (b, 404)], b + len(tail), 410)


def test_skippable_frames_are_stepped_over_to_the_end_of_the_file(tmp_path: Path) -> None:
    one, two = frame(raw(b"a\n")), frame(raw(b"bc\n"))
    sf = write(tmp_path, "skip.jsonl.zst",
               skippable(b"1234") + one + skippable(b"") + two + skippable(b"xyz"))
    n = len(one)  # 6 + 3 + 2
    assert index_of(sf) == ([(12, 0), (12 + n + 8, 2)], 12 + n + 8 + len(two) + 11, 5)


def test_an_empty_frame_starts_where_the_next_does(tmp_path: Path) -> None:
    empty = frame(raw(b""))
    sf = write(tmp_path, "empty.jsonl.zst", frame(raw(b"ab\n")) + empty + frame(raw(b"cdef\n")))
    assert index_of(sf) == ([(0, 0), (12, 3), (21, 3)], 35, 8)


def test_a_skippable_frame_longer_than_the_file_is_an_error(tmp_path: Path) -> None:
    one = frame(raw(b"a\n"))
    sf = write(tmp_path, "skip.jsonl.zst", one + struct.pack("<II", 0x184D2A50, 5) + b"1234")
    assert refused(sf).endswith(f"the skippable frame at byte {len(one)} is cut off at the end "
                                f"of the file (byte {len(one) + 12})")


@pytest.mark.parametrize("tail", [b"\x28", b"\x28\xb5\x2f"])
def test_bytes_after_the_last_frame_too_short_for_a_magic_are_an_error(
        tmp_path: Path, tail: bytes) -> None:
    one = frame(raw(b"a\n"))
    sf = write(tmp_path, "tail.jsonl.zst", one + tail)
    assert refused(sf).endswith(f"the file ends at byte {len(one) + len(tail)} inside the magic "
                                f"number of a frame at byte {len(one)}")


def test_a_frame_of_another_magic_is_an_error_naming_its_bytes(tmp_path: Path) -> None:
    one = frame(raw(b"a\n"))
    sf = write(tmp_path, "other.jsonl.zst", one + b"PK\x03\x04rest")
    assert refused(sf).endswith(f"no zstd frame at byte {len(one)} (it starts 504b0304)")


def test_a_frame_header_with_the_reserved_bit_is_an_error(tmp_path: Path) -> None:
    bad = MAGIC + b"\x08" + WINDOW + raw(b"a\n")
    sf = write(tmp_path, "reserved.jsonl.zst", frame(raw(b"ok\n")) + bad)
    assert refused(sf).endswith("the zstd frame at byte 12 has a reserved header bit set")


def test_a_frame_cut_off_in_its_header_is_an_error(tmp_path: Path) -> None:
    # an 8-byte content size announced, 3 of its bytes present
    sf = write(tmp_path, "head.jsonl.zst", MAGIC + b"\xc0" + WINDOW + b"\x01\x02\x03")
    assert refused(sf).endswith("the zstd frame at byte 0 is cut off in its header")


@pytest.mark.parametrize("tail", [MAGIC, MAGIC + b"\x00"])
def test_a_file_that_ends_after_a_frame_magic_is_an_error(tmp_path: Path, tail: bytes) -> None:
    sf = write(tmp_path, "magic.jsonl.zst", frame(raw(b"ok\n")) + tail)
    assert refused(sf).endswith("the zstd frame at byte 12 is cut off in its header")


def test_a_skippable_frame_cut_off_in_its_size_is_an_error(tmp_path: Path) -> None:
    sf = write(tmp_path, "skip.jsonl.zst", frame(raw(b"ok\n")) + skippable(b"")[:6])
    assert refused(sf).endswith("the skippable frame at byte 12 is cut off at the end of the "
                                "file (byte 18)")


def test_dictionary_ids_of_one_two_and_four_bytes_are_stepped_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    frames = [MAGIC + bytes([flag]) + WINDOW + b"\x07" * n + raw(b"ab\n")
              for flag, n in ((1, 1), (2, 2), (3, 4))]
    # the longest header, 18 bytes: a 4-byte dictionary id and an 8-byte content size
    frames.append(MAGIC + b"\xc3" + WINDOW + b"\x07" * 4 + (3).to_bytes(8, "little")
                  + raw(b"ab\n"))
    assert [len(f) for f in frames] == [13, 14, 16, 24]
    sf = write(tmp_path, "dict.jsonl.zst", b"".join(frames))
    no_decompressing(monkeypatch)
    assert index_of(sf) == ([(0, 0), (13, 3), (27, 6), (43, 9)], 67, 12)


def test_a_block_of_the_reserved_type_is_an_error_naming_where_it_is(tmp_path: Path) -> None:
    bad = frame(raw(b"ab", last=False) + block(True, 3, 1) + b"z")
    sf = write(tmp_path, "kind.jsonl.zst", frame(raw(b"ok\n")) + bad)
    assert refused(sf).endswith("a block of the zstd frame at byte 12 has the reserved type "
                                "(at byte 23)")  # 12 + 6 + 3 + 2


@pytest.mark.parametrize(("name", "cut"), [
    ("in a block header", frame(raw(b"ab", last=False)) + b"\x01"),
    ("in a block", frame(raw(b"abcdef"))[:-1]),
    ("in the checksum", frame(raw(b"ab"), checksum=True) + b"\0\0\0"),
    ("before the last block", frame(raw(b"ab", last=False))),
])
def test_a_frame_cut_off_after_its_header_is_an_error(tmp_path: Path, name: str,
                                                      cut: bytes) -> None:
    one = frame(raw(b"ok\n"))
    sf = write(tmp_path, "cut.jsonl.zst", one + cut)
    assert refused(sf).endswith(f"the zstd frame that starts at byte {len(one)} is cut off at "
                                f"the end of the file (byte {len(one) + len(cut)})"), name


def test_a_frame_that_ends_at_the_last_byte_of_the_file_is_whole(tmp_path: Path) -> None:
    checked = frame(raw(b"ab\n"), 3, 8, checksum=True) + b"\1\2\3\4"  # (not read when indexing)
    sf = write(tmp_path, "whole.jsonl.zst", frame(raw(b"ok\n")) + checked)
    assert index_of(sf) == ([(0, 0), (12, 3)], 12 + len(checked), 6)


def test_a_content_size_beyond_what_the_frame_can_hold_is_an_error(tmp_path: Path) -> None:
    # a block of 4 bytes makes at most 128 KiB: this 18-byte frame holds at most 18 << 17
    # bytes - one RLE block of 4, a header of 6 + an 8-byte size
    most = 18 << 17
    assert most == 2_359_296
    fits = frame(rle(b"x", 1000), most, 8)
    assert len(fits) == 18
    sf = write(tmp_path, "fits.jsonl.zst", ONE + fits)
    assert index_of(sf) == ([(0, 0), (12, 3)], 30, 3 + most)
    sf = write(tmp_path, "claims.jsonl.zst", ONE + frame(rle(b"x", 1000), most + 1, 8))
    assert refused(sf).endswith(f"the zstd frame at byte 12 claims {most + 1} bytes of content "
                                f"in 18 bytes")


# -- the zstd seekable format ---------------------------------------------------------------------


def seek_table(entries: list[tuple[int, int]], descriptor: int = 0, frames: int | None = None,
               magic: int = 0x184D2A5E, size: int | None = None) -> bytes:
    """The seek table's skippable frame: ``(compressed, decompressed)`` size of each frame,
    then the footer (frame count, descriptor, magic ``0x8F92EAB1``)."""
    body = b"".join(struct.pack("<II", c, d) + (b"\0" * 4 if descriptor & 0x80 else b"")
                    for c, d in entries)
    footer = struct.pack("<IBI", len(entries) if frames is None else frames, descriptor,
                         0x8F92EAB1)
    return struct.pack("<II", magic, len(body) + 9 if size is None else size) + body + footer


def test_a_seek_table_is_the_index_without_walking_the_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = seek_table([(12, 3), (14, 5)])
    assert (len(ONE), len(TWO), len(table)) == (12, 14, 8 + 16 + 9)
    sf = write(tmp_path, "seek.jsonl.zst", ONE + TWO + table)
    monkeypatch.setattr(compressed, "_zstd_index", None)
    no_decompressing(monkeypatch)
    assert index_of(sf) == ([(0, 0), (12, 3)], 26 + 33, 8)


@pytest.mark.parametrize(("descriptor", "entry"), [(0x80, 12), (0x83, 12), (0x01, 8), (0x02, 8)])
def test_seek_table_entries_with_checksums_and_of_empty_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, descriptor: int, entry: int) -> None:
    # entries of 12 bytes with the checksum flag (bit 7), else 8; an entry of 0 compressed
    # bytes lists no frame; the unused bits 0-1 of the descriptor are ignored
    table = seek_table([(12, 3), (0, 0), (14, 5)], descriptor=descriptor)
    assert len(table) == 8 + 3 * entry + 9
    sf = write(tmp_path, "seek.jsonl.zst", ONE + TWO + table)
    monkeypatch.setattr(compressed, "_zstd_index", None)
    assert index_of(sf) == ([(0, 0), (12, 3)], 26 + len(table), 8)


def test_a_file_of_one_empty_skippable_frame_has_no_frames(tmp_path: Path) -> None:
    # 8 bytes: too short for a seek table's footer (9) - not read as one
    sf = write(tmp_path, "skip.jsonl.zst", skippable(b""))
    assert index_of(sf) == ([], 8, 0)


def test_a_file_that_is_only_a_seek_table_of_no_frames_is_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sf = write(tmp_path, "empty.jsonl.zst", seek_table([]))
    assert sf.size == 17
    monkeypatch.setattr(compressed, "_zstd_index", None)
    assert index_of(sf) == ([], 17, 0)


@pytest.mark.parametrize("descriptor", [0x04, 0x40, 0xfc])
def test_a_seek_table_descriptor_with_reserved_bits_is_an_error(tmp_path: Path,
                                                               descriptor: int) -> None:
    sf = write(tmp_path, "seek.jsonl.zst", ONE + seek_table([(12, 3)], descriptor=descriptor))
    assert refused(sf).endswith(f"the seek table's descriptor {descriptor:#04x} has reserved "
                                f"bits set")


def test_a_seek_table_of_more_frames_than_the_file_holds_is_an_error(tmp_path: Path) -> None:
    # 2 entries of 8 bytes fit in the file's 12 + 33 bytes; the footer claims 1000 (8017 bytes)
    sf = write(tmp_path, "seek.jsonl.zst", ONE + seek_table([(12, 3), (0, 0)], frames=1000))
    assert refused(sf).endswith("the seek table lists 1000 frames, more than the file holds")
    # one more than fits: a table of 5 entries needs 57 bytes, the file has 12 + 33 + 8
    sf = write(tmp_path, "five.jsonl.zst", ONE + b"\0" * 8 + seek_table([(12, 3)] * 2, frames=5))
    assert sf.size == 53
    assert refused(sf).endswith("the seek table lists 5 frames, more than the file holds")


@pytest.mark.parametrize(("magic", "size"), [(0x184D2A50, None), (0x184D2A5E, 24)])
def test_a_seek_table_not_in_its_skippable_frame_is_an_error(tmp_path: Path, magic: int,
                                                            size: int | None) -> None:
    sf = write(tmp_path, "seek.jsonl.zst",
               ONE + TWO + seek_table([(12, 3), (14, 5)], magic=magic, size=size))
    assert refused(sf).endswith("the seek table at byte 26 is not a skippable frame of magic "
                                "0x184d2a5e and size 25")


@pytest.mark.parametrize("sizes", [(12, 13), (13, 14)])
def test_seek_table_sizes_that_do_not_add_up_to_the_frames_are_an_error(
        tmp_path: Path, sizes: tuple[int, int]) -> None:
    sf = write(tmp_path, "seek.jsonl.zst",
               ONE + TWO + seek_table([(sizes[0], 3), (sizes[1], 5)]))
    assert refused(sf).endswith(f"the seek table's frames add up to {sum(sizes)} bytes, but 26 "
                                f"bytes precede the table")


def test_a_seek_table_whose_first_frame_is_not_zstd_is_an_error(tmp_path: Path) -> None:
    sf = write(tmp_path, "seek.jsonl.zst", b"x" * 12 + TWO + seek_table([(12, 3), (14, 5)]))
    assert refused(sf).endswith("the seek table's first frame is not a zstd frame")


# -- BGZF members ---------------------------------------------------------------------------------


def deflated(data: bytes) -> bytes:
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    return co.compress(data) + co.flush()


def bgzf_member(data: bytes, before: bytes = b"", length: int | None = None) -> bytes:
    """A BGZF member: gzip with FEXTRA, the subfields ``before`` and then 'BC' (2 bytes: the
    member's length - 1), the deflated data, CRC-32 and size."""
    body = deflated(data)
    extra_len = len(before) + 6
    total = 12 + extra_len + len(body) + 8
    extra = before + b"BC" + struct.pack("<HH", 2, (total if length is None else length) - 1)
    return (b"\x1f\x8b\x08\x04" + b"\0\0\0\0" + b"\0\xff" + struct.pack("<H", extra_len) + extra
            + body + struct.pack("<II", zlib.crc32(data), len(data)))


def test_bgzf_members_are_indexed_from_their_lengths_past_other_subfields(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = bgzf_member(b"one\n" * 50)
    two = bgzf_member(b"two\n" * 70, before=b"XY" + struct.pack("<H", 3) + b"abc")
    end = bgzf_member(b"")
    assert len(two) == 12 + 13 + len(deflated(b"two\n" * 70)) + 8
    sf = write(tmp_path, "bgzf.jsonl.gz", one + two + end + b"\0" * 7)  # zero padding at the end
    no_decompressing(monkeypatch)
    a, b = len(one), len(one) + len(two)
    assert index_of(sf) == ([(0, 0), (a, 200), (b, 480)], b + len(end) + 7, 480)


def test_a_bc_subfield_cut_short_by_the_extra_length_is_not_a_bgzf_length(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # XLEN 4: 'BC' and its length 2, but none of its 2 bytes: an ordinary gzip member
    data = b"short bc\n"
    member = (b"\x1f\x8b\x08\x04" + b"\0\0\0\0" + b"\0\xff" + struct.pack("<H", 4) + b"BC\x02\0"
              + deflated(data) + struct.pack("<II", zlib.crc32(data), len(data)))
    assert gzip.decompress(member) == data
    sf = write(tmp_path, "bc.jsonl.gz", member)
    no_decompressing(monkeypatch)
    assert index_of(sf) == ([(0, 0)], len(member), -1)


def test_a_plain_gzip_member_among_bgzf_members_is_inflated_to_find_its_end(
        tmp_path: Path) -> None:
    one, plain, two = bgzf_member(b"one\n"), gzip.compress(b"plain\n" * 9), bgzf_member(b"2\n")
    sf = write(tmp_path, "mixed.jsonl.gz", one + plain + two)
    a, b = len(one), len(one) + len(plain)
    assert index_of(sf) == ([(0, 0), (a, 4), (b, 58)], b + len(two), 60)


def test_a_bgzf_length_past_the_end_of_the_file_is_an_error(tmp_path: Path) -> None:
    one = bgzf_member(b"one\n")
    long = bgzf_member(b"two\n", length=1000)
    sf = write(tmp_path, "long.jsonl.gz", one + long)
    assert refused(sf).endswith(f"the gzip member that starts at byte {len(one)} is cut off at "
                                f"the end of the file (byte {len(one) + len(long)})")


@pytest.mark.parametrize("first", [True, False])
def test_a_bgzf_length_shorter_than_its_header_and_trailer_is_an_error(tmp_path: Path,
                                                                      first: bool) -> None:
    # BC holds the length - 1: 0 says 1 byte; a member is at least its 18-byte header (12 and
    # the 6-byte BC field) and its 8-byte trailer (the first member's trailer would be read
    # at byte -3: a storage error, retried, before this check)
    one = bgzf_member(b"one\n")
    short = bgzf_member(b"two\n", length=1 if first else 25)
    sf = write(tmp_path, "short.jsonl.gz", short + one if first else one + short + one)
    at = 0 if first else len(one)
    assert refused(sf).endswith(f"the BGZF member at byte {at} gives its length as "
                                f"{1 if first else 25} bytes, less than its header and "
                                f"trailer (26 bytes)")


@pytest.mark.parametrize(("tail", "starts"), [(b"\0\0\0\0junk", "000000"), (b"junk", "6a756e")])
def test_bytes_after_bgzf_members_that_are_not_zero_padding_are_an_error(
        tmp_path: Path, tail: bytes, starts: str) -> None:
    one = bgzf_member(b"one\n")
    sf = write(tmp_path, "tail.jsonl.gz", one + bgzf_member(b"") + tail)
    at = len(one) + len(bgzf_member(b""))
    assert refused(sf).endswith(f"no gzip member at byte {at} (it starts {starts})")


def test_a_gzip_member_without_the_extra_flag_is_not_bgzf_whatever_its_header_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # flags FTEXT, FNAME, FCOMMENT (0x19), no FEXTRA (0x04): bytes 10-17 - the name b"\x08",
    # its terminator, the comment b"BC\x02" and its terminator - would read as an extra field
    # of 8 bytes holding a BC subfield
    data = b"not bgzf\n"
    member = (b"\x1f\x8b\x08\x19" + b"\0\0\0\0" + b"\0\xff" + b"\x08\0" + b"BC\x02\0"
              + deflated(data) + struct.pack("<II", zlib.crc32(data), len(data)))
    assert gzip.decompress(member) == data
    sf = write(tmp_path, "named.jsonl.gz", member)
    no_decompressing(monkeypatch)
    assert index_of(sf) == ([(0, 0)], len(member), -1)


# -- gzip: looking for a second member ------------------------------------------------------------


def test_a_member_magic_cut_off_at_the_end_of_a_gzip_file_is_an_error(tmp_path: Path) -> None:
    one = gzip.compress(b"one\n" * 20, mtime=0)
    sf = write(tmp_path, "cut.jsonl.gz", one + b"\x1f\x8b\x08")
    assert refused(sf).endswith(f"the gzip member that starts at byte {len(one)} is cut off at "
                                f"the end of the file (byte {len(one) + 3})")


def test_only_member_magics_with_a_valid_flag_byte_are_tried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # stored deflate keeps the content's bytes: magics with reserved flag bits (0xe0) are not
    # candidates; the one with a clean flag byte (FCOMMENT) is tried, and zlib finds no error
    # in what follows it, so the file is inflated to find its members: one, of 19 bytes
    content = b"\x1f\x8b\x08\xe0 \x1f\x8b\x08\x20 \x1f\x8b\x08\x10 end\n"
    data = gzip.compress(content, compresslevel=0, mtime=0)
    sf = write(tmp_path, "magics.jsonl.gz", data)
    tried: list[int] = []
    real = compressed._inflates

    def inflates(sf: SourceFile, pos: int) -> bool:
        tried.append(pos)
        return real(sf, pos)

    monkeypatch.setattr(compressed, "_inflates", inflates)
    assert len(content) == 19
    assert index_of(sf) == ([(0, 0)], len(data), 19)
    assert tried == [data.index(b"\x1f\x8b\x08\x10")]


# -- bounded decompression: at most 32 blocks a call ----------------------------------------------


def rle_frame(blocks: int, size: int) -> bytes:
    """A frame of ``blocks`` RLE blocks of ``size`` bytes of 'x' each: 6 + 4 per block."""
    return frame(b"".join(rle(b"x", size, last=i == blocks - 1) for i in range(blocks)))


def test_a_feed_completes_at_most_32_blocks() -> None:
    data = rle_frame(40, 1000)
    assert len(data) == 166
    blocks = compressed._ZstdBlocks(0)
    assert blocks.feed(0, memoryview(data), False) == 6 + 32 * 4  # the header, 32 blocks
    assert blocks.feed(134, memoryview(data)[134:], False) == 32  # the other 8


def test_a_feed_takes_at_most_32_kib_of_input() -> None:
    data = frame(raw(b"r" * 40_000)) + frame(raw(b"s"))
    blocks = compressed._ZstdBlocks(0)
    assert blocks.feed(0, memoryview(data), False) == 32 << 10  # inside the first block
    rest = memoryview(data)[32 << 10:]
    assert blocks.feed(32 << 10, rest, False) == 40_009 - (32 << 10) + 10  # to the end


def test_a_feed_steps_over_skippable_frames_and_checksums() -> None:
    data = skippable(b"abcd") + frame(rle(b"x", 9), checksum=True) + b"\1\2\3\4" + rle_frame(
        33, 10)
    assert len(data) == 12 + 14 + 138
    blocks = compressed._ZstdBlocks(0)
    # the skippable frame, the first frame and its checksum, then the header and 32 blocks
    # of the second frame
    assert blocks.feed(0, memoryview(data), False) == 26 + 6 + 31 * 4


def test_a_feed_waits_for_a_header_cut_off_by_the_data_at_hand() -> None:
    data = rle_frame(2, 10)
    assert compressed._ZstdBlocks(0).feed(0, memoryview(data)[:5], False) == 0  # read more
    assert compressed._ZstdBlocks(0).feed(0, memoryview(data)[:5], True) == 5  # the end
    # a block header cut off after the frame header: feed up to it
    assert compressed._ZstdBlocks(0).feed(0, memoryview(data)[:8], False) == 6
    assert compressed._ZstdBlocks(0).feed(0, memoryview(data)[:8], True) == 8
    # a skippable frame's size cut off
    assert compressed._ZstdBlocks(0).feed(0, memoryview(skippable(b"ab"))[:6], False) == 0


def test_bytes_that_are_not_zstd_are_fed_256_at_a_time() -> None:
    blocks = compressed._ZstdBlocks(0)
    junk = memoryview(b"junk" * 100)
    assert blocks.feed(0, junk, False) == 256
    assert blocks.feed(256, junk[256:], False) == 144
    after = frame(raw(b"")) + b"junk" * 100  # the frame, then at least 256 bytes
    assert compressed._ZstdBlocks(0).feed(0, memoryview(after), False) == 256
    far = frame(raw(b"r" * 300)) + b"junk" * 100  # junk further in than 256 bytes: up to it
    assert compressed._ZstdBlocks(0).feed(0, memoryview(far), False) == 309


def test_one_read_of_a_stream_returns_at_most_32_blocks_of_output(tmp_path: Path) -> None:
    # 40 RLE blocks of 128 KiB: 166 bytes that decompress to 5 MiB
    data = rle_frame(40, 128 << 10)
    sf = write(tmp_path, "rle.jsonl.zst", data)
    with compressed._Stream(open(sf.uri, "rb"), sf.uri, "zstd", 0) as stream:
        assert stream.readinto(bytearray(8 << 20)) == 32 << 17  # 4 MiB
    with compressed._Stream(open(sf.uri, "rb"), sf.uri, "zstd", 0) as stream:
        assert stream.drain() == 40 << 17


# -- reading by a seek table that does not match the frames ---------------------------------------


def test_a_seek_table_that_understates_a_frame_is_an_error_not_lost_records(
        tmp_path: Path) -> None:
    # frame 0 holds 4 lines of 14 bytes (56 bytes), frame 1 two (28); the table says 14 and 28,
    # so the plan cuts at 14: the first chunk would stop after 2 records and the second skip
    # to frame 1 - 3 of the 6 records, without an error, if the cut were not checked
    a, b = b'{"text": "a"}\n', b'{"text": "b"}\n'
    one, two = frame(raw(a * 4)), frame(raw(b * 2))
    assert (len(one), len(two)) == (65, 37)
    sf = write(tmp_path, "lies.jsonl.zst", one + two + seek_table([(65, 14), (37, 28)]))
    chunks = cut_file(0, sf, 1, None)
    assert chunks == [Chunk(0, 0, 14), Chunk(0, 14, 42)]
    reader = RecordReader([sf], "text")
    with pytest.raises(DataError) as info:
        list(reader.records(chunks[0]))
    assert str(info.value) == (
        f"{sf.uri}: the file's frame index does not match its compressed stream: no frame "
        f"starts at decompressed byte 14, where the chunk (bytes 0-14) ends - a seek table or "
        f"frame header with a wrong size, or a file rewritten since the plan was made")


def test_a_seek_table_that_matches_the_frames_reads_every_record_once(tmp_path: Path) -> None:
    a, b = b'{"text": "a"}\n', b'{"text": "b"}\n'
    one, two = frame(raw(a * 4)), frame(raw(b * 2))
    sf = write(tmp_path, "true.jsonl.zst", one + two + seek_table([(65, 56), (37, 28)]))
    chunks = cut_file(0, sf, 1, None)
    assert chunks == [Chunk(0, 0, 56), Chunk(0, 56, 84)]
    reader = RecordReader([sf], "text")
    # the record at 56 starts the second frame: its newline (byte 55) is in the first chunk
    assert [[pos for pos, _ in reader.records(c)] for c in chunks] == [
        [0, 14, 28, 42, 56], [70]]


# -- strict streams -------------------------------------------------------------------------------


def test_a_stream_opened_at_a_later_frame_counts_from_there(tmp_path: Path) -> None:
    sf = write(tmp_path, "two.jsonl.zst", ONE + skippable(b"pad") + TWO)
    with compressed.open_stream(sf, "zstd", 12) as f:
        assert f.read() == b"cdef\n"
        assert compressed.frames_begun(f) == [(12, 0), (23, 0)]  # the skippable frame, TWO
    with compressed.open_stream(sf, "zstd") as f:
        assert f.read() == b"ab\ncdef\n"
        assert compressed.frames_begun(f) == [(0, 0), (12, 3), (23, 3)]


def test_zeros_between_and_after_gzip_members_are_padding(tmp_path: Path) -> None:
    one, two = gzip.compress(b"one\n", mtime=0), gzip.compress(b"two\n", mtime=0)
    sf = write(tmp_path, "pad.jsonl.gz", one + b"\0" * 5 + two + b"\0" * 3)
    with compressed.open_stream(sf, "gzip") as f:
        assert f.read() == b"one\ntwo\n"
        assert compressed.frames_begun(f) == [(0, 0), (len(one) + 5, 4)]


class _Failing(io.RawIOBase):
    def __init__(self, error: OSError) -> None:
        self._error = error

    def readinto(self, b: Any) -> int:
        raise self._error


def test_a_read_that_fails_is_a_transient_storage_error_naming_the_byte() -> None:
    stream = compressed._Stream(_Failing(OSError("disk gone")), "mem://x.zst", "zstd", 70)
    with pytest.raises(StorageError) as info:
        stream.read(10)
    assert str(info.value) == "cannot read mem://x.zst at byte 70: disk gone"
    assert info.value.transient
    own = StorageError("throttled", transient=False)  # a storage error is passed on as it is
    stream = compressed._Stream(_Failing(own), "mem://x.zst", "zstd", 0)
    with pytest.raises(StorageError) as info:
        stream.read(10)
    assert info.value is own


def test_a_compression_other_than_gzip_and_zstd_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown compression 'bz2'"):
        compressed._Stream(io.BytesIO(b""), "mem://x", "bz2", 0)


class _FailsAfter:
    """A file whose reads fail after the first ``reads``."""

    def __init__(self, path: str, reads: int) -> None:
        self._f = open(path, "rb")  # noqa: SIM115  (closed by close, as open_file's are)
        self._reads = reads

    def read(self, n: int = -1) -> bytes:
        if self._reads == 0:
            raise OSError("disk gone")
        self._reads -= 1
        return self._f.read(n)

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> _FailsAfter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.mark.parametrize(("reads", "message"), [
    (0, "cannot read {uri} at byte 50: disk gone"),  # the footer, 9 bytes before the end
    (1, "cannot read the seek table of {uri}: disk gone"),
])
def test_a_read_of_the_seek_table_that_fails_is_a_transient_storage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: int, message: str) -> None:
    sf = write(tmp_path, "seek.jsonl.zst", ONE + TWO + seek_table([(12, 3), (14, 5)]))
    assert sf.size == 59
    monkeypatch.setattr(compressed, "open_file", lambda sf: _FailsAfter(sf.uri, reads))
    with pytest.raises(StorageError) as info:
        compressed.frame_index(sf)
    assert str(info.value) == message.format(uri=sf.uri)
    assert info.value.transient


# -- the index: restarts, chunks, memo ------------------------------------------------------------


def three_frames() -> compressed.FrameIndex:
    # frames at compressed 0, 100, 250 (decompressed 0, 1000, 3000) of a 400-byte file of 4000
    return compressed.FrameIndex.of([(0, 0), (100, 1000), (250, 3000)], 400, 4000)


def test_a_restart_is_at_the_start_of_the_frame_that_holds_the_byte() -> None:
    index = three_frames()
    assert [index.restart(p) for p in (-1, 0, 999, 1000, 2999, 3000, 10**9)] == [
        (0, 0), (0, 0), (0, 0), (100, 1000), (100, 1000), (250, 3000), (250, 3000)]


@pytest.mark.parametrize(("chunk_bytes", "bounds"), [
    (100, [0, 1000, 3000, 4000]),  # 100 -> frame 1, 200 -> frame 2, 300 -> none
    (99, [0, 1000, 3000, 4000]),   # 99 -> 1, 198 -> 2, 297 and 396 -> none
    (250, [0, 3000, 4000]),        # a frame starting at 250 starts the next chunk
    (251, [0, 4000]),              # no frame starts at or after 251
    (400, [0, 4000]),
])
def test_chunks_end_at_the_first_frame_at_or_after_each_multiple(chunk_bytes: int,
                                                                 bounds: list[int]) -> None:
    assert three_frames().boundaries(chunk_bytes) == bounds


def test_an_index_of_one_frame_or_no_known_size_is_one_chunk() -> None:
    assert compressed.FrameIndex.of([(0, 0)], 400, 4000).boundaries(10) == [0, 4000]
    assert compressed.FrameIndex.of([(0, 0)], 400, -1).boundaries(10) == [0, 0]
    assert compressed.FrameIndex.of([(0, 0), (9, 0)], 40, 0).boundaries(10) == [0, 0]
    assert compressed.FrameIndex.of([], 17, 0).boundaries(10) == [0, 0]


def test_an_index_as_an_array_and_back() -> None:
    rows = three_frames().to_array()
    assert rows.tolist() == [[0, 0], [100, 1000], [250, 3000], [400, 4000]]
    back = compressed.FrameIndex.from_array(rows)
    assert (back.coffsets.tolist(), back.doffsets.tolist(), back.csize, back.dsize) == (
        [0, 100, 250], [0, 1000, 3000], 400, 4000)


def test_known_index_is_what_this_process_indexed(tmp_path: Path) -> None:
    sf = write(tmp_path, "two.jsonl.zst", ONE + TWO)
    assert compressed.known_index(sf) is None  # small: never looked for on disk
    built = compressed.frame_index(sf)
    assert compressed.known_index(sf) is built
    assert compressed.frame_index(sf) is built
    compressed.clear_index_memo()
    assert compressed.known_index(sf) is None


def test_a_file_without_compression_has_no_frames_to_index(tmp_path: Path) -> None:
    sf = write(tmp_path, "plain.jsonl", b"{}\n")
    with pytest.raises(ValueError, match="no frames to index for compression None"):
        compressed.frame_index(sf)


class _NoSeek(io.BytesIO):
    def seek(self, pos: int, whence: int = 0) -> int:
        raise OSError("not seekable")


def test_a_stream_that_cannot_seek_to_its_frame_is_a_transient_storage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sf = write(tmp_path, "two.jsonl.zst", ONE + TWO)
    opened: list[_NoSeek] = []
    monkeypatch.setattr(compressed, "open_file", lambda sf: opened.append(_NoSeek()) or
                        opened[-1])
    with pytest.raises(StorageError) as info:
        compressed.open_stream(sf, "zstd", 12)
    assert str(info.value) == f"cannot seek {sf.uri} to byte 12: not seekable"
    assert info.value.transient and opened[0].closed
    with compressed.open_stream(sf, "zstd", 0) as f:  # offset 0: no seek
        assert f.read() == b""


def test_open_content_decompresses_what_the_plan_found_compressed(tmp_path: Path) -> None:
    zst = write(tmp_path, "two.jsonl.zst", ONE + TWO)
    with compressed.open_content(zst) as f:
        assert f.read() == b"ab\ncdef\n"
    plain = write(tmp_path, "two.jsonl", ONE + TWO)
    with compressed.open_content(plain) as f:
        assert f.read() == ONE + TWO


def test_a_member_scan_whose_read_fails_is_a_transient_storage_error(tmp_path: Path) -> None:
    """The scan for a second gzip member reads the file in windows; a read that fails (the
    storage, not the bytes) is a transient StorageError naming the file, for a retry."""
    sf = write(tmp_path, "a.jsonl.gz", gzip.compress(b'{"text": "a"}\n'))

    class Failing(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            raise OSError("connection reset")

    with pytest.raises(StorageError) as e:
        compressed._second_member_possible(Failing(b""), sf)
    assert e.value.transient
    assert str(e.value) == f"cannot read {sf.uri}: connection reset"
