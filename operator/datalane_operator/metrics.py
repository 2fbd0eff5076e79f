"""The operator's Prometheus metrics, in the text exposition format (version 0.0.4).

Counted by the runtime (:class:`~datalane_operator.runtime.Runtime`) as the work happens;
served at ``--metrics`` (default ``http://0.0.0.0:8081/metrics``) by :func:`start_server`,
which ``datalane-operator run`` starts next to kopf's ``/healthz`` (kopf's health server
serves a single path). Each replica reports its own; docs/operator.md lists every metric.
Written by hand, small: prometheus_client is a dependency of the sidecar, not the operator.

* ``datalane_operator_reconciles_total{outcome}``: finished reconciles, ``ok`` or ``error``;
* ``datalane_operator_reconcile_duration_seconds``: their durations (histogram);
* ``datalane_operator_admissions_total{webhook,verdict}``: admission reviews answered,
  ``allowed``, ``denied`` or ``error`` (kopf failed to answer), by webhook id (``unknown``
  for a request to any other path);
* ``datalane_operator_webhook_duration_seconds{webhook}``: review latency (histogram);
* ``datalane_operator_store_operations_total{kind,outcome}``: looks at checkpoint stores,
  ``look`` (list and garbage-collect, the leader) or ``progress`` (the newest step, for the
  recipe-edit guard), each ``ok``, ``error``, ``timeout`` or ``denied`` (not touched: the
  cluster policy or a missing Secret);
* ``datalane_operator_leader``: 1 while this replica is the leader, else 0.

Every label set of the counters' vocabularies (:class:`Outcome`, :class:`Verdict` by webhook
id in :data:`~datalane_operator.names.WEBHOOKS`, :class:`StoreKind` by :class:`StoreOutcome`)
is exported from the start, at 0, as Prometheus' instrumentation guide asks: ``rate`` and
``increase`` see a count only as a rise between two samples, so a series that first appears
at 1 (the first refusal, say) would show nothing, and an alert on denials would miss it. The
webhook label ``unknown`` appears only once counted: it is for made-up paths. The counting
code and this initialisation name the same enums, so they cannot drift; a value outside them
(which the types refuse) is still counted, in a series of its own: a metric must never fail
the review or reconcile it counts.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from datalane_operator.names import WEBHOOKS

__all__ = ["BUCKETS", "Histogram", "Metrics", "Outcome", "StoreKind", "StoreOutcome", "Verdict",
           "parse_endpoint", "start_server"]


class Outcome(enum.StrEnum):
    """How a reconcile ended (``reconciles_total{outcome}``)."""

    OK = "ok"
    ERROR = "error"


class Verdict(enum.StrEnum):
    """The answer to an admission review (``admissions_total{verdict}``)."""

    ALLOWED = "allowed"
    DENIED = "denied"
    ERROR = "error"
    """kopf's webhook function raised: no answer."""


class StoreKind(enum.StrEnum):
    """What an operation on a checkpoint store was (``store_operations_total{kind}``)."""

    LOOK = "look"
    """List and garbage-collect (the leader, every ``--storage-interval``)."""
    PROGRESS = "progress"
    """The newest committed step (the admission of a recipe edit)."""


class StoreOutcome(enum.StrEnum):
    """How an operation on a checkpoint store ended (``store_operations_total{outcome}``)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    DENIED = "denied"
    """Not touched: the cluster policy or a missing Secret."""


# seconds: admission answers from memory in milliseconds; the webhooks time out at 5-10 s
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFIX = "datalane_operator_"
Labels = tuple[tuple[str, str], ...]


def _zeros(**vocabularies: Iterable[str]) -> dict[Labels, int]:
    """Every combination of the label values, in the order given, at 0."""
    names = list(vocabularies)
    return {tuple((n, str(v)) for n, v in zip(names, values, strict=True)): 0
            for values in itertools.product(*vocabularies.values())}


def _labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(x: float) -> str:
    """As Prometheus' own clients write a float: 0.005, 1.0, +Inf."""
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


class Histogram:
    """Cumulative buckets (upper bounds ``buckets``, then +Inf), sum and count."""

    def __init__(self, buckets: Sequence[float] = BUCKETS) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket, not cumulative; last: +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def lines(self, name: str, labels: Labels) -> list[str]:
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            le = 'le="' + _number(bound) + '"'
            out.append(f"{name}_bucket{_labels(labels, le)} {total}")
        out.append(f"{name}_sum{_labels(labels)} {_number(self.sum)}")
        out.append(f"{name}_count{_labels(labels)} {total}")
        return out


class Metrics:
    """The counters and histograms of one operator process."""

    def __init__(self) -> None:
        # every known label set from 0 (the module's docstring says why)
        self.reconciles = _zeros(outcome=Outcome)
        self.reconcile_seconds = Histogram()
        self.admissions = _zeros(webhook=WEBHOOKS, verdict=Verdict)
        self.webhook_seconds: dict[Labels, Histogram] = {}
        self.store_operations = _zeros(kind=StoreKind, outcome=StoreOutcome)

    def reconciled(self, outcome: Outcome, seconds: float) -> None:
        key = (("outcome", str(outcome)),)
        self.reconciles[key] = self.reconciles.get(key, 0) + 1
        self.reconcile_seconds.observe(seconds)

    def reviewed(self, webhook: str, verdict: Verdict, seconds: float) -> None:
        # kopf's webhook server hands any request path over as the webhook's id: made-up
        # paths share one label, so that they cannot grow the label set without bound
        webhook = webhook if webhook in WEBHOOKS else "unknown"
        key = (("webhook", webhook), ("verdict", str(verdict)))
        self.admissions[key] = self.admissions.get(key, 0) + 1
        self.webhook_seconds.setdefault((("webhook", webhook),), Histogram()).observe(seconds)

    def stored(self, kind: StoreKind, outcome: StoreOutcome) -> None:
        key = (("kind", str(kind)), ("outcome", str(outcome)))
        self.store_operations[key] = self.store_operations.get(key, 0) + 1

    def render(self, leading: bool) -> str:
        """Every metric in the text format: each counter's known label sets (0 until
        counted) and any other counted, sorted; a webhook histogram once it has a sample."""
        out: list[str] = []

        def family(name: str, kind: str, doc: str) -> str:
            out.append(f"# HELP {PREFIX}{name} {doc}")
            out.append(f"# TYPE {PREFIX}{name} {kind}")
            return PREFIX + name

        def counter(name: str, doc: str, values: dict[Labels, int]) -> None:
            full = family(name, "counter", doc)
            out.extend(f"{full}{_labels(k)} {v}" for k, v in sorted(values.items()))

        counter("reconciles_total", "Finished reconciles of DataPipelines, by outcome.",
                self.reconciles)
        full = family("reconcile_duration_seconds", "histogram", "Duration of reconciles.")
        out.extend(self.reconcile_seconds.lines(full, ()))
        counter("admissions_total", "Admission reviews answered, by webhook and verdict.",
                self.admissions)
        full = family("webhook_duration_seconds", "histogram",
                      "Time to answer an admission review, by webhook.")
        for labels, hist in sorted(self.webhook_seconds.items()):
            out.extend(hist.lines(full, labels))
        counter("store_operations_total",
                "Operations on checkpoint stores, by kind (look, progress) and outcome.",
                self.store_operations)
        full = family("leader", "gauge", "1 while this replica is the leader (it reconciles).")
        out.append(f"{full} {int(leading)}")
        return "\n".join(out) + "\n"


def parse_endpoint(endpoint: str) -> tuple[str, int, str]:
    """(host, port, path) of ``http://HOST:PORT/PATH``; a ConfigError naming the flag else."""
    from datalane.spec.errors import ConfigError

    parts = urllib.parse.urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or not port:
        raise ConfigError(f"--metrics {endpoint!r} is not http://HOST:PORT/PATH (e.g. "
                          f"http://0.0.0.0:8081/metrics)")
    return parts.hostname, port, parts.path or "/metrics"


async def start_server(endpoint: str, render: Callable[[], str]) -> Any:
    """Serve ``render()`` at ``endpoint`` (:func:`parse_endpoint`); returns the aiohttp
    runner to clean up. Raises at once when the address cannot be bound."""
    import aiohttp.web

    host, port, path = parse_endpoint(endpoint)

    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=render().encode(), headers={
            "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get(path, metrics)])
    runner = aiohttp.web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port).start()
    return runner
