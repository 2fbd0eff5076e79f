"""Prometheus metrics of the sidecar (docs/architecture.md, The wire).

tokens/s is derived by Prometheus from the ``datalane_tokens_total`` counter
(``rate(datalane_tokens_total[1m])``); queue depth, the seconds trainers waited, replay seconds
and skipped records by reason are exported as they are. The realized mixture is exported per
source: the tokens the mixture has taken from it over the sidecar's lanes
(``datalane_source_tokens``), its share of them (``datalane_source_share``) next to its share
of the weights in force at the sessions' step (``datalane_source_weight``) and the share the
recipe asks for over the steps served so far (``datalane_source_target_share``: the average of
each step's weights under a schedule; the weights themselves without phases), which is what
the realized share tracks; over a short prefix the share can be far from it although every
choice is exact (see docs/recipe.md, Mixture).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from datalane.spec.errors import DatalaneError
from datalane.spec.evals import TRAIN
from datalane.spec.phases import Schedule

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
        self.tokens = Counter("datalane_tokens", "Document tokens of training microbatches "
                              "delivered to trainers", registry=self.registry)
        self.bytes = Counter("datalane_payload_bytes", "Payload bytes delivered (training and "
                             "eval microbatches)", registry=self.registry)
        self.microbatches = Counter("datalane_microbatches", "Training microbatches delivered",
                                    registry=self.registry)
        self.eval_tokens = Counter("datalane_eval_tokens", "Document tokens of eval-stream "
                                   "microbatches delivered", ["stream"], registry=self.registry)
        self.eval_microbatches = Counter("datalane_eval_microbatches", "Eval-stream "
                                         "microbatches delivered", ["stream"],
                                         registry=self.registry)
        self.queue_depth = Gauge("datalane_queue_depth", "Microbatches ready in the last "
                                 "session that delivered one", registry=self.registry)
        self.waited = Gauge("datalane_trainer_wait_seconds", "Seconds trainers waited for a "
                            "microbatch, summed over open sessions", registry=self.registry)
        self.replay_seconds = Histogram("datalane_replay_seconds", "Seconds to open a session "
                                        "at a resume point", registry=self.registry)
        self.startup = Gauge("datalane_startup_seconds", "Seconds each part of the sidecar's "
                             "start took (imports, recipe, plan, store, service, bind)",
                             ["phase"], registry=self.registry)
        self.open_seconds = Histogram("datalane_open_seconds", "Seconds an Open took (a new "
                                      "session: its replay; or a reader attached)",
                                      registry=self.registry)
        self.first_microbatch = Histogram("datalane_first_microbatch_seconds", "Seconds from "
                                          "an Open's reply to the first microbatch sent on its "
                                          "stream", registry=self.registry)
        self.calls = Gauge("datalane_calls_in_flight", "Calls that hold a server thread for "
                           "long (stream, checkpoint, open), in flight now", ["kind"],
                           registry=self.registry)
        self.refused = Gauge("datalane_calls_refused", "Calls refused with RESOURCE_EXHAUSTED "
                             "past the --max-streams limit, since the start", ["kind"],
                             registry=self.registry)
        self.call_limit = Gauge("datalane_max_streams", "Calls of each kind served at once "
                                "(--max-streams)", registry=self.registry)
        self.skipped = Gauge("datalane_skipped_records", "Records skipped, by reason",
                             ["reason"], registry=self.registry)
        self.source_tokens = Gauge("datalane_source_tokens", "Tokens the mixture took from "
                                   "each source, over the open sessions' lanes", ["source"],
                                   registry=self.registry)
        self.source_share = Gauge("datalane_source_share", "Each source's share of the tokens "
                                  "the mixture took (the realized mixture)", ["source"],
                                  registry=self.registry)
        self.source_weight = Gauge("datalane_source_weight", "Each source's share of the "
                                   "weights in force at the sessions' current step", ["source"],
                                   registry=self.registry)
        self.source_target = Gauge("datalane_source_target_share", "Each source's share the "
                                   "recipe asks for over the steps served (the schedule's "
                                   "average)", ["source"], registry=self.registry)
        # the schedule of the sessions' recipe, and the sum of each step's normalized weights
        # over the steps 0 .. _summed - 1 (the target share is their mean, kept up as the
        # steps advance instead of summed again at every scrape)
        self._schedule: tuple[Any, Schedule] | None = None
        self._summed = 0
        self._sums: list[float] = []

    def watch(self, admission: Any) -> None:
        """Export an :class:`~datalane_sidecar.admission.Admission`'s counts."""
        self.call_limit.set(admission.max_streams)
        def count(table: dict[str, int], kind: str) -> Callable[[], float]:
            return lambda: float(table[kind])

        for kind in admission.KINDS:
            self.calls.labels(kind=kind).set_function(count(admission.active, kind))
            self.refused.labels(kind=kind).set_function(count(admission.refused, kind))

    def delivered(self, payload_bytes: int, tokens: int, depth: int,
                  stream: str = TRAIN) -> None:
        """One microbatch of ``payload_bytes`` (every column) holding ``tokens`` document
        tokens (positions >= 0) was sent on ``stream``: an eval stream has counters of its
        own (an evaluation is not training progress, and its queue is not the training
        queue)."""
        self.bytes.inc(payload_bytes)
        if stream != TRAIN:
            self.eval_microbatches.labels(stream=stream).inc()
            self.eval_tokens.labels(stream=stream).inc(tokens)
            return
        self.microbatches.inc()
        self.tokens.inc(tokens)
        self.queue_depth.set(depth)

    def refresh(self, sessions: list[Any]) -> None:
        """Gauges that are read from the sessions (called on each scrape): each session's
        ``gauges()``, one call per session (one message to a rank worker's process)."""
        gauges, answered = [], []
        for s in sessions:
            try:
                gauges.append(s.gauges())
            except DatalaneError:  # closed in its rank worker meanwhile, or the worker died
                continue
            answered.append(s)
        sessions = answered
        self.waited.set(sum(g["waited_seconds"] for g in gauges))
        totals: dict[str, int] = {}
        for g in gauges:
            for reason, n in g["skipped"].items():
                totals[reason] = totals.get(reason, 0) + n
        for reason, n in totals.items():
            self.skipped.labels(reason=reason).set(n)
        if sessions:
            recipe = sessions[0].plan.recipe
            sources = recipe.sources
            taken = [0] * len(sources)
            for g in gauges:
                taken = [a + b for a, b in zip(taken, g["mixture_tokens"], strict=True)]
            step = max(g["step"] for g in gauges)  # steps served so far
            schedule = self._schedule_of(recipe)
            now = schedule.weights(max(step - 1, 0))
            target = self._target_shares(schedule, step)
            total_w, total_m = sum(now), sum(target)
            total_t = sum(taken)
            for i, (src, t) in enumerate(zip(sources, taken, strict=True)):
                self.source_tokens.labels(source=src.name).set(t)
                self.source_share.labels(source=src.name).set(t / total_t if total_t else 0.0)
                self.source_weight.labels(source=src.name).set(now[i] / total_w)
                self.source_target.labels(source=src.name).set(target[i] / total_m)

    def _schedule_of(self, recipe: Any) -> Schedule:
        if self._schedule is None or self._schedule[0] is not recipe:
            self._schedule = (recipe, Schedule.of(recipe))
            self._summed, self._sums = 0, [0.0] * len(recipe.sources)
        return self._schedule[1]

    def _target_shares(self, schedule: Schedule, steps: int) -> tuple[float, ...]:
        """What :func:`datalane.spec.phases.mean_weights` gives, summed incrementally."""
        if schedule.constant or steps <= 0:
            return schedule.initial
        if steps < self._summed:  # fewer steps than before (sessions restarted): sum again
            self._summed, self._sums = 0, [0.0] * len(self._sums)
        for step in range(self._summed, steps):
            w = schedule.weights(step)
            norm = sum(w)
            self._sums = [a + x / norm for a, x in zip(self._sums, w, strict=True)]
        self._summed = steps
        return tuple(a / steps for a in self._sums)

    def serve(self, port: int, addr: str) -> Any:
        from prometheus_client import start_http_server

        return start_http_server(port, addr=addr, registry=self.registry)
