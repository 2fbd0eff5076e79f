"""Fuzzing the Lance reader: a dataset of three fragments, its data files and manifest
mutated by flips, cuts and overwritten runs, each case read in a worker process (pylance is
native code: a crash or an abort must fail this test, not end the test run). Lance's own
metadata is read by pylance alone, so a case may read other documents without any error
(``changed``, counted, not failed); every error must still be a DataError or ConfigError
naming the dataset, and no case may hang. A case that kills the reading process is counted
``crashed`` and printed, not failed: pylance aborts the process on some corrupt data files
(``memory allocation of 54539440144 bytes failed``, an allocation a corrupt page header
claims), which no caller can catch (docs/architecture.md). See harness.py."""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.data.format_corpus import text_of
from tests.engine.formats.fuzz.harness import FUZZ, Dataset, Mutation, check, mutations

pytestmark = pytest.mark.fuzz

CASES = 100
DOCS = [text_of("lance", i) for i in range(12)]


def _dataset(files: dict[str, bytes]) -> Dataset:
    return Dataset("lance", files, "t.lance", {}, DOCS, [])


def _case(files: dict[str, bytes], m: Mutation | None, scratch: str) -> str:
    """One case, in the worker process."""
    os.environ["LANCE_LOG"] = "error"  # not a warning per undecodable transaction
    return check(_dataset(files), m, Path(scratch), seconds=60, strict=False)


def _known_abort(files: dict[str, bytes]) -> Mutation:
    """The mutation the fuzzer found that makes pylance abort the process: 5 bytes at 720 of
    the largest data file (its page metadata), after which it allocates 54 GB and aborts."""
    name = max((n for n in files if "/data/" in n), key=lambda n: len(files[n]))
    raw = files[name]
    return Mutation(name, 720, 725, raw[:720] + b"\xdd,\xcb\xcb\xb6" + raw[725:],
                    "bytes 720-725 set to b'\\xdd,\\xcb\\xcb\\xb6'")


def test_fuzz_lance(tmp_path: Path) -> None:
    lance = pytest.importorskip("lance")
    import pyarrow as pa

    base = tmp_path / "base" / "t.lance"
    lance.write_dataset(pa.table({"text": DOCS}), str(base), max_rows_per_file=4)
    files = {f"t.lance/{p.relative_to(base)}": p.read_bytes() for p in sorted(base.rglob("*"))
             if p.is_file() and p.parent.name != "_transactions"}
    ds = _dataset(files)
    scratch = tmp_path / "cases"
    scratch.mkdir()
    outcomes: Counter[str] = Counter()
    crashes: list[str] = []
    spawn = multiprocessing.get_context("spawn")
    pools = [ProcessPoolExecutor(1, mp_context=spawn)]
    try:
        assert pools[-1].submit(_case, files, None, str(scratch)).result(120) == "exact"

        def run(m: Mutation) -> None:
            try:
                outcomes[pools[-1].submit(_case, files, m, str(scratch)).result(90)] += 1
            except BrokenProcessPool:  # pylance aborted the worker: a new one for the next
                outcomes["crashed"] += 1
                crashes.append(f"{m.what} in {m.file}")
                pools[-1].shutdown()
                pools.append(ProcessPoolExecutor(1, mp_context=spawn))

        run(_known_abort(files))

        @settings(FUZZ, max_examples=CASES)
        @given(st.data())
        def case(data: st.DataObject) -> None:
            run(data.draw(mutations(ds)))

        case()
    finally:
        pools[-1].shutdown(cancel_futures=True)
    print(f"lance fuzz: {sum(outcomes.values())} datasets, {dict(outcomes)}; the reading "
          f"process died on: {crashes}")
    assert outcomes["error"] and outcomes["exact"]
