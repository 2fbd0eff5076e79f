"""Prints each fuzzer's outcome counts (files fuzzed, errors, bad records, exact, changed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.formats.fuzz.stream_harness import ALL


@pytest.fixture(scope="session", autouse=True)
def _report_outcomes() -> Iterator[None]:
    yield
    for outcomes in ALL:
        if outcomes.counts:
            print("\n" + outcomes.report(), end="")
