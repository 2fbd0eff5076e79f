"""The fuzzing harness of the container formats: mutate a small valid dataset, read it end to
end (the plan, then every chunk through the source's record reader and its format's decode),
and check the outcome is one the reader contract allows.

A case is one mutation of one file of the dataset: a bit flip, a truncation, a run of bytes
overwritten, or a header field (a size, a count, an offset, a JSON value) set to a negative,
huge, off-by-a-little or garbage value, by the format's own :class:`Site` s. The outcome must
be exactly one of:

* ``error``: a DataError or ConfigError naming the dataset's directory or file;
* ``exact``: the original documents, nothing counted;
* ``bad``: bad records counted (reasons of the format's ``bad_reasons``), every document whose
  bytes the mutation did not touch still there, unchanged;
* ``changed``: the mutation touched a document's own bytes (its payload, its member's header)
  and the file is still well-formed, so only that document may differ (these formats carry no
  checksum of a document's bytes: no reader can tell).

Never a hang (each read runs under a wall bound), never another exception type, never a
document the mutation did not touch changed or lost without a count.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datalane import ConfigError, DataError
from datalane.engine.chunks import RecordReader
from datalane.engine.formats import format_for
from datalane.engine.formats.base import TooLarge
from datalane.engine.plan import Plan
from datalane.spec.limits import TOO_LARGE
from tests.support.common import bounded, one_lane

__all__ = ["FUZZ", "Dataset", "Mutation", "Site", "check", "fuzz", "mutations", "read_documents"]

#: the fuzzers' settings: derandomized (the same cases on every run), no example database,
#: a fixed number of cases per format (each test passes its own max_examples)
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

#: integers a header field is set to: signs, widths' edges, zero
EDGES = (0, 1, -1, -2, -512, -(1 << 31), (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32,
         1 << 40, (1 << 63) - 1, -(1 << 63))


@dataclass(frozen=True)
class Site:
    """A field of one file: ``apply(raw, value)`` is the file with the field set to ``value``,
    ``values`` the strategy of values, ``span`` the bytes it covers (for touched documents)."""

    file: str
    name: str
    span: tuple[int, int]
    values: st.SearchStrategy[Any]
    apply: Callable[[bytes, Any], bytes]


@dataclass(frozen=True)
class Dataset:
    """A small valid dataset: its files (relative path -> bytes), what the source names
    (relative to the dataset's directory; "" for the directory), the source's settings, its
    documents in file order, and which bytes each document owns."""

    fmt: str
    files: dict[str, bytes] = field(repr=False)
    uri: str
    source: dict[str, Any]
    docs: list[str]
    spans: list[tuple[str, int, int, int]]  # (file, lo, hi, document index)
    sites: list[Site] = field(default_factory=list, repr=False)

    def touched(self, m: Mutation) -> set[int]:
        return {doc for f, lo, hi, doc in self.spans if f == m.file and lo < m.hi and m.lo < hi}


@dataclass(frozen=True)
class Mutation:
    file: str
    lo: int  # the bytes changed, [lo, hi) of the original file
    hi: int
    data: bytes = field(repr=False)  # the new content of the file
    what: str = ""


def _flip(raw: bytes, i: int, bit: int) -> bytes:
    out = bytearray(raw)
    out[i] ^= 1 << bit
    return bytes(out)


@st.composite
def mutations(draw: st.DrawFn, ds: Dataset, files: list[str] | None = None) -> Mutation:
    """One mutation of ``ds``: mostly its header fields (``ds.sites``), else flips, cuts and
    overwritten runs anywhere in ``files`` (default: every file)."""
    kinds = ["site", "site", "site", "flip", "truncate", "overwrite"] if ds.sites else \
        ["flip", "truncate", "overwrite"]
    kind = draw(st.sampled_from(kinds))
    if kind == "site":
        site = draw(st.sampled_from(ds.sites))
        value = draw(site.values)
        raw = ds.files[site.file]
        return Mutation(site.file, *site.span, site.apply(raw, value), f"{site.name} = {value!r}")
    name = draw(st.sampled_from(files or sorted(ds.files)))
    raw = ds.files[name]
    if kind == "flip":
        i = draw(st.integers(0, len(raw) - 1))
        bit = draw(st.integers(0, 7))
        return Mutation(name, i, i + 1, _flip(raw, i, bit), f"bit {bit} of byte {i} flipped")
    if kind == "truncate":
        n = draw(st.integers(0, len(raw) - 1))
        return Mutation(name, n, len(raw), raw[:n], f"cut to {n} bytes")
    i = draw(st.integers(0, len(raw) - 1))
    run = draw(st.sampled_from([b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff", b"-1",
                                b"\x80\x00\x00\x00\x00\x00\x00\x00"])
               | st.binary(min_size=1, max_size=8))
    run = run[:len(raw) - i]
    return Mutation(name, i, i + len(run), raw[:i] + run + raw[i + len(run):],
                    f"bytes {i}-{i + len(run)} set to {run!r}")


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else repr(value)


def read_documents(uri: str, source: dict[str, Any]) -> tuple[list[str], Counter[str]]:
    """Every document of the one source reading ``uri``, in file order, and the bad records
    counted by reason: the plan, each chunk read by the record reader, each record decoded."""
    plan = Plan.build(one_lane([uri], **source))
    sp = plan.sources[0]
    reader = RecordReader(sp.files, sp.source.field, sp.source)
    docs: list[str] = []
    bad: Counter[str] = Counter()
    try:
        for chunk in sp.chunks:
            fmt = format_for(sp.files[chunk.file].format, sp.source)
            for _, raw in reader.records(chunk):
                value, reason, _ = ((None, TOO_LARGE, "") if isinstance(raw, TooLarge) else
                                    fmt.decode(raw, sp.source.field))  # as the map stage does
                if reason is None:
                    docs.append(_text(value))
                else:
                    assert reason in fmt.bad_reasons, f"{reason!r} is no bad-record reason"
                    bad[reason] += 1
    finally:
        reader.close()
    return docs, bad


def _write(ds: Dataset, m: Mutation | None, root: Path) -> None:
    for name, raw in ds.files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(m.data if m is not None and name == m.file else raw)


def check(ds: Dataset, m: Mutation | None, scratch: Path, seconds: float = 20,
          outcomes: Counter[str] | None = None,
          read: Callable[[str, dict[str, Any]], tuple[list[str], Counter[str]]] | None = None,
          strict: bool = True) -> str:
    """Write ``ds`` with ``m`` applied under a fresh directory of ``scratch``, read it, and
    return the outcome (``error``, ``exact``, ``bad``, ``changed``); AssertionError when the
    outcome breaks the contract. ``strict=False`` (Lance, whose metadata only pylance reads)
    allows changed documents anywhere, and counts them."""
    root = Path(tempfile.mkdtemp(dir=scratch))
    try:
        _write(ds, m, root)
        uri = str(root / ds.uri) if ds.uri else str(root)
        what = m.what if m is not None else "no mutation"
        try:
            docs, bad = bounded(lambda: (read or read_documents)(uri, ds.source), seconds)
        except (DataError, ConfigError) as e:
            assert str(root) in str(e), f"{what}: the error does not name the dataset: {e}"
            outcome = "error"
        except AssertionError as e:
            raise AssertionError(f"{what}: {e}") from e
        except BaseException as e:
            raise AssertionError(f"{what}: {type(e).__name__} is no datalane error: {e}") from e
        else:
            outcome = _judge(ds, m, docs, bad, strict)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if outcomes is not None:
        outcomes[outcome] += 1
    return outcome


def _judge(ds: Dataset, m: Mutation | None, docs: list[str], bad: Counter[str],
           strict: bool) -> str:
    extra = Counter(docs) - Counter(ds.docs)
    missing = Counter(ds.docs) - Counter(docs)
    n_bad = sum(bad.values())
    if not extra and not missing and not n_bad:
        return "exact"
    what = m.what if m is not None else "no mutation"
    touched = ds.touched(m) if m is not None else set()
    if not strict:
        return "changed" if extra or len(docs) + n_bad != len(ds.docs) else "bad"
    assert sum(extra.values()) <= len(touched), (
        f"{what}: documents that are no original one ({list(extra)[:3]}), with "
        f"{len(touched)} touched documents")
    lost = sum(n for doc, n in missing.items() if ds.docs.index(doc) not in touched)
    assert lost <= n_bad, (f"{what}: {lost} untouched documents lost, {n_bad} bad records "
                           f"counted ({dict(bad)})")
    return "changed" if extra or (missing and not n_bad) else "bad"


def fuzz(ds: Dataset, scratch: Path, cases: int,
         reach: tuple[str, ...] = ("error", "exact", "bad"), **kw: Any) -> Counter[str]:
    """Check ``cases`` mutations of ``ds`` (the unmutated dataset first, which must read
    exactly); the outcomes counted, printed, and each outcome of ``reach`` reached."""
    assert check(ds, None, scratch, **kw) == "exact"
    outcomes: Counter[str] = Counter()

    @settings(FUZZ, max_examples=cases)
    @given(st.data())
    def case(data: st.DataObject) -> None:
        check(ds, data.draw(mutations(ds)), scratch, outcomes=outcomes, **kw)

    case()
    print(f"{ds.fmt} fuzz: {sum(outcomes.values())} files, {dict(outcomes)}")
    assert all(outcomes[o] for o in reach), dict(outcomes)
    return outcomes
