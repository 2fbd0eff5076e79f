"""A tiny PromQL evaluator for the forms the operator's Grafana dashboard uses, over a series of
Prometheus text-format scrapes: enough to draw that dashboard from a real run without a
Prometheus (tools/dashboard_png.py), and nothing more.

Supported, as Prometheus evaluates them:

* a selector ``name{label="value", label!="value"}`` (an instant vector: each series' newest
  sample within the 5 minute lookback, none after a staleness marker); in a value only the
  escapes ``\\"`` and ``\\\\`` (Prometheus' other Go escapes are refused, not misread);
* ``rate(selector[range])``, the range a positive number of ``ms``, ``s``, ``m`` or ``h``:
  the per-second increase over the left-open window
  ``(t - range, t]``, counter resets added back, extrapolated to the window's edges by
  Prometheus' rule (``extrapolatedRate`` in promql/functions.go);
* ``sum(expr)`` and ``sum by (labels) (expr)``;
* ``histogram_quantile(q, expr)`` over series with an ``le`` label, by Prometheus' linear
  interpolation within the bucket the rank falls in (``bucketQuantile``).

Anything else (another function or aggregation, ``without``, a regex matcher, arithmetic, an
offset) is refused with a ParseError naming the expression, so that a dashboard edited to use
more cannot be drawn wrongly without notice. Dashboard variables (``$namespace``,
``$__rate_interval``) are substituted before parsing; an unknown one is refused too.

A scrape file holds scrapes one after another, each a header line
``# scrape t=SECONDS up=1|0 LABEL=VALUE ...`` (the target's labels, as Prometheus' service
discovery attaches them: ``namespace``, ``pod``) and then the target's exposition text; a
scrape with ``up=0`` (the target did not answer) marks the target's series stale, as
Prometheus does.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["LOOKBACK_S", "ParseError", "Rate", "Scrape", "Selector", "Series", "TimeSeriesDB",
           "evaluate", "parse", "parse_scrapes", "substitute"]

LOOKBACK_S = 300.0  # Prometheus' default --query.lookback-delta
STALE = math.nan  # a staleness marker (Prometheus uses a special NaN; no sample here is NaN)
Labels = tuple[tuple[str, str], ...]  # sorted (name, value), __name__ included for raw series


class ParseError(ValueError):
    """An expression outside the supported forms (the message names it)."""


# ---- scrapes -------------------------------------------------------------------------------

@dataclass
class Scrape:
    t: float
    up: bool
    target: dict[str, str]
    text: str


HEADER = re.compile(r"# scrape t=(?P<t>\S+) up=(?P<up>[01])(?P<labels>( [A-Za-z_]\w*=\S*)*)$")


def parse_scrapes(text: str) -> list[Scrape]:
    """The scrapes of a scrape file (format in the module docstring), in file order."""
    out: list[Scrape] = []
    body: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("# scrape "):
            m = HEADER.match(line)
            if m is None:
                raise ValueError(f"scrape file line {n}: {line!r} is not "
                                 f"'# scrape t=SECONDS up=1|0 LABEL=VALUE ...'")
            if out:
                out[-1].text = "\n".join(body) + "\n"
            body = []
            t = float(m["t"])
            if not math.isfinite(t) or (out and t < out[-1].t):
                raise ValueError(f"scrape file line {n}: t={m['t']!r} is not a finite time "
                                 f"at or after the previous scrape's")
            target = dict(kv.split("=", 1) for kv in m["labels"].split())
            out.append(Scrape(t, m["up"] == "1", target, ""))
        elif out:
            body.append(line)
        elif line.strip():
            raise ValueError(f"scrape file line {n}: {line!r} comes before the first "
                             f"'# scrape' header")
    if out:
        out[-1].text = "\n".join(body) + "\n"
    return out


@dataclass
class Series:
    labels: Labels
    points: list[tuple[float, float]] = field(default_factory=list)  # (t, value or STALE)


class TimeSeriesDB:
    """Samples by series, as Prometheus stores the scrapes: each sample gets the target's
    labels; a target that does not answer, or a series missing from a target's scrape, gets
    a staleness marker."""

    def __init__(self, scrapes: Iterable[Scrape]) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.series: dict[Labels, Series] = {}
        live: dict[Labels, set[Labels]] = {}  # target -> its series in its last scrape
        for s in scrapes:
            target: Labels = tuple(sorted(s.target.items()))
            seen: set[Labels] = set()
            if s.up:
                for family in text_string_to_metric_families(s.text):
                    for sample in family.samples:
                        labels = {**sample.labels, **s.target, "__name__": sample.name}
                        key: Labels = tuple(sorted(labels.items()))
                        self.series.setdefault(key, Series(key)).points.append(
                            (s.t, float(sample.value)))
                        seen.add(key)
            for key in live.get(target, set()) - seen:
                self.series[key].points.append((s.t, STALE))
            live[target] = seen

    @property
    def times(self) -> list[float]:
        return sorted({t for s in self.series.values() for t, _ in s.points})


# ---- parsing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, "=" or "!=", value)


@dataclass(frozen=True)
class Rate:
    selector: Selector
    range_s: float


@dataclass(frozen=True)
class Sum:
    by: tuple[str, ...] | None  # None: sum of everything
    arg: Expr


@dataclass(frozen=True)
class Quantile:
    q: float
    arg: Expr


Expr = Selector | Rate | Sum | Quantile

TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>\d+(?:\.\d+)?(?![\w.]))'
                   r'|(?P<dur>\[\d+(?:ms|[smh])\])|(?P<id>[A-Za-z_:][\w:]*)'
                   r'|(?P<op>!=|=~|!~|[(){},=]))')
DURATION = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
EXPECTED = {"dur": "a range such as [5m]", "str": "a quoted value", "num": "a number",
            "id": "a name", "op": "an operator"}


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """``$name`` and ``${name}`` replaced by ``variables[name]``; an unknown one refused."""
    def one(m: re.Match[str]) -> str:
        name = m["a"] or m["b"]
        if name not in variables:
            raise ParseError(f"PromQL {expr!r}: variable ${name} is not known (known: "
                             f"{', '.join(sorted(variables))})")
        return variables[name]
    return re.sub(r"\$(?:\{(?P<a>\w+)\}|(?P<b>\w+))", one, expr)


def parse(expr: str) -> Expr:
    """The expression's tree; a ParseError naming ``expr`` for any unsupported form."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr.rstrip()):
        m = TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ParseError(f"PromQL {expr!r}: cannot read {expr[pos:pos + 20]!r} (only "
                             f"selectors, sum, sum by, rate and histogram_quantile are supported)")
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m[kind]))
        pos = m.end()
    parser = _Parser(expr, tokens)
    tree = parser.expr()
    if parser.i != len(tokens):
        parser.refuse(f"{tokens[parser.i][1]!r} after a complete expression")
    return tree


class _Parser:
    def __init__(self, expr: str, tokens: list[tuple[str, str]]) -> None:
        self.text, self.tokens, self.i = expr, tokens, 0

    def refuse(self, what: str, verb: str = " is not supported") -> None:
        raise ParseError(f"PromQL {self.text!r}: {what}{verb} (only selectors, sum, sum by, "
                         f"rate(selector[range]) and histogram_quantile are supported)")

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "end of input")

    def take(self, kind: str, value: str | None = None) -> str:
        k, v = self.peek()
        if k != kind or (value is not None and v != value):
            wanted = repr(value) if value is not None else EXPECTED[kind]
            self.refuse(f"expected {wanted}, found {v!r}", verb="")
        self.i += 1
        return v

    def expr(self) -> Expr:
        kind, value = self.peek()
        if kind != "id":
            self.refuse(f"{value!r}")
        if value == "sum":
            self.i += 1
            by: tuple[str, ...] | None = None
            if self.peek() == ("id", "by"):
                self.i += 1
                by = tuple(self.labels())
            elif self.peek()[0] == "id":
                self.refuse(f"sum {self.peek()[1]!r}")
            self.take("op", "(")
            arg = self.expr()
            self.take("op", ")")
            if self.peek() in (("id", "by"), ("id", "without")):
                self.refuse(f"a trailing {self.peek()[1]!r} clause")
            return Sum(by, arg)
        if value == "rate":
            self.i += 1
            self.take("op", "(")
            sel = self.selector()
            rng = self.take("dur")
            self.take("op", ")")
            m = re.fullmatch(r"\[(\d+)(\D+)\]", rng)
            assert m is not None  # a "dur" token
            if int(m[1]) == 0:  # Prometheus refuses a range that is not positive
                self.refuse(f"the range {rng}", verb=" is not positive")
            return Rate(sel, int(m[1]) * DURATION[m[2]])
        if value == "histogram_quantile":
            self.i += 1
            self.take("op", "(")
            q = float(self.take("num"))
            self.take("op", ",")
            arg = self.expr()
            self.take("op", ")")
            return Quantile(q, arg)
        if self.i + 1 < len(self.tokens) and self.tokens[self.i + 1] == ("op", "("):
            self.refuse(f"function or aggregation {value!r}")
        return self.selector()

    def labels(self) -> list[str]:
        self.take("op", "(")
        out = [self.take("id")]
        while self.peek() == ("op", ","):
            self.i += 1
            out.append(self.take("id"))
        self.take("op", ")")
        return out

    def selector(self) -> Selector:
        name = self.take("id")
        if name in ("by", "without", "offset", "and", "or", "unless", "bool"):
            self.refuse(f"keyword {name!r}")
        matchers: list[tuple[str, str, str]] = []
        if self.peek() == ("op", "{"):
            self.i += 1
            while self.peek() != ("op", "}"):
                label = self.take("id")
                kind, op = self.peek()
                if (kind, op) not in (("op", "="), ("op", "!=")):
                    self.refuse(f"matcher {label}{op}")
                self.i += 1
                raw = self.take("str")
                matchers.append((label, op, self.unquote(raw)))
                if self.peek() == ("op", ","):
                    self.i += 1
                elif self.peek() != ("op", "}"):
                    self.refuse(f"expected ',' or '}}' after the matcher {label}{op}{raw}, "
                                f"found {self.peek()[1]!r}", verb="")
            self.i += 1
        nxt = self.peek()
        if nxt[0] == "id" and nxt[1] == "offset":
            self.refuse("offset")
        return Selector(name, tuple(matchers))

    def unquote(self, raw: str) -> str:
        """A quoted value's text: ``\\"`` and ``\\\\`` decoded; Prometheus' other (Go) escapes
        are refused rather than read as the letter they escape."""
        def one(m: re.Match[str]) -> str:
            if m[1] not in ('"', "\\"):
                self.refuse(f"the escape {m[0]} in {raw}", verb=" is not supported (only \\\" "
                                                               "and \\\\)")
            return m[1]
        return re.sub(r"\\(.)", one, raw[1:-1])


# ---- evaluation ------------------------------------------------------------------------------

Vector = dict[Labels, float]  # an instant vector at one time


def _matches(labels: Labels, sel: Selector) -> bool:
    d = dict(labels)
    if d.get("__name__") != sel.name:
        return False
    return all((d.get(k, "") == v) == (op == "=") for k, op, v in sel.matchers)


def _instant(db: TimeSeriesDB, sel: Selector, t: float) -> Vector:
    out: Vector = {}
    for key, s in db.series.items():
        if not _matches(key, sel):
            continue
        i = bisect.bisect_right(s.points, t, key=lambda p: p[0])  # the newest at or before t
        if i and s.points[i - 1][0] > t - LOOKBACK_S and not math.isnan(s.points[i - 1][1]):
            out[key] = s.points[i - 1][1]
    return out


def extrapolated_rate(points: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Prometheus' ``rate`` of one counter's samples (in time order) in ``(start, end]``
    (staleness markers dropped), or None with fewer than two samples."""
    lo = bisect.bisect_right(points, start, key=lambda p: p[0])
    hi = bisect.bisect_right(points, end, key=lambda p: p[0])
    pts = [(t, v) for t, v in points[lo:hi] if not math.isnan(v)]
    if len(pts) < 2:
        return None
    result = pts[-1][1] - pts[0][1]
    last = 0.0
    for _, v in pts:  # a counter that went down was reset: add back what it had reached
        if v < last:
            result += last
        last = v
    sampled = pts[-1][0] - pts[0][0]
    average = sampled / (len(pts) - 1)
    threshold = average * 1.1
    to_start, to_end = pts[0][0] - start, end - pts[-1][0]
    if to_start >= threshold:
        to_start = average / 2
    if result > 0 and pts[0][1] >= 0:  # not extrapolated to below zero
        to_start = min(to_start, sampled * (pts[0][1] / result))
    if to_end >= threshold:
        to_end = average / 2
    return result * (sampled + to_start + to_end) / sampled / (end - start)


def _without_name(labels: Labels) -> Labels:
    return tuple((k, v) for k, v in labels if k != "__name__")


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' ``bucketQuantile``: ``buckets`` as (upper bound, cumulative count)."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets)
    if not buckets or not math.isinf(buckets[-1][0]):
        return math.nan
    merged: list[tuple[float, float]] = []  # equal bounds (e.g. "1" and "1.0") add up
    for bound, count in buckets:
        if merged and merged[-1][0] == bound:
            merged[-1] = (bound, merged[-1][1] + count)
        else:
            merged.append((bound, count))
    # ensureMonotonicAndIgnoreSmallDeltas: a count below the previous bucket's, or within
    # 1e-12 of it (float error of rates summed), is taken as the previous one
    for i in range(1, len(merged)):
        prev = merged[i - 1][1]
        if merged[i][1] < prev or math.isclose(merged[i][1], prev, rel_tol=1e-12):
            merged[i] = (merged[i][0], prev)
    if len(merged) < 2 or merged[-1][1] == 0:
        return math.nan
    rank = q * merged[-1][1]
    # the first bucket (+Inf not searched) whose count reaches the rank, else the +Inf one
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def evaluate(tree: Expr, db: TimeSeriesDB, t: float) -> Vector:
    """The instant vector of ``tree`` at time ``t``."""
    if isinstance(tree, Selector):
        return _instant(db, tree, t)
    if isinstance(tree, Rate):
        out: Vector = {}
        for key, s in db.series.items():
            if _matches(key, tree.selector):
                r = extrapolated_rate(s.points, t - tree.range_s, t)
                if r is not None:
                    out[_without_name(key)] = r
        return out
    if isinstance(tree, Sum):
        groups: Vector = {}
        for key, v in evaluate(tree.arg, db, t).items():
            group = tuple((k, val) for k, val in key if k in (tree.by or ()))
            groups[group] = groups.get(group, 0.0) + v
        return groups
    by_rest: dict[Labels, list[tuple[float, float]]] = {}
    for key, v in evaluate(tree.arg, db, t).items():
        d = dict(_without_name(key))
        if "le" not in d:
            continue  # Prometheus drops a series without le (with an annotation)
        le = d.pop("le")
        by_rest.setdefault(tuple(sorted(d.items())), []).append((float(le), v))
    return {k: bucket_quantile(tree.q, b) for k, b in by_rest.items()}
