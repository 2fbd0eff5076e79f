"""The operator's Prometheus metrics: hand-worked counts and buckets in the text
format, read back by prometheus_client's parser, and served over real HTTP from the counts
that real reviews, reconciles and looks at a real store on disk make."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from datalane_operator.cli import main as operator_main
from datalane_operator.metrics import Metrics
from datalane_operator.pipeline import load_pipeline
from datalane_operator.policy import Policy
from datalane_operator.reconciler import look_at_store, store_progress
from datalane_operator.runtime import OperatorConfig, Runtime
from datalane_operator.stats import timed
from prometheus_client.parser import text_string_to_metric_families

from datalane.store import CheckpointStore
from tests.store.support import commit_steps

from .builders import dp

EMPTY_BUCKETS = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0",
                 "10.0", "+Inf"]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, by (name, sorted labels), as Prometheus' own parser reads the text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_hand_worked_counts_and_buckets() -> None:
    m = Metrics()
    m.reconciled("ok", 0.25)       # on a bound: le="0.25" counts it (less or equal)
    m.reconciled("ok", 3.0)
    m.reconciled("error", 2 ** -7)  # 0.0078125
    m.reviewed("inject-sidecar", "allowed", 2 ** -10)
    m.reviewed("inject-sidecar", "allowed", 0.5)
    m.reviewed("inject-sidecar", "denied", 0.0625)
    m.reviewed("validate-datapipeline", "error", 12.0)  # past every bound: +Inf only
    m.stored("look", "ok")
    m.stored("look", "ok")
    m.stored("look", "denied")
    m.stored("progress", "timeout")

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
        f'{p}reconciles_total{{outcome="error"}} 1',
        f'{p}reconciles_total{{outcome="ok"}} 2',
        f"# HELP {p}reconcile_duration_seconds Duration of reconciles.",
        f"# TYPE {p}reconcile_duration_seconds histogram",
        #    0.005 .01 .025 .05 .1 .25 .5 1 2.5 5 10 +Inf
        *hist(f"{p}reconcile_duration_seconds", "",
              [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3], "3.2578125"),
        f"# HELP {p}admissions_total Admission reviews answered, by webhook and verdict.",
        f"# TYPE {p}admissions_total counter",
        f'{p}admissions_total{{webhook="inject-sidecar",verdict="allowed"}} 2',
        f'{p}admissions_total{{webhook="inject-sidecar",verdict="denied"}} 1',
        f'{p}admissions_total{{webhook="validate-datapipeline",verdict="error"}} 1',
        f"# HELP {p}webhook_duration_seconds Time to answer an admission review, by webhook.",
        f"# TYPE {p}webhook_duration_seconds histogram",
        *hist(f"{p}webhook_duration_seconds", 'webhook="inject-sidecar"',
              [1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3], "0.5634765625"),
        *hist(f"{p}webhook_duration_seconds", 'webhook="validate-datapipeline"',
              [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], "12.0"),
        f"# HELP {p}store_operations_total Operations on checkpoint stores, by kind (look, "
        f"progress) and outcome.",
        f"# TYPE {p}store_operations_total counter",
        f'{p}store_operations_total{{kind="look",outcome="denied"}} 1',
        f'{p}store_operations_total{{kind="look",outcome="ok"}} 2',
        f'{p}store_operations_total{{kind="progress",outcome="timeout"}} 1',
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


def test_requests_to_made_up_paths_share_one_label() -> None:
    """kopf's server passes any path as the webhook id: 1000 made-up ones make one series."""
    m = Metrics()
    for i in range(1000):
        m.reviewed(f"made-up-{i}", "error", 0.001)
    m.reviewed("validate-pytorchjob-scale", "allowed", 0.001)
    assert m.admissions == {(("webhook", "unknown"), ("verdict", "error")): 1000,
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
                  if name == f"{p}admissions_total"}
    assert admissions == {(("verdict", "allowed"), ("webhook", "inject-sidecar")): 1,
                          (("verdict", "denied"), ("webhook", "inject-sidecar")): 1,
                          (("verdict", "error"), ("webhook", "validate-pytorchjob")): 1}
    assert got[(f"{p}webhook_duration_seconds_count", (("webhook", "inject-sidecar"),))] == 2
    stores = {labels: v for (name, labels), v in got.items()
              if name == f"{p}store_operations_total"}
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
