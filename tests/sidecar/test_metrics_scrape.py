"""A Prometheus scrape survives a session closed in its rank worker.

With --rank-processes a session's gauges are a call into its rank worker, which
raises once the worker closed the session (a re-open replacing it) or died: one such session
must not fail the whole Prometheus scrape (in thread mode a closed Session still answers)."""

from __future__ import annotations

from typing import Any

from datalane_sidecar.metrics import Metrics
from prometheus_client import generate_latest

from datalane.spec.errors import StorageError


class _ClosedInItsWorker:
    is_eval = False

    def gauges(self) -> dict[str, Any]:
        raise StorageError("session 0123 is closed in its rank worker", transient=True)

    @property
    def plan(self) -> Any:
        raise AssertionError("a session that did not answer is not read further")


def test_a_scrape_survives_a_session_closed_in_its_rank_worker() -> None:
    metrics = Metrics()
    metrics.sessions = lambda: [_ClosedInItsWorker()]
    text = generate_latest(metrics.registry).decode()
    assert "datalane_" in text
