"""Latency samples and their percentiles (what ``/healthz`` reports), and the timed review.

:class:`Latencies` keeps the newest samples of admission reviews and reconciles (kept by the
runtime, reported by the kopf probes in :mod:`datalane_operator.handlers`); :func:`timed`
wraps kopf's webhook function (:class:`~datalane_operator.webhooks.TimedWebhookServer`) to
time each review with an injected clock and report it with its verdict.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable
from typing import Any

from datalane_operator.metrics import Verdict

__all__ = ["Latencies", "timed", "verdict_of"]


class Latencies:
    """The newest ``keep`` durations in milliseconds."""

    def __init__(self, keep: int = 10000) -> None:
        self.ms: collections.deque[float] = collections.deque(maxlen=keep)

    def add(self, seconds: float) -> None:
        self.ms.append(seconds * 1000)

    def __len__(self) -> int:
        return len(self.ms)

    def summary(self, recent: int = 200) -> dict[str, Any]:
        """Latency summary of all kept samples and of the ``recent`` newest ones."""
        def summary(xs: list[float]) -> dict[str, float]:
            if len(xs) < 2:
                return {"count": len(xs)}
            q = statistics.quantiles(xs, n=100, method="inclusive")
            return {"count": len(xs), "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2),
                    "max_ms": round(max(xs), 2)}

        values = list(self.ms)
        out: dict[str, Any] = summary(values)
        out["count"] = len(values)
        out["recent"] = summary(values[-recent:])
        return out


def verdict_of(response: Any) -> Verdict:
    """``allowed`` or ``denied``, from an AdmissionReview response."""
    answer = response.get("response") if isinstance(response, dict) else None
    allowed = isinstance(answer, dict) and answer.get("allowed")
    return Verdict.ALLOWED if allowed else Verdict.DENIED


Record = Callable[[str, float, Verdict], None]  # (webhook, seconds, verdict)


def timed(fn: Any, clock: Callable[[], float], record: Record) -> Any:
    """Wrap kopf's webhook function: time every review, fill in the object's namespace.

    The API server puts the request's namespace in ``request.namespace``; an object created
    without one in its manifest arrives without ``metadata.namespace``, and kopf hands the
    handlers only the object. ``record(webhook, seconds, verdict)`` follows every review;
    the verdict is ``allowed``, ``denied`` or ``error`` (kopf's function raised).
    """
    async def review(request: Any, *, webhook: str | None = None,
                     headers: dict[str, str] | None = None,
                     sslpeer: dict[str, Any] | None = None) -> Any:
        t0 = clock()
        verdict = Verdict.ERROR
        try:
            payload = request.get("request") or {}
            ns = payload.get("namespace")
            for key in ("object", "oldObject"):
                obj = payload.get(key)
                if ns and isinstance(obj, dict):
                    meta = obj.setdefault("metadata", {})
                    if not meta.get("namespace"):
                        meta["namespace"] = ns
            response = await fn(request, webhook=webhook, headers=headers, sslpeer=sslpeer)
            verdict = verdict_of(response)
            return response
        finally:
            record(webhook or "", clock() - t0, verdict)

    return review
