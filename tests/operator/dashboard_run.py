"""A short run of the operator on the test control plane whose /metrics are scraped, for the
rendering of the Grafana dashboard in docs/operator.md (tools/dashboard_png.py draws it).

The stack of the e2e tests (:func:`tests.operator.stack.datalane_stack`): the Helm chart, two
``datalane-operator run`` replicas electing a leader, the training-operator and kwok. Each
replica's ``/metrics`` is scraped every ``--interval`` seconds, as Prometheus would, into a
scrape file (tools/promql.py's format: each scrape under a ``# scrape t=... up=...
namespace=... pod=...`` header, the labels a ServiceMonitor's discovery attaches; ``up=0``
when the replica did not answer). The scenario, in order:

* a DataPipeline ``pretrain`` (its checkpoint store on the operator's disk, allowed) and a
  PyTorchJob of 2 workers: reviews of the pipeline and of the injected pods, reconciles,
  storage looks every 2 s;
* a DataPipeline whose store is outside the cluster policy's prefixes for the operator's
  own identity, refused (``validate-datapipeline`` denied), twice;
* a DataPipeline ``elsewhere`` whose store's Secret does not exist: its looks are ``denied``;
* bursts of 10 pods of the job (held by a scheduling gate) through the injection webhook;
* scales of the job: to 3 (allowed), to 9 (8 lanes: refused), back to 2;
* recipe edits of ``pretrain`` (the admission reads the run's progress from its store);
* the leader killed (SIGKILL) half way: the other replica takes the Lease; the killed one is
  started again 20 s later (its counters start from 0: a counter reset).

    PYTHONPATH=$PWD:$PWD/sidecar:$PWD/operator .venv/bin/python -m \\
        tests.operator.dashboard_run --out tests/data/operator-dashboard.scrapes.gz
"""

from __future__ import annotations

import argparse
import copy
import gzip
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from datalane_operator import names

from playground.cluster import Cluster, ClusterOptions, ensure_binaries

from .builders import RECIPE
from .stack import Replica, Stack, datalane_stack
from .test_e2e import pipeline, pytorchjob


class Scraper:
    """Scrapes every replica's /metrics each ``interval`` seconds on a thread."""

    def __init__(self, stack: Stack, interval: float) -> None:
        self.stack, self.interval = stack, interval
        self.lines: list[str] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _scrape(self, r: Replica) -> None:
        t = self.now()
        try:
            with urllib.request.urlopen(r.metrics_url, timeout=self.interval * 0.75) as resp:
                text = resp.read().decode()
            up = 1
        except OSError:
            text, up = "", 0
        self.lines.append(f"# scrape t={t:.3f} up={up} namespace={self.stack.namespace} "
                          f"pod={r.identity}")
        self.lines.extend(text.splitlines())

    def _run(self) -> None:
        tick = 0
        while not self._stop.is_set():
            for r in self.stack.replicas:
                self._scrape(r)
            tick += 1
            self._stop.wait(max(0.0, self.t0 + tick * self.interval - time.monotonic()))

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def leader(stack: Stack) -> Replica | None:
    for r in stack.replicas:
        try:
            if r.alive and r.metrics()[("datalane_operator_leader", ())] == 1:
                return r
        except OSError:
            pass
    return None


def scenario(c: Cluster, stack: Stack, scraper: Scraper, log: Any) -> None:
    ns, workdir = stack.namespace, stack.log.parent

    def at(t: float, what: str) -> None:  # wait until t seconds into the scrapes
        time.sleep(max(0.0, t - scraper.now()))
        log(f"[{scraper.now():6.1f}s] {what}")

    def pod_burst(first: int) -> None:
        pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": f"extra-worker-{i}", "labels": {
                        names.JOB_NAME_LABEL: "train", names.REPLICA_INDEX_LABEL: str(i)}},
                 "spec": {"schedulingGates": [{"name": "datalane.io/dashboard"}],
                          "containers": [{"name": "pytorch", "image": "x:1", "env": [
                              {"name": "PET_NPROC_PER_NODE", "value": "1"}]}]}}
                for i in range(first, first + 10)]
        submit({"apiVersion": "v1", "kind": "List", "items": pods})

    def submit(obj: dict[str, Any]) -> None:
        """Apply ``obj``; what the API server said, logged (a refusal is part of the run)."""
        out = c.kubectl("apply", "--server-side", "--field-manager=e2e", "-n", ns, "-f", "-",
                        input=_yaml(obj), check=False)
        log(f"         {'applied' if out.returncode == 0 else out.stderr.strip()[:300]}")

    def refused_store() -> None:  # valid for the CRD's schema, refused by the webhook
        submit(pipeline("outside", "other", copy.deepcopy(RECIPE),
                        {"uri": "file:///var/tmp/datalane-dashboard-outside/store"}))

    def edit_recipe(seed: int) -> None:
        recipe = copy.deepcopy(RECIPE)
        recipe["seed"] = seed
        submit(pipeline("pretrain", "train", recipe, {"uri": f"file://{workdir}/store"}))

    def scale(n: int) -> None:
        out = c.kubectl("scale", "pytorchjob", "train", f"--replicas={n}", "-n", ns,
                        check=False)
        log(f"         scale to {n}: "
            f"{'done' if out.returncode == 0 else out.stderr.strip()[:300]}")

    at(4, "DataPipeline pretrain and PyTorchJob train (2 workers)")
    edit_recipe(RECIPE["seed"])
    submit(pytorchjob("train", 2))
    at(12, "a store outside the cluster policy's prefixes (refused)")
    refused_store()
    at(18, "DataPipeline elsewhere: its store's Secret does not exist")
    submit(pipeline("elsewhere", "other", copy.deepcopy(RECIPE), {
        "uri": "s3://dashboard/ckpt", "secretRef": {"name": "not-created"},
        "endpoint": "http://127.0.0.1:9"}))
    at(24, "10 pods through the injection webhook")
    pod_burst(10)
    at(32, "scale to 3; then to 9 (refused)")
    scale(3)
    scale(9)
    at(38, "recipe edit (the run's progress read from its store)")
    edit_recipe(6)
    at(44, "10 pods")
    pod_burst(20)
    victim = leader(stack)
    at(52, f"SIGKILL the leader ({victim.identity if victim else 'none found'})")
    if victim is not None:
        victim.kill()
    at(60, "scale to 9 (refused), a store outside the prefixes (refused)")
    scale(9)
    refused_store()
    at(72, "the killed replica started again")
    if victim is not None:
        victim.start()
    at(80, "10 pods, scale to 2")
    pod_burst(30)
    scale(2)
    at(90, "recipe edit")
    edit_recipe(7)
    at(96, "10 pods")
    pod_burst(40)
    at(110, "end")


def _yaml(obj: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(obj)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the scrape file (.gz: gzipped)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between scrapes")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    with Cluster(ClusterOptions(), bin_dir=ensure_binaries(log=log)) as c, \
            tempfile.TemporaryDirectory(prefix="datalane-dashboard-") as tmp:
        c.start_training_operator()
        with c.namespace("datalane-dashboard") as ns, datalane_stack(
                c, ns, Path(tmp), storage_interval=2.0, replicas=2, release="dl",
                lease_timings=(6.0, 4.0, 0.5)) as stack:
            with Scraper(stack, args.interval) as scraper:
                scenario(c, stack, scraper, log)
            text = "\n".join(scraper.lines) + "\n"
    data = text.encode()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(gzip.compress(data, mtime=0) if args.out.suffix == ".gz" else data)
    log(f"{args.out}: {sum(ln.startswith('# scrape ') for ln in scraper.lines)} scrapes, "
        f"{len(data)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
