"""Hostile tars: header fields that would send the header walk backwards or nowhere, pax
records that are no numbers, members that claim gigabytes. Each stops with a DataError naming
the file, the header's byte offset and the field, or is a counted ``too_large`` record that
is never read, and quickly (every read here runs under a wall bound)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

from datalane import DataError
from datalane.engine.plan import Plan
from datalane.spec.limits import MAX_RECORD_BYTES
from tests.data.format_corpus import text_of
from tests.support.common import bounded, drain, expected, fail_message, one_lane
from tests.support.tarbytes import set_field, write_tar

GOOD = [text_of("wds", i) for i in range(3)]


def _plan_error(path: Path) -> str:
    with pytest.raises(DataError) as info:
        bounded(lambda: Plan.build(one_lane([str(path)], text_field="txt")), 20)
    return str(info.value)


def test_a_negative_octal_size_stops_the_walk_naming_the_header(tmp_path: Path) -> None:
    # '-0001000' is -512 in octal: the walk's next header was the same header, forever
    path = tmp_path / "neg.tar"
    at = write_tar(path, [(f"k{i}.txt", t.encode()) for i, t in enumerate(GOOD)])
    raw = bytearray(path.read_bytes())
    set_field(raw, at["k1.txt"], "size", b"-0001000")
    path.write_bytes(bytes(raw))
    message = _plan_error(path)
    assert f"{path}: no valid tar header at byte {at['k1.txt']}" in message
    assert "size field b'-0001000" in message and "no non-negative octal number" in message


def test_a_negative_base256_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b256.tar"
    at = write_tar(path, [(f"k{i}.txt", t.encode()) for i, t in enumerate(GOOD)])
    raw = bytearray(path.read_bytes())
    set_field(raw, at["k2.txt"], "size", b"\xff" * 12)  # GNU base-256 for -1
    path.write_bytes(bytes(raw))
    message = _plan_error(path)
    assert f"no valid tar header at byte {at['k2.txt']}" in message and "size field" in message


@pytest.mark.parametrize(("value", "why"), [
    ("-1536", "which is no non-negative decimal number"),
    ("12abc", "which is no non-negative decimal number"),
    (" 12", "which is no non-negative decimal number"),
])
def test_a_pax_size_that_is_no_byte_count_names_the_pax_header(tmp_path: Path, value: str,
                                                               why: str) -> None:
    path = tmp_path / "pax.tar"
    at = write_tar(path, [(f"k{i}.txt", t.encode()) for i, t in enumerate(GOOD)],
                   fmt=tarfile.PAX_FORMAT, pax={"k1.txt": {"size": value}})
    message = _plan_error(path)
    assert f"{path}: the pax header at byte {at['k1.txt']} has the size field {value!r}" in \
        message and why in message


def test_a_malformed_pax_record_names_the_pax_header(tmp_path: Path) -> None:
    path = tmp_path / "pax.tar"
    at = write_tar(path, [(f"k{i}.txt", t.encode()) for i, t in enumerate(GOOD)],
                   fmt=tarfile.PAX_FORMAT, pax={"k1.txt": {"comment": "x"}})
    raw = bytearray(path.read_bytes())
    record = raw.find(b"comment=x\n")
    assert record > 0
    raw[record - 3:record - 1] = b"99"  # the record's length runs past the pax data
    path.write_bytes(bytes(raw))
    message = _plan_error(path)
    assert f"{path}: the pax header at byte {at['k1.txt']} holds a malformed record" in message


def _sparse_tar(path: Path, claimed: int) -> dict[str, int]:
    """k0.txt, k1.txt claiming ``claimed`` bytes (a hole in the file), k2.txt."""
    at: dict[str, int] = {}
    with open(path, "wb") as f:
        for i, text in enumerate(GOOD):
            info = tarfile.TarInfo(f"k{i}.txt")
            body = text.encode()
            info.size = claimed if i == 1 else len(body)
            at[info.name] = f.tell()
            f.write(info.tobuf(tarfile.GNU_FORMAT))
            if i == 1:
                f.seek(-(-claimed // 512) * 512, 1)  # a hole: no disk, no bytes written
            else:
                f.write(body.ljust(-(-len(body) // 512) * 512, b"\0"))
        f.write(b"\0" * 1024)
    assert path.stat().st_size > claimed
    return at


def test_a_member_over_the_record_bound_is_a_counted_record_never_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.tar"
    at = _sparse_tar(path, 3 << 30)  # 3 GiB of hole: reading it would take 3 GiB of memory
    tokens, counters = bounded(lambda: drain(one_lane([str(path)], text_field="txt")), 60)
    np.testing.assert_array_equal(tokens, expected([GOOD[0], GOOD[2]]))
    assert counters.skipped == {"too_large": 1}
    message = fail_message([str(path)], text_field="txt")
    assert f"{path} at byte {at['k1.txt']}" in message
    assert f"its .txt member holds {3 << 30} bytes, more than the {MAX_RECORD_BYTES}" in message


def test_a_member_at_the_record_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bound.tar"
    at = _sparse_tar(path, MAX_RECORD_BYTES + 1)
    source = Plan.build(one_lane([str(path)], text_field="txt")).sources[0]
    from datalane.engine.formats import FORMATS

    wds = FORMATS["webdataset"]
    raws = dict(wds.reader(source.files, "txt").records(source.chunks[0]))
    assert raws[at["k1.txt"]].oversize == MAX_RECORD_BYTES + 1
    assert wds.decode(raws[at["k1.txt"]], "txt")[1] == "too_large"
    # one byte less is a record like any other (its bytes are the hole's zeros)
    path.unlink()
    at = _sparse_tar(path, MAX_RECORD_BYTES)
    source = Plan.build(one_lane([str(path)], text_field="txt")).sources[0]
    raws = dict(wds.reader(source.files, "txt").records(source.chunks[0]))
    assert raws[at["k1.txt"]].data == bytes(MAX_RECORD_BYTES)


def test_an_extended_header_over_the_bound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "longname.tar"
    at: dict[str, int] = {}
    with open(path, "wb") as f:
        info = tarfile.TarInfo("././@LongLink")
        info.type = tarfile.GNUTYPE_LONGNAME
        info.size = MAX_RECORD_BYTES + 1
        at["name"] = f.tell()
        f.write(info.tobuf(tarfile.GNU_FORMAT))
        f.seek(-(-info.size // 512) * 512, 1)
        member = tarfile.TarInfo("k0.txt")
        member.size = 0
        f.write(member.tobuf(tarfile.GNU_FORMAT) + b"\0" * 1024)
    message = _plan_error(path)
    assert f"{path}: the extended header at byte {at['name']} claims {MAX_RECORD_BYTES + 1}" \
        in message
