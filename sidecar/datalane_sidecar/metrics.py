"""Prometheus metrics of the sidecar (DESIGN section 5).

tokens/s is derived by Prometheus from the ``datalane_tokens_total`` counter
(``rate(datalane_tokens_total[1m])``); queue depth, the seconds trainers waited, replay seconds
and skipped records by reason are exported as they are. The realized mixture is exported per
source: the tokens the mixture has taken from it over the sidecar's lanes
(``datalane_source_tokens``), its share of them (``datalane_source_share``) next to its share
of the recipe's weights (``datalane_source_weight``); over a short prefix the share can be far
from the weight although every choice is exact (see docs/recipe.md, Mixture).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Metrics"]


class _Refresh:
    """A collector that yields nothing but refreshes the session gauges first: registered
    before them, it runs at the start of every scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        self.metrics.refresh(self.metrics.sessions())
        return iter(())


class Metrics:
    """Metrics on a private registry (several sidecars can live in one test process)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.sessions: Callable[[], list[Any]] = list  # set by the service
        self.registry.register(_Refresh(self))
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
        self.source_tokens = Gauge("datalane_source_tokens", "Tokens the mixture took from "
                                   "each source, over the open sessions' lanes", ["source"],
                                   registry=self.registry)
        self.source_share = Gauge("datalane_source_share", "Each source's share of the tokens "
                                  "the mixture took (the realized mixture)", ["source"],
                                  registry=self.registry)
        self.source_weight = Gauge("datalane_source_weight", "Each source's share of the "
                                   "recipe's weights", ["source"], registry=self.registry)

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
        if sessions:
            sources = sessions[0].loader.recipe.sources
            taken = [0] * len(sources)
            for s in sessions:
                taken = [a + b for a, b in zip(taken, s.loader.mixture_tokens(), strict=True)]
            total_w = sum(src.weight for src in sources)
            total_t = sum(taken)
            for src, t in zip(sources, taken, strict=True):
                self.source_tokens.labels(source=src.name).set(t)
                self.source_share.labels(source=src.name).set(t / total_t if total_t else 0.0)
                self.source_weight.labels(source=src.name).set(src.weight / total_w)

    def serve(self, port: int, addr: str) -> Any:
        from prometheus_client import start_http_server

        return start_http_server(port, addr=addr, registry=self.registry)
