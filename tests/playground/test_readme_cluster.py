"""The README's "On a cluster" section, run as written against ``make playground``.

The console block is read from README.md and each command runs verbatim with ``bash -c``, in
the repository root, with the KUBECONFIG the playground prints (and its kubectl and helm first
on PATH). ``make playground`` and ``make playground-down`` are what the Makefile runs for them
(``python -m playground up``/``down`` with this interpreter). Then the test checks what the
section claims:

* the chart's ``helm install`` runs the operator in the cluster and the job's pods get the
  injected native sidecar (the chart's default sidecar image, built here), which really serves;
* ``kubectl get dp`` prints the columns the README names;
* after ``kubectl scale ... --replicas=3`` and the restart, the 3 workers resume at a committed
  step no older than the status's ``lastCommittedStep`` before the scale, with 2, 3 and 3 lanes,
  and every step's global batch (the hash of the 8 lane digests the workers print) equals an
  uninterrupted 4-rank run of the same recipe over the playground's corpus, before and after;
* ``kubectl scale ... --replicas=9`` is refused with the scale guard's message.

It takes several minutes (the images are rebuilt when the tree changed).
"""

from __future__ import annotations

import json

import pytest

from playground.__main__ import export_line

from .session import running_playground
from .trainers import check_resumed, console_block, pod_log, records, wait_for_steps

pytestmark = [pytest.mark.cluster, pytest.mark.containers, pytest.mark.slow]
AFTER = 8  # steps the resumed workers read before the comparison


def test_readme_cluster_section() -> None:
    commands = console_block()
    assert commands[0].split("#")[0].strip() == "make playground"
    assert commands[-1].split("#")[0].strip() == "make playground-down"
    assert commands[1].strip() == export_line(), "the README's KUBECONFIG line"
    with running_playground() as (up, sh):
        # what `make playground` prints
        assert up.stdout.strip().splitlines()[-1] == export_line()
        committed_before = -1
        for cmd in commands[2:-1]:
            if "--replicas=3" in cmd:
                committed_before = int(sh.status("pretrain", "lastCommittedStep"))
            res = sh(cmd)
            refused = "--replicas=9" in cmd
            assert (res.returncode != 0) == refused, f"$ {cmd}\n{res.stdout}\n{res.stderr}"
        out = dict(sh.ran)

        # helm install: the operator runs in the cluster, from the chart, on the node
        pods = json.loads(sh("kubectl get pods -n datalane-system -o json").stdout)["items"]
        operators = [p for p in pods if p["metadata"]["name"].startswith("datalane-")
                     and "certs" not in p["metadata"]["name"]]
        assert len(operators) == 2 and all(p["status"]["phase"] == "Running"
                                           for p in operators), operators

        # the injection: the README's command shows it, the stored pod has it
        (shown,) = [r.stdout for c, r in out.items() if "initContainers" in c]
        assert "datalane-sidecar" in shown.split(), shown
        pod = json.loads(sh("kubectl get pod llama-worker-0 -o json").stdout)
        (side,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "datalane-sidecar"]
        assert side["restartPolicy"] == "Always"
        assert side["image"] == "ghcr.io/datalane/datalane-sidecar:0.1.0"
        env_of = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env_of["DATALANE_SOCKET"] == "/var/run/datalane/datalane.sock"

        # kubectl get dp: the columns the README names
        (get_dp,) = [(c, r) for c, r in out.items() if c.split("#")[0].strip() == "kubectl get dp"]
        assert get_dp[1].stdout.split("\n")[0].split() == get_dp[0].split("#")[1].split()

        # the refusal of 9
        (nine,) = [r for c, r in out.items() if "--replicas=9" in c]
        assert "8 lanes cannot be split over 9 workers; use 1 to 8" in " ".join(
            nine.stderr.split()), nine.stderr
        assert (sh.status("pretrain", "worldSize"),
                sh.status("pretrain", "lanesPerRank")) == ("3", "2-3")

        # the resumed workers: 3 of them, from a committed step, the same global batches
        new = {p["metadata"]["name"]: p["metadata"]["uid"] for p in json.loads(sh(
            "kubectl get pods -l training.kubeflow.org/job-name=llama -o json").stdout)["items"]}
        assert sorted(new) == [f"llama-worker-{i}" for i in range(3)]
        first_runs = [records(pod_log("default", f"llama-worker-{i}", "pytorch"))
                      for i in range(4)]
        runs = wait_for_steps([pod_log("default", name, "pytorch", again=uid)
                               for name, uid in new.items()], AFTER, timeout=420)
        check_resumed(first_runs, runs, world=3, committed_before=committed_before,
                      lanes_per_rank=[2, 3, 3], reference_world=4, after_steps=AFTER)
