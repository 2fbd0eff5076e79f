"""The operator's Prometheus metrics: hand-worked counts and buckets in the text
format, read back by prometheus_client's parser, every known label set exported from 0, and
served over real HTTP from the counts that real reviews, reconciles and looks at a real store
on disk make."""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from datalane_operator.cli import main as operator_main
from datalane_operator.metrics import Metrics, Outcome, StoreKind, StoreOutcome, Verdict
from datalane_operator.names import WEBHOOKS
from datalane_operator.pipeline import load_pipeline
from datalane_operator.policy import Policy
from datalane_operator.reconciler import look_at_store, store_progress
from datalane_operator.runtime import OperatorConfig, Runtime
from datalane_operator.stats import timed
from prometheus_client.parser import text_string_to_metric_families

from datalane.store import CheckpointStore
from tests.store.support import commit_steps

from .builders import dp

# the vocabularies as docs/operator.md lists them: the enums must say the same
OUTCOMES = {"ok", "error"}
VERDICTS = {"allowed", "denied", "error"}
STORE_KINDS = {"look", "progress"}
STORE_OUTCOMES = {"ok", "error", "timeout", "denied"}
EMPTY_BUCKETS = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0",
                 "10.0", "+Inf"]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, by (name, sorted labels), as Prometheus' own parser reads the text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def counter(name: str, label_names: tuple[str, str] | tuple[str],
            vocabularies: tuple[set[str], ...], counted: dict[tuple[str, ...], int]) -> list[str]:
    """The sample lines of a counter: every combination of the vocabularies, sorted, at
    its ``counted`` value (hand-worked), else 0."""
    assert set(counted) <= set(itertools.product(*vocabularies))
    out = []
    for values in itertools.product(*(sorted(v) for v in vocabularies)):
        labels = ",".join(f'{k}="{v}"' for k, v in zip(label_names, values, strict=True))
        out.append(f"{name}{{{labels}}} {counted.get(values, 0)}")
    return out


def test_hand_worked_counts_and_buckets() -> None:
    m = Metrics()
    m.reconciled(Outcome.OK, 0.25)       # on a bound: le="0.25" counts it (less or equal)
    m.reconciled(Outcome.OK, 3.0)
    m.reconciled(Outcome.ERROR, 2 ** -7)  # 0.0078125
    m.reviewed("inject-sidecar", Verdict.ALLOWED, 2 ** -10)
    m.reviewed("inject-sidecar", Verdict.ALLOWED, 0.5)
    m.reviewed("inject-sidecar", Verdict.DENIED, 0.0625)
    m.reviewed("validate-datapipeline", Verdict.ERROR, 12.0)  # past every bound: +Inf only
    m.stored(StoreKind.LOOK, StoreOutcome.OK)
    m.stored(StoreKind.LOOK, StoreOutcome.OK)
    m.stored(StoreKind.LOOK, StoreOutcome.DENIED)
    m.stored(StoreKind.PROGRESS, StoreOutcome.TIMEOUT)

    def hist(name: str, labels: str, cumulative: list[int], total: str) -> list[str]:
        sep = "," if labels else ""
        return [*(f'{name}_bucket{{{labels}{sep}le="{le}"}} {n}'
                  for le, n in zip(EMPTY_BUCKETS, cumulative, strict=True)),
                f"{name}_sum{{{labels}}} {total}" if labels else f"{name}_sum {total}",
                f"{name}_count{{{labels}}} {cumulative[-1]}" if labels
                else f"{name}_count {cumulative[-1]}"]

    p = "datalane_operator_"
    expected = [
        f"# HELP {p}reconciles_total Finished reconciles of DataPipelines, by outcome.",
        f"# TYPE {p}reconciles_total counter",
        *counter(f"{p}reconciles_total", ("outcome",), (OUTCOMES,),
                 {("error",): 1, ("ok",): 2}),
        f"# HELP {p}reconcile_duration_seconds Duration of reconciles.",
        f"# TYPE {p}reconcile_duration_seconds histogram",
        #    0.005 .01 .025 .05 .1 .25 .5 1 2.5 5 10 +Inf
        *hist(f"{p}reconcile_duration_seconds", "",
              [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3], "3.2578125"),
        f"# HELP {p}admissions_total Admission reviews answered, by webhook and verdict.",
        f"# TYPE {p}admissions_total counter",
        *counter(f"{p}admissions_total", ("webhook", "verdict"), (set(WEBHOOKS), VERDICTS),
                 {("inject-sidecar", "allowed"): 2, ("inject-sidecar", "denied"): 1,
                  ("validate-datapipeline", "error"): 1}),
        f"# HELP {p}webhook_duration_seconds Time to answer an admission review, by webhook.",
        f"# TYPE {p}webhook_duration_seconds histogram",
        *hist(f"{p}webhook_duration_seconds", 'webhook="inject-sidecar"',
              [1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3], "0.5634765625"),
        *hist(f"{p}webhook_duration_seconds", 'webhook="validate-datapipeline"',
              [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], "12.0"),
        f"# HELP {p}store_operations_total Operations on checkpoint stores, by kind (look, "
        f"progress) and outcome.",
        f"# TYPE {p}store_operations_total counter",
        *counter(f"{p}store_operations_total", ("kind", "outcome"),
                 (STORE_KINDS, STORE_OUTCOMES),
                 {("look", "denied"): 1, ("look", "ok"): 2, ("progress", "timeout"): 1}),
        f"# HELP {p}leader 1 while this replica is the leader (it reconciles).",
        f"# TYPE {p}leader gauge",
        f"{p}leader 1",
    ]
    text = m.render(leading=True)
    assert text.splitlines() == expected
    assert text.endswith("\n")
    got = samples(m.render(leading=False))
    assert got[(f"{p}leader", ())] == 0
    assert got[(f"{p}webhook_duration_seconds_count", (("webhook", "inject-sidecar"),))] == 3
    assert got[(f"{p}reconciles_total", (("outcome", "ok"),))] == 2
    assert got[(f"{p}admissions_total",
                (("verdict", "denied"), ("webhook", "validate-pytorchjob-scale")))] == 0


def test_a_fresh_operator_exports_every_known_label_set_at_0() -> None:
    """So that ``rate`` sees a first count as a rise from 0 (a series that appears at 1 has
    no earlier sample to rise from): every outcome, every webhook x verdict, every store kind
    x outcome - but not the ``unknown`` webhook of made-up paths, never requested yet."""
    assert {str(v) for v in Outcome} == OUTCOMES and {str(v) for v in Verdict} == VERDICTS
    assert {str(v) for v in StoreKind} == STORE_KINDS
    assert {str(v) for v in StoreOutcome} == STORE_OUTCOMES
    assert len(WEBHOOKS) == 6
    got = samples(Metrics().render(leading=False))
    p = "datalane_operator_"

    def series(name: str) -> dict[tuple[str, ...], float]:
        return {tuple(v for _, v in labels): value for (n, labels), value in got.items()
                if n == p + name}

    assert series("reconciles_total") == {(o,): 0 for o in OUTCOMES}
    # parsed labels come sorted by name: (verdict, webhook), (kind, outcome)
    assert series("admissions_total") == {(v, w): 0 for v in VERDICTS for w in WEBHOOKS}
    assert len(series("admissions_total")) == 18
    assert series("store_operations_total") == {(k, o): 0 for k in STORE_KINDS
                                                for o in STORE_OUTCOMES}
    assert not series("webhook_duration_seconds_count")  # a histogram: from its first review
    m = Metrics()
    m.reviewed("no-such-webhook", Verdict.ALLOWED, 0.001)
    assert samples(m.render(leading=False))[
        (f"{p}admissions_total", (("verdict", "allowed"), ("webhook", "unknown")))] == 1


def test_a_value_outside_the_vocabulary_is_still_counted() -> None:
    """The types refuse it (mypy); at run time it gets a series of its own rather than an
    exception, which would fail the review or the store look being counted."""
    m = Metrics()
    m.reviewed("inject-sidecar", "maybe", 0.001)  # type: ignore[arg-type]
    m.stored(StoreKind.LOOK, "lost")  # type: ignore[arg-type]
    got = samples(m.render(leading=False))
    p = "datalane_operator_"
    assert got[(f"{p}admissions_total", (("verdict", "maybe"), ("webhook", "inject-sidecar")))] == 1
    assert got[(f"{p}store_operations_total", (("kind", "look"), ("outcome", "lost")))] == 1
    assert got[(f"{p}store_operations_total", (("kind", "look"), ("outcome", "ok")))] == 0


def test_requests_to_made_up_paths_share_one_label() -> None:
    """kopf's server passes any path as the webhook id: 1000 made-up ones make one series."""
    m = Metrics()
    for i in range(1000):
        m.reviewed(f"made-up-{i}", Verdict.ERROR, 0.001)
    m.reviewed("validate-pytorchjob-scale", Verdict.ALLOWED, 0.001)
    assert len(m.admissions) == 6 * 3 + 1
    counted = {k: n for k, n in m.admissions.items() if n}
    assert counted == {(("webhook", "unknown"), ("verdict", "error")): 1000,
                       (("webhook", "validate-pytorchjob-scale"), ("verdict", "allowed")): 1}
    assert sorted(m.webhook_seconds) == [(("webhook", "unknown"),),
                                         (("webhook", "validate-pytorchjob-scale"),)]


def test_an_operator_with_nothing_done_yet_lists_every_family() -> None:
    names = {f.name for f in text_string_to_metric_families(Metrics().render(leading=False))}
    assert names == {"datalane_operator_reconciles", "datalane_operator_reconcile_duration_seconds",
                     "datalane_operator_admissions", "datalane_operator_webhook_duration_seconds",
                     "datalane_operator_store_operations", "datalane_operator_leader"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_served_over_http_from_real_work(tmp_path: Path) -> None:
    """Reviews through the timed review function, reconciles through the coalescer (one
    fails), looks at a real store on disk (one allowed, one denied by the cluster policy) and
    the recipe guard's read of a run's progress, then ``GET /metrics``."""
    store = tmp_path / "store"
    commit_steps(CheckpointStore(str(store)), [100, 200, 300])
    body = dp(checkpoint={"uri": str(store), "keep": 2})
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    runs = 0

    async def reconcile(rt: Any, key: tuple[str, str]) -> None:
        nonlocal runs
        runs += 1
        if runs == 2:
            raise RuntimeError("API server unavailable")

    async def kopf_fn(request: Any, **kw: Any) -> Any:
        if kw["webhook"] == "validate-pytorchjob":
            raise ValueError("kopf could not answer")
        return {"response": {"allowed": request["allow"]}}

    async def scenario() -> tuple[str, str]:
        rt = Runtime(OperatorConfig(policy=Policy(allow_operator_identity=True),
                                    metrics_endpoint=url), reconcile=reconcile)
        await rt.serve_metrics()
        review = timed(kopf_fn, rt.clock, rt.reviewed)
        await review({"allow": True}, webhook="inject-sidecar")
        await review({"allow": False}, webhook="inject-sidecar")
        with pytest.raises(ValueError):
            await review({"allow": True}, webhook="validate-pytorchjob")
        for _ in range(2):
            rt.kick(("ml", "pretrain"))
            while rt.reconciles.running:
                await asyncio.sleep(0.01)
        listing = await look_at_store(rt, load_pipeline(body))
        assert listing.ok and listing.committed == [200, 300] and listing.deleted == [100]
        assert (await store_progress(rt, body)).step == 300
        rt.config.policy = Policy()  # the operator's identity may no longer act: untouched
        assert (await look_at_store(rt, load_pipeline(body))).denied
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            text, ctype = await resp.text(), resp.headers["Content-Type"]
        await rt.stop()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as session, session.get(url):
                pass
        return text, ctype

    text, ctype = asyncio.run(scenario())
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    got = samples(text)
    p = "datalane_operator_"
    assert got[(f"{p}reconciles_total", (("outcome", "ok"),))] == 1
    assert got[(f"{p}reconciles_total", (("outcome", "error"),))] == 1
    assert got[(f"{p}reconcile_duration_seconds_count", ())] == 2
    admissions = {labels: v for (name, labels), v in got.items()
                  if name == f"{p}admissions_total" and v}
    assert admissions == {(("verdict", "allowed"), ("webhook", "inject-sidecar")): 1,
                          (("verdict", "denied"), ("webhook", "inject-sidecar")): 1,
                          (("verdict", "error"), ("webhook", "validate-pytorchjob")): 1}
    assert got[(f"{p}webhook_duration_seconds_count", (("webhook", "inject-sidecar"),))] == 2
    stores = {labels: v for (name, labels), v in got.items()
              if name == f"{p}store_operations_total" and v}
    assert stores == {(("kind", "look"), ("outcome", "ok")): 1,
                      (("kind", "look"), ("outcome", "denied")): 1,
                      (("kind", "progress"), ("outcome", "ok")): 1}
    assert got[(f"{p}leader", ())] == 1  # no Lease configured: this process leads


@pytest.mark.parametrize("endpoint", ["0.0.0.0:8081", "https://0.0.0.0:8081/metrics",
                                      "http://0.0.0.0/metrics", "http://0.0.0.0:x/metrics"])
def test_run_refuses_a_bad_metrics_endpoint_before_starting(
        endpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert operator_main(["run", "--tls-dir", str(tmp_path), "--metrics", endpoint]) == 2
    assert (f"datalane-operator run: --metrics {endpoint!r} is not http://HOST:PORT/PATH"
            in capsys.readouterr().err)


def test_docs_list_every_metric() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text()
    section = doc.split("## Operator metrics", 1)[1].split("\n## ", 1)[0]
    listed = {m for m in re.findall(r"^\| `(datalane_operator_\w+)", section, re.M)}
    exported = set(re.findall(r"^# TYPE (\S+) ", Metrics().render(leading=False), re.M))
    assert listed == exported


def test_docs_list_every_label_value() -> None:
    """Each counter's row names every value of its vocabulary (and of the webhook ids)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text()
    section = doc.split("## Operator metrics", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): set(re.findall(r"`([a-z-]+)`", m.group(2)))
            for m in re.finditer(r"^\| `datalane_operator_(\w+)\{.*?\|(.*)$", section, re.M)}
    assert rows["reconciles_total"] >= OUTCOMES
    assert set(WEBHOOKS) | {"unknown"} | VERDICTS <= rows["admissions_total"]
    assert rows["store_operations_total"] >= STORE_KINDS | STORE_OUTCOMES
