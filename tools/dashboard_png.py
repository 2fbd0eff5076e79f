"""Draw the operator's Grafana dashboard (helm/datalane/dashboards/datalane-operator.json) as a
PNG from a scrape file of a real run, without Grafana or Prometheus: docs/operator-dashboard.png.

Not a Grafana screenshot: each panel of the dashboard JSON is drawn with matplotlib at its
``gridPos`` (24 columns; rows of 30 px as Grafana's), titled as there, its PromQL evaluated by
:mod:`tools.promql` (which refuses any form it does not implement, so that an edited dashboard
fails here instead of being drawn wrongly) every ``interval`` seconds, with
``$__rate_interval`` as Grafana sets it for that scrape interval (4 of them) and
``$namespace`` the scraped namespace. A ``stat`` panel shows its last value, coloured by its
thresholds, over a sparkline; a ``timeseries`` panel one line per series, named by the target's
``legendFormat``, in the panel's unit. Its legend, in as many columns as the longest name lets
fit, names every series, or where that takes more than two rows those that leave 0 in the run
and counts the others (the operator exports every known label set from 0, so most of its
webhook x verdict series stay there).

    python tools/dashboard_png.py [--scrapes tests/data/operator-dashboard.scrapes.gz] \\
        [--out docs/operator-dashboard.png]

The scrapes come from ``python -m tests.operator.dashboard_run`` (the operator on the test
control plane, docs/operator.md#operator-metrics).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.promql import (  # noqa: E402  (after the path, for `python tools/dashboard_png.py`)
    Expr,
    TimeSeriesDB,
    evaluate,
    parse,
    parse_scrapes,
    substitute,
)

DASHBOARD = ROOT / "helm" / "datalane" / "dashboards" / "datalane-operator.json"
SCRAPES = ROOT / "tests" / "data" / "operator-dashboard.scrapes.gz"
OUT = ROOT / "docs" / "operator-dashboard.png"
UNITS = {"s": "seconds", "ops": "ops/s", "reqps": "requests/s", "none": ""}
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 x scrape interval); with the
# step ($__interval) one scrape interval, as here, that is 4 of them
RATE_INTERVALS = 4


@dataclass
class Target:
    legend: str
    expr: str
    tree: Expr


@dataclass
class Panel:
    title: str
    kind: str  # "stat" or "timeseries"
    grid: tuple[int, int, int, int]  # x, y, w, h in Grafana's grid units
    unit: str
    targets: list[Target]
    thresholds: list[tuple[float, str]]  # (from value, colour), ascending


def load_panels(dashboard: dict[str, Any], variables: dict[str, str]) -> list[Panel]:
    """The dashboard's panels, every expression parsed (a ParseError names one that is not
    supported; a ValueError names a panel type or field this drawing does not know)."""
    panels = []
    for raw in dashboard.get("panels", []):
        title = raw.get("title", "")
        kind = raw.get("type")
        if kind not in ("stat", "timeseries"):
            raise ValueError(f"panel {title!r}: type {kind!r} is not drawn (stat, timeseries)")
        g = raw.get("gridPos", {})
        grid = (g.get("x"), g.get("y"), g.get("w"), g.get("h"))
        if not all(isinstance(v, int) and v >= 0 for v in grid) or grid[0] + grid[2] > 24:
            raise ValueError(f"panel {title!r}: gridPos {g!r} is not within 24 columns")
        defaults = raw.get("fieldConfig", {}).get("defaults", {})
        unit = defaults.get("unit", "none")
        if unit not in UNITS:
            raise ValueError(f"panel {title!r}: unit {unit!r} is not known ({', '.join(UNITS)})")
        steps = defaults.get("thresholds", {}).get("steps", [])
        thresholds = [(-math.inf if s.get("value") is None else float(s["value"]), s["color"])
                      for s in steps]
        targets = []
        for t in raw.get("targets", []):
            expr = t["expr"]
            targets.append(Target(t.get("legendFormat", ""), expr,
                                  parse(substitute(expr, variables))))
        if not targets:
            raise ValueError(f"panel {title!r} has no targets")
        panels.append(Panel(title, kind, grid, unit, targets, thresholds))
    return panels


def legend(fmt: str, labels: tuple[tuple[str, str], ...]) -> str:
    """Grafana's ``{{label}}`` substitution; without a format, the labels themselves."""
    d = dict(labels)
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m[1], ""), fmt)


def series_of(panel: Panel, db: TimeSeriesDB, times: list[float],
              ) -> dict[str, list[float]]:
    """Each legend's values at ``times`` (NaN where the expression has no value)."""
    out: dict[str, list[float]] = {}
    for target in panel.targets:
        for i, t in enumerate(times):
            for labels, v in evaluate(target.tree, db, t).items():
                out.setdefault(legend(target.legend, labels), [math.nan] * len(times))[i] = v
    return dict(sorted(out.items()))


GRAFANA_COLOURS = {"green": "#73bf69", "red": "#f2495c", "yellow": "#fade2a",
                   "orange": "#ff9830", "blue": "#5794f2"}
PALETTE = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9",
           "#705da0", "#508642", "#cca300"]  # Grafana's classic palette


WIDTH_IN, ROW_IN, HEADER_IN = 16.0, 0.3, 0.35  # Grafana: 24 columns, rows of 30 px
GAP_IN = 0.05  # between panels
# inside a panel: the title above the plot, tick labels left and below, the legend below
TITLE_IN, LEFT_IN, RIGHT_IN, TICKS_IN, LEGEND_ROW_IN = 0.3, 0.55, 0.15, 0.25, 0.17


def rate_interval(interval: float) -> str:
    """``$__rate_interval`` for scrapes every ``interval`` seconds, in whole milliseconds (the
    finest unit PromQL writes): ``8s`` for 2 s, ``400ms`` for 0.1 s (never rounded to ``0s``,
    which Prometheus refuses); ValueError below 1 ms."""
    ms = round(RATE_INTERVALS * interval * 1000)
    if ms < 1:
        raise ValueError(f"--interval {interval:g} gives a $__rate_interval of "
                         f"{RATE_INTERVALS * interval:g} s: under the 1 ms PromQL can write")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def render(dashboard: dict[str, Any], scrape_text: str, out: Path, interval: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    scrapes = parse_scrapes(scrape_text)
    if not scrapes:
        raise ValueError("the scrape file holds no scrapes")
    namespaces = {s.target.get("namespace", "") for s in scrapes}
    if len(namespaces) != 1:
        raise ValueError(f"the scrapes are of namespaces {sorted(namespaces)}; expected one")
    variables = {"namespace": namespaces.pop(),
                 "__rate_interval": rate_interval(interval)}
    panels = load_panels(dashboard, variables)
    db = TimeSeriesDB(scrapes)
    times = [i * interval for i in range(int(scrapes[-1].t / interval) + 1)]

    rows = max(p.grid[1] + p.grid[3] for p in panels)
    height_in = HEADER_IN + rows * ROW_IN
    fig = plt.figure(figsize=(WIDTH_IN, height_in), facecolor="#111217")
    fig.text(0.1 / WIDTH_IN, 1 - HEADER_IN / 2 / height_in,
             f"{dashboard.get('title', '')}   namespace = {variables['namespace']}   "
             f"(not a Grafana screenshot: the dashboard's panels drawn by tools/dashboard_png.py "
             f"from {len(scrapes)} scrapes of a real run, every {interval:g} s; x: seconds "
             f"into the run; $__rate_interval = {variables['__rate_interval']})",
             color="#ccccdc", fontsize=9, va="center")

    def box(x_in: float, top_in: float, w_in: float, h_in: float,
            ) -> tuple[float, float, float, float]:
        """Figure coordinates of a rectangle given in inches from the top-left corner."""
        return (x_in / WIDTH_IN, 1 - (top_in + h_in) / height_in, w_in / WIDTH_IN,
                h_in / height_in)

    for p in panels:
        x, y, w, h = p.grid
        cx, cy = x * WIDTH_IN / 24 + GAP_IN, HEADER_IN + y * ROW_IN + GAP_IN
        cw, ch = w * WIDTH_IN / 24 - 2 * GAP_IN, h * ROW_IN - 2 * GAP_IN
        fig.patches.append(Rectangle(box(cx, cy, cw, ch)[:2], cw / WIDTH_IN, ch / height_in,
                                     transform=fig.transFigure, facecolor="#181b1f",
                                     edgecolor="#2c3235", linewidth=0.8, zorder=-1))
        fig.text((cx + 0.1) / WIDTH_IN, 1 - (cy + TITLE_IN / 2) / height_in, p.title,
                 color="#ccccdc", fontsize=9.5, va="center", weight="bold")
        series = series_of(p, db, times)
        if p.kind == "stat":
            ax = fig.add_axes(box(cx + 0.1, cy + TITLE_IN, cw - 0.2, ch - TITLE_IN - 0.1))
        else:
            entries, columns = legend_layout(series, cw - LEFT_IN - RIGHT_IN)
            legend_rows = math.ceil(len(entries) / columns) if entries else 0
            bottom = TICKS_IN + legend_rows * LEGEND_ROW_IN + 0.05
            ax = fig.add_axes(box(cx + LEFT_IN, cy + TITLE_IN, cw - LEFT_IN - RIGHT_IN,
                                  ch - TITLE_IN - bottom))
        _draw(ax, p, series, times)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())
    plt.close(fig)


LEGEND_CHAR_IN, LEGEND_HANDLE_IN = 0.055, 0.45  # a character at fontsize 7; line and gap
LEGEND_MAX_ROWS = 2


def legend_layout(series: dict[str, list[float]], width_in: float) -> tuple[list[str], int]:
    """The legend's entries, and how many columns of the longest fit ``width_in`` (1 to 4).
    Every series, unless that takes more than two rows: then those that leave 0 somewhere,
    and ``N more at 0`` for the series that are 0 wherever they have a value."""
    def columns(entries: list[str]) -> int:
        longest = max((len(e) for e in entries), default=1)
        return max(1, min(4, int(width_in / (longest * LEGEND_CHAR_IN + LEGEND_HANDLE_IN))))

    entries = list(series)
    if math.ceil(len(entries) / columns(entries)) > LEGEND_MAX_ROWS:
        at_zero = [n for n, vs in series.items()
                   if all(v == 0 for v in vs if not math.isnan(v))
                   and not all(math.isnan(v) for v in vs)]
        entries = [n for n in series if n not in at_zero]
        if at_zero:
            entries.append(f"{len(at_zero)} more at 0")
    return entries, columns(entries)


def _draw(ax: Any, p: Panel, series: dict[str, list[float]], times: list[float]) -> None:
    ax.set_facecolor("#181b1f")
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(colors="#9fa7b3", labelsize=7, length=0)
    if p.kind == "stat":
        values = next(iter(series.values()), [])
        last = next((v for v in reversed(values) if not math.isnan(v)), math.nan)
        colour = "#ccccdc"
        for start, name in p.thresholds:
            if not math.isnan(last) and last >= start:
                colour = GRAFANA_COLOURS.get(name, name)
        ax.fill_between(times, [0 if math.isnan(v) else v for v in values], color=colour,
                        alpha=0.15, linewidth=0)
        ax.text(0.5, 0.5, "No data" if math.isnan(last) else f"{last:g}", color=colour,
                fontsize=40, ha="center", va="center", transform=ax.transAxes)
        ax.set_xlim(times[0], times[-1])
        ax.set_ylim(0, max([v for v in values if not math.isnan(v)], default=1) * 1.05)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    top = 0.0
    entries, columns = legend_layout(series, ax.get_position().width * ax.figure.get_figwidth())
    for i, (name, values) in enumerate(series.items()):
        ax.plot(times, values, color=PALETTE[i % len(PALETTE)], linewidth=1.3,
                label=name if name in entries else None)
        top = max([top, *(v for v in values if not math.isnan(v))])
    if len(entries) > sum(name in entries for name in series):  # "N more at 0"
        ax.plot([], [], color="#9fa7b3", linewidth=1.3, label=entries[-1])
    if not series:
        ax.text(0.5, 0.5, "No data", color="#9fa7b3", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlim(times[0], times[-1])
    top = top or 1.0
    ax.set_ylim(-0.03 * top, top * 1.08)  # a series at 0 stays visible above the axis
    ax.grid(color="#2c3235", linewidth=0.6)
    if UNITS[p.unit]:
        ax.set_ylabel(UNITS[p.unit], color="#9fa7b3", fontsize=7)
    if series:
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.1 if len(series) else 0),
                  fontsize=7, ncol=columns, frameon=False, labelcolor="#ccccdc",
                  borderaxespad=0, handlelength=1.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dashboard", type=Path, default=DASHBOARD)
    ap.add_argument("--scrapes", type=Path, default=SCRAPES, help="scrape file (.gz: gzipped)")
    ap.add_argument("--interval", type=float, default=2.0,
                    help="the scrapes' interval, seconds: the evaluation step")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if not (math.isfinite(args.interval) and args.interval > 0):
        ap.error(f"--interval {args.interval!r} is not a positive number of seconds")
    try:
        rate_interval(args.interval)
    except ValueError as e:
        ap.error(str(e))
    raw = args.scrapes.read_bytes()
    text = (gzip.decompress(raw) if args.scrapes.suffix == ".gz" else raw).decode()
    render(json.loads(args.dashboard.read_text()), text, args.out, args.interval)
    sys.stdout.write(f"{args.out}: {args.out.stat().st_size} bytes\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
