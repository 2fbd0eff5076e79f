"""Prometheus metrics of the sidecar (DESIGN section 5).

tokens/s is derived by Prometheus from the ``datalane_tokens_total`` counter
(``rate(datalane_tokens_total[1m])``); queue depth, the seconds trainers waited, replay seconds
and skipped records by reason are exported as they are.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Metrics"]


class Metrics:
    """Metrics on a private registry (several sidecars can live in one test process)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.tokens = Counter("datalane_tokens", "Document tokens delivered to trainers",
                              registry=self.registry)
        self.bytes = Counter("datalane_payload_bytes", "Payload bytes delivered",
                             registry=self.registry)
        self.microbatches = Counter("datalane_microbatches", "Microbatches delivered",
                                    registry=self.registry)
        self.queue_depth = Gauge("datalane_queue_depth", "Microbatches ready in the last "
                                 "session that delivered one", registry=self.registry)
        self.waited = Gauge("datalane_trainer_wait_seconds", "Seconds trainers waited for a "
                            "microbatch, summed over open sessions", registry=self.registry)
        self.replay_seconds = Histogram("datalane_replay_seconds", "Seconds to open a session "
                                        "at a resume point", registry=self.registry)
        self.skipped = Gauge("datalane_skipped_records", "Records skipped, by reason",
                             ["reason"], registry=self.registry)

    def delivered(self, payload_bytes: int, tokens: int, depth: int) -> None:
        """One microbatch of ``payload_bytes`` (every column) holding ``tokens`` document
        tokens (positions >= 0) was sent."""
        self.microbatches.inc()
        self.tokens.inc(tokens)
        self.bytes.inc(payload_bytes)
        self.queue_depth.set(depth)

    def refresh(self, sessions: list[Any]) -> None:
        """Gauges that are read from the sessions (called on each scrape)."""
        self.waited.set(sum(s.waited_seconds for s in sessions))
        totals: dict[str, int] = {}
        for s in sessions:
            for reason, n in s.loader.counters().skipped.items():
                totals[reason] = totals.get(reason, 0) + n
        for reason, n in totals.items():
            self.skipped.labels(reason=reason).set(n)

    def serve(self, port: int, addr: str) -> Any:
        from prometheus_client import start_http_server

        return start_http_server(port, addr=addr, registry=self.registry)
