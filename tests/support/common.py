"""What the hostile-input tests of the container formats share: a wall bound on a read (a
hang fails the test instead of stalling it), and (from
tests/engine/formats/test_formats_more.py) one-lane recipes read in file order and the tokens
the documents they keep must give."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from datalane import DataError
from tests.engine.formats.test_formats_more import _expected as expected
from tests.engine.formats.test_formats_more import _one_lane as one_lane
from tests.engine.test_bad_inputs import drain

__all__ = ["bounded", "drain", "expected", "fail_message", "one_lane"]

T = TypeVar("T")


def bounded(fn: Callable[[], T], seconds: float) -> T:
    """``fn()``, run on a daemon thread; AssertionError if it takes more than ``seconds`` (a
    walk that never ends keeps spinning there, but the test fails instead of hanging)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # handed to the caller as it is
            out.append(("raised", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AssertionError(f"the read did not end within {seconds} s (a walk that makes no "
                             f"progress?)")
    kind, value = out[0]
    if kind == "raised":
        raise value
    return value  # type: ignore[no-any-return]


def fail_message(uris: list[str], seconds: float = 60, **source: Any) -> str:
    """The DataError a one-lane ``bad_records: fail`` read of ``uris`` stops with."""
    with pytest.raises(DataError) as info:
        bounded(lambda: drain(one_lane(uris, bad_records="fail", **source)), seconds)
    return str(info.value)
