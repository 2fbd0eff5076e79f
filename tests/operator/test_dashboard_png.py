"""The rendering of the operator's Grafana dashboard (tools/dashboard_png.py) and its PromQL
evaluator (tools/promql.py): hand-worked rates (a counter reset, the extrapolation to the
window's edges and its clamp at zero), quantiles of hand-made buckets and of the operator's own
histogram exposition, sums by label, staleness; every expression of the committed dashboard
supported and any other form refused by name; the committed scrapes of a real run drawn, each
panel with data."""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

import pytest
from datalane_operator.metrics import Histogram, Metrics, Outcome

from tests.support.paths import REPO
from tools import dashboard_png
from tools.promql import (
    ParseError,
    Rate,
    Scrape,
    Selector,
    TimeSeriesDB,
    bucket_quantile,
    evaluate,
    extrapolated_rate,
    parse,
    parse_scrapes,
    substitute,
)

DASHBOARD = json.loads(dashboard_png.DASHBOARD.read_text())


def at(expr: str, db: TimeSeriesDB, t: float) -> dict[tuple[tuple[str, str], ...], float]:
    return evaluate(parse(expr), db, t)


def test_rate_adds_back_a_counter_reset() -> None:
    # window (2, 10]: 10 -> 16, reset, 4 -> 10: an increase of 6 + 4 + 6 = 16 over the 6 s
    # sampled; the first sample 2 s from the window's start (under 1.1 x the 2 s spacing) is
    # extrapolated to it, the last is at its end: 16 * 8 / 6 over 8 s = 16/6 per second
    points = [(4.0, 10.0), (6.0, 16.0), (8.0, 4.0), (10.0, 10.0)]
    assert extrapolated_rate(points, 2.0, 10.0) == pytest.approx(16 / 6)
    # the same through a scrape file and rate(...): the reset is a restarted process
    text = "".join(f"# scrape t={t:g} up=1 namespace=n pod=a\nc_total {v:g}\n"
                   for t, v in points)
    db = TimeSeriesDB(parse_scrapes(text))
    assert at('rate(c_total{namespace="n"}[8s])', db, 10.0) == {
        (("namespace", "n"), ("pod", "a")): pytest.approx(16 / 6)}


def test_rate_extrapolation_stops_at_zero_and_at_half_a_spacing() -> None:
    # window (0, 8]: samples at 6 (1) and 8 (5). The start is 6 s away (>= 2.2): extrapolated
    # by half the spacing, 1 s, but a counter at 1 rising 4 per 2 s was 0 only 0.5 s earlier:
    # (4 / 2 s) x 2.5 s = 5 over the 8 s range
    assert extrapolated_rate([(6.0, 1.0), (8.0, 5.0)], 0.0, 8.0) == pytest.approx(5 / 8)
    # the half spacing first, then the zero point (Prometheus 3's order): a counter at 3
    # rising 4 per 2 s was 0 1.5 s before, further than the 1 s: (4 / 2 s) x 3 s over 8 s
    assert extrapolated_rate([(6.0, 3.0), (8.0, 7.0)], 0.0, 8.0) == pytest.approx(6 / 8)
    # a last sample 4 s before the end: extrapolated by 1 s; a first one far from 0: by 1 s
    assert extrapolated_rate([(0.5, 100.0), (2.5, 104.0), (4.5, 108.0)], 0.0, 8.5) == \
        pytest.approx(8 * (4 + 0.5 + 1) / 4 / 8.5)
    # the window is left-open: a sample at its start is outside; one sample is no rate
    assert extrapolated_rate([(0.0, 0.0), (8.0, 4.0)], 0.0, 8.0) is None


def test_histogram_quantile_interpolates_within_a_bucket() -> None:
    # cumulative: 2 under 0.1, 6 under 0.5, 8 under 1, 10 in all
    buckets = [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (math.inf, 10.0)]
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (5 - 2) / 4)  # 0.4
    assert bucket_quantile(0.1, buckets) == pytest.approx(0.05)  # rank 1 of the first 2
    assert bucket_quantile(0.99, buckets) == 1.0  # rank 9.9 is in +Inf: the highest bound
    # a count that goes down is the previous bucket's (3, not 2): rank 3.5 of 4 is then the
    # half of the one observation in (2, 3], 2.5 (2.75 if 2 were taken)
    assert bucket_quantile(0.875, [(1.0, 3.0), (2.0, 2.0), (3.0, 4.0), (math.inf, 4.0)]) == 2.5
    assert math.isnan(bucket_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]))  # no observation
    assert math.isnan(bucket_quantile(0.5, [(0.1, 1.0), (1.0, 2.0)]))  # no +Inf bucket


def test_histogram_quantile_of_the_operators_own_exposition() -> None:
    """Two scrapes of a real Histogram 4 s apart, 4 observations between them."""
    h = Histogram()
    first = "\n".join(h.lines("d_seconds", (("webhook", "w"),)))
    for seconds in (0.003, 0.02, 0.02, 0.2):  # buckets 0.005, 0.025, 0.025, 0.25
        h.observe(seconds)
    second = "\n".join(h.lines("d_seconds", (("webhook", "w"),)))
    text = (f"# scrape t=0 up=1 namespace=n pod=a\n# TYPE d_seconds histogram\n{first}\n"
            f"# scrape t=4 up=1 namespace=n pod=a\n# TYPE d_seconds histogram\n{second}\n")
    db = TimeSeriesDB(parse_scrapes(text))
    q = ("histogram_quantile({q}, sum by (le, webhook) "
         '(rate(d_seconds_bucket{{namespace="n"}}[8s])))')
    # rates are all scaled alike, so the quantile is the counts': rank 2 of 4 falls in
    # (0.01, 0.025], holding observations 2 and 3 (1 below): 0.01 + 0.015 x (2 - 1) / 2
    assert at(q.format(q=0.5), db, 4.0) == {(("webhook", "w"),): pytest.approx(0.0175)}
    # rank 3.96 in (0.1, 0.25] (3 below, 1 in it): 0.1 + 0.15 x 0.96
    assert at(q.format(q=0.99), db, 4.0) == {(("webhook", "w"),): pytest.approx(0.244)}


def test_sum_and_sum_by_over_two_replicas() -> None:
    def scrape(t: float, pod: str, ok: int, error: int, up: bool = True) -> str:
        m = Metrics()
        for _ in range(ok):
            m.reconciled(Outcome.OK, 0.01)
        for _ in range(error):
            m.reconciled(Outcome.ERROR, 0.01)
        return f"# scrape t={t:g} up={int(up)} namespace=n pod={pod}\n" + m.render(pod == "a")

    text = (scrape(0, "a", 2, 1) + scrape(0, "b", 1, 0) + scrape(4, "a", 10, 5)
            + scrape(4, "b", 5, 0))
    db = TimeSeriesDB(parse_scrapes(text))
    rate = 'rate(datalane_operator_reconciles_total{namespace="n"}[4s])'
    # over (0, 4] one sample each (the window is left-open): no rate
    assert at(f"sum by (outcome) ({rate})", db, 4.0) == {}
    # over (-4, 4]: a's ok 2 -> 10 in 4 s, extrapolated towards the window's start, but only
    # to where it was 0 (1 s before): 8 x 5/4 over 8 s = 1.25/s; a's error 1 -> 5 and b's ok
    # 1 -> 5 likewise: 4 x 5/4 / 8 = 0.625/s; b's error stays 0 (a series from the start)
    rate8 = rate.replace("[4s]", "[8s]")
    assert at(f"sum by (outcome) ({rate8})", db, 4.0) == {
        (("outcome", "ok"),): pytest.approx(1.25 + 0.625),
        (("outcome", "error"),): pytest.approx(0.625)}
    assert at(f"sum({rate8})", db, 4.0) == {(): pytest.approx(2.5)}
    assert at('sum(datalane_operator_leader{namespace="n"})', db, 4.0) == {(): 1.0}
    assert at('sum(datalane_operator_leader{namespace="other"})', db, 4.0) == {}
    assert at('datalane_operator_leader{namespace="n",pod!="a"}', db, 4.0) == {
        (("__name__", "datalane_operator_leader"), ("namespace", "n"), ("pod", "b")): 0.0}


def test_a_target_that_does_not_answer_goes_stale() -> None:
    text = ("# scrape t=0 up=1 namespace=n pod=a\ng 1\n# scrape t=2 up=0 namespace=n pod=a\n"
            "# scrape t=4 up=1 namespace=n pod=a\ng 1\n")
    db = TimeSeriesDB(parse_scrapes(text))
    assert [len(at("g", db, t)) for t in (0, 1, 2, 3, 4)] == [1, 1, 0, 0, 1]


def test_every_expression_of_the_committed_dashboard_is_supported() -> None:
    panels = dashboard_png.load_panels(DASHBOARD, {"namespace": "ns", "__rate_interval": "8s"})
    assert [p.title for p in panels] == [p["title"] for p in DASHBOARD["panels"]]
    assert sum(len(p.targets) for p in panels) == 8


@pytest.mark.parametrize("expr", [
    "avg(x)", "sum without (a) (x)", 'rate(x{a=~"b"}[5m])', "x + 1", "sum(x) by (a)",
    "x offset 5m", "increase(x[5m])", "rate(x)", "histogram_quantile(0.5)", "x{a=b}",
    "max by (a) (x)",
])
def test_other_forms_are_refused_by_name(expr: str) -> None:
    with pytest.raises(ParseError, match=f"PromQL '{expr}'".replace("(", r"\(").replace(
            ")", r"\)").replace("[", r"\[").replace("+", r"\+").replace("{", r"\{")):
        parse(expr)


@pytest.mark.parametrize(("expr", "message"), [
    ('x{a="1" b="2"}', """expected ',' or '}' after the matcher a="1", found 'b'"""),
    ('x{a="1"', """expected ',' or '}' after the matcher a="1", found 'end of input'"""),
    # Prometheus decodes Go's escapes; this evaluator reads only these two, and says so
    ('x{a="a\\nb"}', """the escape \\n in "a\\nb" is not supported (only \\" and \\\\)"""),
    ("rate(x[0s])", "the range [0s] is not positive"),  # Prometheus refuses it too
    ("rate(x[0ms])", "the range [0ms] is not positive"),
])
def test_malformed_selectors_and_ranges_are_refused_naming_the_expression(
        expr: str, message: str) -> None:
    with pytest.raises(ParseError, match="^" + re.escape(f"PromQL {expr!r}: {message}")):
        parse(expr)


def test_the_matchers_escapes_and_ranges_it_reads() -> None:
    sel = parse('x{a="q\\"uote", b!="back\\\\slash",}')  # a trailing comma is allowed
    assert isinstance(sel, Selector)
    assert sel.matchers == (("a", "=", 'q"uote'), ("b", "!=", "back\\slash"))
    assert parse("x{}") == Selector("x", ())
    assert parse("rate(x[1m])") == Rate(Selector("x", ()), 60.0)
    assert parse("rate(x[400ms])") == Rate(Selector("x", ()), 0.4)


def test_the_rate_interval_is_grafanas_and_never_0() -> None:
    assert dashboard_png.rate_interval(2.0) == "8s"  # the committed dashboard's
    assert dashboard_png.rate_interval(0.1) == "400ms"  # not round(0.4) = 0s
    assert dashboard_png.rate_interval(2.3) == "9200ms"  # not rounded to 9s
    with pytest.raises(ValueError, match=r"--interval 0\.0001 gives a \$__rate_interval of "
                                         r"0\.0004 s: under the 1 ms PromQL can write"):
        dashboard_png.rate_interval(0.0001)


def test_unknown_variables_and_panels_are_refused() -> None:
    with pytest.raises(ParseError, match=r"variable \$job is not known"):
        substitute('x{job="$job"}', {"namespace": "n"})
    bad = json.loads(json.dumps(DASHBOARD))
    bad["panels"][2]["targets"][0]["expr"] = "avg(datalane_operator_leader)"
    with pytest.raises(ParseError, match="'avg'"):
        dashboard_png.load_panels(bad, {"namespace": "n", "__rate_interval": "8s"})
    bad["panels"][2]["type"] = "heatmap"
    with pytest.raises(ValueError, match="panel 'Reconciles by outcome': type 'heatmap'"):
        dashboard_png.load_panels(bad, {"namespace": "n", "__rate_interval": "8s"})


def test_the_scrape_file_header_is_checked() -> None:
    with pytest.raises(ValueError, match="line 1: 'g 1' comes before"):
        parse_scrapes("g 1\n")
    with pytest.raises(ValueError, match="line 3: t='1' is not a finite time at or after"):
        parse_scrapes("# scrape t=2 up=1 pod=a\ng 1\n# scrape t=1 up=1 pod=a\n")
    with pytest.raises(ValueError, match="line 1: '# scrape t=x"):
        parse_scrapes("# scrape t=x\n")
    assert parse_scrapes("# scrape t=0 up=0 pod=a\n") == [Scrape(0.0, False, {"pod": "a"}, "\n")]


def test_the_committed_scrapes_of_a_real_run_fill_every_panel(tmp_path: Path) -> None:
    text = gzip.decompress(dashboard_png.SCRAPES.read_bytes()).decode()
    scrapes = parse_scrapes(text)
    db = TimeSeriesDB(scrapes)
    variables = {"namespace": scrapes[0].target["namespace"], "__rate_interval": "8s"}
    times = [2.0 * i for i in range(int(scrapes[-1].t / 2) + 1)]
    for p in dashboard_png.load_panels(DASHBOARD, variables):
        series = dashboard_png.series_of(p, db, times)
        assert any(v > 0 for vs in series.values() for v in vs if not math.isnan(v)), p.title
        if p.title == "Admission reviews by webhook and verdict":
            admissions = series
    # each refusal shows as a rate (a first count is a rise from the exported 0): the
    # pipeline refused at 12 and 60 s, the scale to 9 at 32 and 60 s; 1 in the 8 s window
    # extrapolated (Prometheus' rate) to 0.125-0.167/s while the window holds it
    for name, refused in (("validate-datapipeline denied", (12, 60)),
                          ("validate-pytorchjob-scale denied", (32, 60))):
        rising = [t for t, v in zip(times, admissions[name], strict=True) if v > 0]
        assert rising and all(any(r < t <= r + 10 for r in refused) for t in rising), name
        assert all(any(r < t <= r + 10 for t in rising) for r in refused), name
        assert max(v for v in admissions[name] if v > 0) == pytest.approx(1 / 6, abs=0.01)
    out = tmp_path / "d.png"
    dashboard_png.main(["--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size < 300_000
    committed = REPO / "docs" / "operator-dashboard.png"
    assert committed.stat().st_size < 300_000


def test_a_long_legend_names_the_series_that_leave_0() -> None:
    nan = math.nan
    few = {"error": [nan, 0.0, 0.0], "ok": [nan, 1.0, 2.0]}
    assert dashboard_png.legend_layout(few, 7.0) == (["error", "ok"], 4)  # all: one row
    many = {f"webhook-{i:02} denied": [nan, 0.0, 0.0] for i in range(18)}
    many["webhook-03 denied"] = [nan, 0.0, 0.125]
    many["no-value"] = [nan, nan, nan]  # not "at 0": it has no value at all
    # 17 characters x 0.055 + 0.45 = 1.385 in a column: 5 fit in 7 in, at most 4; so 5
    # rows for 19, more than 2
    assert dashboard_png.legend_layout(many, 7.0) == (
        ["webhook-03 denied", "no-value", "17 more at 0"], 4)
    assert dashboard_png.legend_layout(many, 3.0)[1] == 2  # 3 / 1.385
    assert dashboard_png.legend_layout(many, 1.0)[1] == 1
