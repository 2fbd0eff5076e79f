"""How many long calls the sidecar serves at once (sidecar/datalane_sidecar/admission.py),
without a server: the limits, the pool size and the refusal, by hand."""

from __future__ import annotations

import grpc
import pytest
from datalane_sidecar.admission import RESERVE, Admission, default_max_streams


class Aborted(Exception):
    pass


class Context:
    """What ``hold`` uses of a ServicerContext: abort, which (like grpc's) raises."""

    def __init__(self) -> None:
        self.aborts: list[tuple[grpc.StatusCode, str]] = []

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborts.append((code, details))
        raise Aborted(details)


@pytest.mark.parametrize(("ranks", "evals", "expected"), [
    (1, 0, 256),  # the floor
    (32, 0, 256),  # 32 x 8 readers: the floor exactly
    (33, 0, 264),  # 33 x 8
    (10, 3, 320),  # 10 x 8 x (1 training + 3 eval streams)
])
def test_the_default_limit_is_every_reader_on_every_stream_at_least_256(
        ranks: int, evals: int, expected: int) -> None:
    """ranks x 8 readers x (1 + eval streams), and never under 256."""
    assert default_max_streams(ranks, evals) == expected


def test_the_pool_has_a_thread_per_admitted_call_of_each_kind_and_the_reserve() -> None:
    """3 kinds (stream, checkpoint, open) x max_streams + 32 reserved for the short calls."""
    assert RESERVE == 32
    assert Admission(10).pool_size() == 62
    assert Admission(1).pool_size() == 35


def test_a_limit_under_one_is_refused() -> None:
    """At least one call of each kind must be admitted; 1 is the smallest limit."""
    with pytest.raises(ValueError, match=r"^max_streams must be at least 1, not 0$"):
        Admission(0)
    assert Admission(1).max_streams == 1


def test_calls_up_to_the_limit_are_admitted_and_counted_until_they_end() -> None:
    """Two streams under a limit of 2 are both in flight; each end frees its place, an
    exception included."""
    a, ctx = Admission(2), Context()
    with a.hold("stream", ctx):  # type: ignore[arg-type]
        with a.hold("stream", ctx):  # type: ignore[arg-type]
            assert a.active == {"stream": 2, "checkpoint": 0, "open": 0}
        assert a.active["stream"] == 1
    with pytest.raises(RuntimeError), a.hold("stream", ctx):  # type: ignore[arg-type]
        raise RuntimeError
    assert a.active["stream"] == 0 and ctx.aborts == [] and a.refused["stream"] == 0


def test_a_call_past_the_limit_is_refused_at_once_naming_the_limit_and_flag() -> None:
    """The third stream under a limit of 2 is aborted with RESOURCE_EXHAUSTED (the body never
    runs), counted as refused, and leaves the two in flight counted; another kind still gets
    in."""
    a, ctx = Admission(2, "--max-x"), Context()
    ran = []
    with a.hold("stream", ctx), a.hold("stream", ctx):  # type: ignore[arg-type]
        with pytest.raises(Aborted), a.hold("stream", ctx):  # type: ignore[arg-type]
            ran.append(1)
        assert ctx.aborts == [(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               "this sidecar serves at most 2 stream calls at once and 2 are "
                               "in flight (the limit --max-x=2, env DATALANE_MAX_STREAMS: "
                               "raise it for a pod with more trainer processes x eval "
                               "streams)")]
        assert ran == [] and a.refused == {"stream": 1, "checkpoint": 0, "open": 0}
        assert a.active["stream"] == 2
        with a.hold("checkpoint", ctx):  # type: ignore[arg-type]
            assert a.active == {"stream": 2, "checkpoint": 1, "open": 0}
    assert a.active == {"stream": 0, "checkpoint": 0, "open": 0}
