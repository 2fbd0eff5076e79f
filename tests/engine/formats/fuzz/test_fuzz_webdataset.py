"""Fuzzing the WebDataset reader: a small tar (ustar headers, pax path/comment records, a
long name, samples of one to two members) mutated at its header fields (size, type, name,
checksum, each with the checksum made valid again or not; pax ``size`` records) and anywhere
by flips, cuts and overwritten runs. See harness.py for the outcomes allowed."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from tests.data.format_corpus import text_of
from tests.engine.formats.fuzz.harness import EDGES, Dataset, Site, fuzz
from tests.support.tarbytes import FIELDS, fix_checksum

pytestmark = pytest.mark.fuzz

CASES = 300
LONG = "d" * 120 + "/k3"


def _members() -> list[tuple[str, bytes, dict[str, str]]]:
    out: list[tuple[str, bytes, dict[str, str]]] = []
    for i in range(6):
        key = LONG if i == 3 else f"k{i}"
        pax = {"comment": "a pax record"} if i == 4 else {}
        out.append((f"{key}.txt", text_of("wds", i).encode(), pax))
        if i == 1:
            out.append((f"{key}.json", b'{"id": 1}', {}))
    return out


def _tar(members: list[tuple[str, bytes, dict[str, str]]]) -> tuple[bytes, list[int], int]:
    """The tar's bytes, each member's first header and the end-of-archive offset."""
    buf = io.BytesIO()
    starts = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, body, pax in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.pax_headers = dict(pax)
            starts.append(tf.offset)
            tf.addfile(info, io.BytesIO(body))
        end = tf.offset
    return buf.getvalue(), starts, end


def _header_sites(at: int) -> list[Site]:
    def setter(name: str) -> Any:
        lo, hi = FIELDS[name]

        def apply(data: bytes, value: tuple[bytes, bool]) -> bytes:
            out = bytearray(data)
            out[at + lo:at + hi] = value[0][:hi - lo].ljust(hi - lo, b"\0")
            if value[1]:
                fix_checksum(out, at)
            return bytes(out)
        return apply

    octal = st.sampled_from(EDGES).map(lambda n: (b"%011o" % n) if n >= 0 else b"-%o" % -n)
    sizes = (st.sampled_from([b"-0001000", b"77777777777", b"12abc", b"\xff" * 12, b" ", b"",
                              b"\x80" + (1 << 40).to_bytes(11, "big"),
                              b"\x80" + (3 << 30).to_bytes(11, "big")])
             | st.integers(0, 2048).map(lambda n: b"%011o" % n) | octal)
    names = st.sampled_from([b"k0.txt", b"noext", b"", b"k9.TXT", b"a/b/c.txt", b"k1.json",
                             b"\xff\xfe.txt", b"x" * 100])
    types = st.sampled_from([b"0", b"5", b"L", b"K", b"x", b"g", b"S", b"\0", b"1", b"7"])
    span = (at, at + 512)
    return [Site("t.tar", f"size of the header at {at}", span, st.tuples(sizes, st.booleans()),
                 setter("size")),
            Site("t.tar", f"name of the header at {at}", span, st.tuples(names, st.just(True)),
                 setter("name")),
            Site("t.tar", f"type of the header at {at}", span, st.tuples(types, st.just(True)),
                 setter("type")),
            Site("t.tar", f"checksum of the header at {at}", span,
                 st.tuples(st.binary(max_size=8) | octal, st.just(False)), setter("checksum"))]


def _pax_site(members: list[tuple[str, bytes, dict[str, str]]], k: int,
              span: tuple[int, int]) -> Site:
    def apply(_: bytes, record: tuple[str, str]) -> bytes:
        changed = list(members)
        name, body, pax = changed[k]
        changed[k] = (name, body, {**pax, record[0]: record[1]})
        return _tar(changed)[0]

    values = st.tuples(st.just("size"), st.sampled_from(
        ["-1536", "12abc", " 12", "0", "1" + "0" * 30, str(len(members[k][1]) - 1),
         str(len(members[k][1]) + 1), str(len(members[k][1]) + 512)])) | st.tuples(
        st.just("path"), st.sampled_from(["k0.txt", "", "noext", "k3.txt", "../x.txt"]))
    return Site("t.tar", f"a pax record of member {k}", span, values, apply)


def dataset() -> Dataset:
    members = _members()
    raw, starts, end = _tar(members)
    docs = [text_of("wds", i) for i in range(6)]
    sample_of = [0, 1, 1, 2, 3, 4, 5]  # member -> sample (k1 has two members)
    first = {}
    for m, s in enumerate(sample_of):
        first.setdefault(s, starts[m])
    bounds = [first[s] for s in range(6)] + [end]
    spans = [("t.tar", bounds[s], bounds[s + 1], s) for s in range(6)]
    sites: list[Site] = []
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        infos = tf.getmembers()
    for m, info in enumerate(infos):
        for at in sorted({info.offset, info.offset_data - 512}):
            sites += _header_sites(at)
            if m + 1 < len(infos):  # a header made a long name or pax header names the next
                spans.append(("t.tar", at, at + 512, sample_of[m + 1]))
        # a pax record rewrites the whole tar; the member's sample is the one it touches
        sites.append(_pax_site(members, m, (starts[m], starts[m] + 1)))
    return Dataset("webdataset", {"t.tar": raw}, "t.tar", {"text_field": "txt", "chunk_rows": 2},
                   docs, spans, sites)


def test_fuzz_webdataset(tmp_path: Path) -> None:
    fuzz(dataset(), tmp_path, CASES)
