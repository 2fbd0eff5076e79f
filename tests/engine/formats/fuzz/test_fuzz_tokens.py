"""Token file readers (Megatron ``.idx``/``.bin``, flat token files with a boundary id or an
offsets file) against mutated files (tests/engine/formats/fuzz/stream_harness.py).

Token files carry no checksum: a flipped bit in a token id is another valid file. Each case is
planned on the mutated files and compared with what a reference written here from the layouts
alone reads from the same bytes - the Megatron index as its specification gives it (header,
sequence lengths and pointers, document indices: a document is its sequences' tokens, each
read at its pointer), the flat file split after each boundary id, the offsets file loaded with
``np.load`` and checked to run from 0 to the token count without decreasing. The reference
refusing the bytes (a field out of range, a sequence outside the ``.bin``) means datalane must
raise a DataError (or ConfigError) naming the file; datalane may refuse more (it reads only
sequences stored back to back, as megatron-core writes them). Most mutations hit the index
fields: the version, token type, counts, each length, pointer and document index, and the
``.npy`` header and offsets.
"""

from __future__ import annotations

import io
import itertools
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datalane.engine.formats.flatbin import write_flat
from datalane.engine.formats.megatron import MAGIC, write_dataset
from tests.engine.formats.fuzz.stream_harness import (
    Field,
    Outcomes,
    check_case,
    fuzzing,
    mutate,
    mutations,
    read_source,
    small_bound,
    workdir,
)

pytestmark = pytest.mark.fuzz

EXAMPLES = 100
BOUNDARY = 1
#: the bound on a document's bytes, per layout: document 6 has 20 tokens, over it; the others
#: at most 9 (18 bytes of uint16, 36 of uint32), and two joined by a mutation mostly over it
BOUND = {"megatron": 20, "flatbin": 20, "flatbin-offsets": 38}
LIMIT = [0]  # the bound of the layout under test
DTYPES = {1: "<u1", 2: "<i1", 3: "<i2", 4: "<i4", 5: "<i8", 8: "<u2"}


def docs() -> list[list[int]]:
    rng = np.random.default_rng(5)
    out = [[*rng.integers(2, 900, size=int(rng.integers(0, 9))).tolist(), BOUNDARY]
           for _ in range(12)]
    out[6] = [*range(100, 119), BOUNDARY]  # over the bound: too_large in every reading
    return out


def megatron_files(d: Path) -> tuple[dict[str, bytes], dict[str, list[Field]]]:
    write_dataset(str(d / "m"), docs(), "uint16")
    idx, bin_ = (d / "m.idx").read_bytes(), (d / "m.bin").read_bytes()
    s = n = len(docs())
    fields = [Field(9, 8), Field(17, 1), Field(18, 8), Field(26, 8)]
    fields += [Field(34 + 4 * i, 4) for i in range(s)]
    fields += [Field(34 + 4 * s + 8 * i, 8) for i in range(s)]
    fields += [Field(34 + 12 * s + 8 * i, 8) for i in range(n + 1)]
    return {"m.idx": idx, "m.bin": bin_}, {"m.idx": fields, "m.bin": []}


def doc(d: int, tokens: list[int], itemsize: int) -> tuple[int, int, Any, str | None]:
    """A document as the reference reads it: its tokens, or too large for the bound."""
    if len(tokens) * itemsize > LIMIT[0]:
        return (0, d, None, "too_large")
    return (0, d, tokens, None)


def ref_megatron(files: dict[str, bytes]) -> list[Any] | None:
    idx, bin_ = files["m.idx"], files["m.bin"]
    if len(idx) < 34 or idx[:9] != MAGIC:
        return None
    version, code, seqs, ndocs = struct.unpack("<QBQQ", idx[9:34])
    if version != 1 or code not in DTYPES or ndocs < 1 or len(idx) < 34 + 12 * seqs + 8 * ndocs:
        return None
    dtype = np.dtype(DTYPES[code])
    if len(bin_) % dtype.itemsize:
        return None
    lengths = np.frombuffer(idx, "<i4", seqs, 34).tolist()
    pointers = np.frombuffer(idx, "<i8", seqs, 34 + 4 * seqs).tolist()
    index = np.frombuffer(idx, "<i8", ndocs, 34 + 12 * seqs).tolist()
    if index[0] != 0 or index[-1] != seqs:
        return None
    out = []
    for d in range(ndocs - 1):
        a, b = index[d], index[d + 1]
        if not 0 <= a <= b <= seqs:
            return None
        tokens: list[int] = []
        for s in range(a, b):
            lo, n = pointers[s], lengths[s]
            if n < 0 or lo < 0 or lo % dtype.itemsize or lo + n * dtype.itemsize > len(bin_):
                return None
            tokens += np.frombuffer(bin_, dtype, n, lo).tolist()
        out.append(doc(d, tokens, dtype.itemsize))
    return out


def flat_files(d: Path) -> tuple[dict[str, bytes], dict[str, list[Field]]]:
    write_flat(str(d / "f.u16"), docs(), "uint16")
    data = (d / "f.u16").read_bytes()
    ends = np.flatnonzero(np.frombuffer(data, "<u2") == BOUNDARY).tolist()
    return {"f.u16": data}, {"f.u16": [Field(2 * i, 2) for i in ends]}  # the boundary ids


def ref_flat(files: dict[str, bytes]) -> list[Any] | None:
    data = files["f.u16"]
    if len(data) % 2:
        return None
    ids = np.frombuffer(data, "<u2").tolist()
    out, start = [], 0
    for i, t in enumerate(ids):
        if t == BOUNDARY:
            out.append(doc(start, ids[start:i + 1], 2))
            start = i + 1
    if start < len(ids):
        out.append(doc(start, ids[start:], 2))
    return out


def offsets_files(d: Path) -> tuple[dict[str, bytes], dict[str, list[Field]]]:
    write_flat(str(d / "o.bin"), docs(), "uint32", offsets=True)
    npy = (d / "o.offsets.npy").read_bytes()
    head = 10 + int.from_bytes(npy[8:10], "little")
    fields = [Field(i, 1) for i in range(6, head)]  # version, header length, the header text
    fields += [Field(i, 8) for i in range(head, len(npy) - 7, 8)]
    return ({"o.bin": (d / "o.bin").read_bytes(), "o.offsets.npy": npy},
            {"o.bin": [], "o.offsets.npy": fields})


def ref_offsets(files: dict[str, bytes]) -> list[Any] | None:
    data = files["o.bin"]
    try:
        offs = np.load(io.BytesIO(files["o.offsets.npy"]), allow_pickle=False)
    except Exception:
        return None
    if len(data) % 4 or offs.ndim != 1 or offs.dtype.kind not in "iu" or len(offs) < 1:
        return None
    offsets = [int(o) for o in offs]
    ids = np.frombuffer(data, "<u4").tolist()
    if offsets[0] != 0 or offsets[-1] != len(ids) or any(
            b < a for a, b in itertools.pairwise(offsets)):
        return None
    return [doc(k, ids[a:b], 4) for k, (a, b) in enumerate(itertools.pairwise(offsets))]


LAYOUTS = {
    "megatron": (megatron_files, ref_megatron, "m.idx", {"tokens": {}, "chunk_rows": 3}),
    "flatbin": (flat_files, ref_flat, "f.u16",
                {"tokens": {"boundary": BOUNDARY}, "chunk_bytes": 16}),
    "flatbin-offsets": (offsets_files, ref_offsets, "o.bin",
                        {"format": "flatbin", "tokens": {"dtype": "uint32"}, "chunk_rows": 4}),
}
OUTCOMES = {name: Outcomes(f"tokens {name}") for name in LAYOUTS}



@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mutated_token_files_read_as_their_layout_says_or_fail_naming_the_file(
        layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make, reference, named, source = LAYOUTS[layout]
    small_bound(monkeypatch, BOUND[layout])
    LIMIT[0] = BOUND[layout]
    with workdir() as d:
        (d / "clean").mkdir()
        files, fields = make(d / "clean")
        original = read_source({"uris": [str(d / "clean" / named)], **source})
        assert original == reference(files) and len(original) == 12
        assert [r for r in original if r[-1] is not None] == [
            (0, original[6][1], None, "too_large")]
        names = sorted(files)
        pick = st.one_of(*(st.tuples(st.just(n), mutations(len(files[n]), fields[n]))
                           for n in names))
        counter = iter(range(1 << 30))

        @fuzzing(EXAMPLES)
        @given(which=pick)
        def case(which: tuple[str, tuple[Any, ...]]) -> None:
            name, how = which
            bad = dict(files)
            bad[name] = mutate(files[name], how)
            case_dir = d / f"case{next(counter)}"  # fresh names: no index of another case
            case_dir.mkdir()
            for n, data in bad.items():
                (case_dir / n).write_bytes(data)
            check_case(OUTCOMES[layout], [str(case_dir / n) for n in names],
                       lambda: read_source({"uris": [str(case_dir / named)], **source}),
                       lambda: reference(bad), original, f"{layout} {name} {how}")

        case()
