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
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from datalane.runner import run_world
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from playground.__main__ import FOLDER, export_line, read_state

pytestmark = [pytest.mark.cluster, pytest.mark.containers, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
AFTER = 8  # steps the resumed workers read before the comparison


def console_block() -> list[str]:
    """The commands of the console block of README.md's "On a cluster" section (comment-only
    continuation lines dropped, backslash continuations joined)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## On a cluster\n"):]
    section = section[:section.index("\n## ", 3)]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    block = re.sub(r"\\\n\s*", "", block)  # a line ending in a backslash goes on
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.startswith("{")]


def steps_of(runs: list[list[dict[str, Any]]]) -> dict[int, dict[int, bytes]]:
    """step -> lane -> digest, from the workers' step records (a step read twice, by a trainer
    restarted in its pod, must read the same)."""
    out: dict[int, dict[int, bytes]] = {}
    for run in runs:
        for rec in run:
            if "lanes" not in rec:
                continue
            lanes = out.setdefault(rec["step"], {})
            for k, v in rec["lanes"].items():
                assert lanes.setdefault(int(k), bytes.fromhex(v)) == bytes.fromhex(v), rec
    return out


def global_hashes(steps: dict[int, dict[int, bytes]]) -> dict[int, str]:
    return {s: global_hash(d[k] for k in sorted(d)) for s, d in steps.items() if len(d) == 8}


def local_recipe() -> dict[str, Any]:
    """examples/pretrain.yaml's recipe over the playground's local copy of the corpus."""
    docs = list(yaml.safe_load_all((ROOT / "examples/pretrain.yaml").read_text()))
    spec = next(d for d in docs if d["kind"] == "DataPipeline")["spec"]
    text = json.dumps(spec["recipe"]).replace("s3://playground/corpus", str(FOLDER / "corpus"))
    return {**json.loads(text), "lanes": spec["lanes"],
            "global_batch_size": spec["globalBatchSize"]}


def test_readme_cluster_section() -> None:
    commands = console_block()
    assert commands[0].split("#")[0].strip() == "make playground"
    assert commands[-1].split("#")[0].strip() == "make playground-down"
    assert commands[1].strip() == export_line(), "the README's KUBECONFIG line"
    if read_state() is not None:
        pytest.fail("a playground runs already (this test starts its own): "
                    "make playground-down first")
    py = [sys.executable, "-m", "playground"]
    up = subprocess.run([*py, "up"], cwd=ROOT, capture_output=True, text=True, timeout=1500,
                        check=False)
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout.strip().splitlines()[-1] == export_line()  # what `make playground` prints
    state = read_state()
    assert state is not None
    env = {**os.environ, "KUBECONFIG": state["kubeconfig"],
           "PATH": f"{state['bin']}{os.pathsep}{os.environ['PATH']}"}

    def sh(cmd: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def status(field: str) -> str:
        return sh(f"kubectl get dp pretrain -o jsonpath='{{.status.{field}}}'").stdout

    out: dict[str, subprocess.CompletedProcess[str]] = {}
    committed_before = -1
    try:
        for cmd in commands[2:-1]:
            if "--replicas=3" in cmd:
                committed_before = int(status("lastCommittedStep"))
            out[cmd] = res = sh(cmd)
            refused = "--replicas=9" in cmd
            assert (res.returncode != 0) == refused, f"$ {cmd}\n{res.stdout}\n{res.stderr}"

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
        assert (status("worldSize"), status("lanesPerRank")) == ("3", "2-3")

        # the resumed workers: 3 of them, from a committed step, the same global batches
        new = {p["metadata"]["name"]: p["metadata"]["uid"] for p in json.loads(sh(
            "kubectl get pods -l training.kubeflow.org/job-name=llama -o json").stdout)["items"]}
        assert sorted(new) == [f"llama-worker-{i}" for i in range(3)]
        pods_dir = FOLDER / "pods"
        first_runs = [records(pods_dir / f"default_llama-worker-{i}" / "pytorch.log")
                      for i in range(4)]
        second = {name: pods_dir / f"default_{name}_{uid[:8]}" / "pytorch.log"
                  for name, uid in new.items()}
        deadline = time.monotonic() + 420
        while True:
            runs = [records(path) for path in second.values()]
            starts = [r[0] for r in runs if r]
            if len(starts) == 3 and all(
                    len([x for x in r if "lanes" in x]) >= AFTER for r in runs):
                break
            assert time.monotonic() < deadline, f"the resumed workers did not read {AFTER} " \
                f"steps:\n" + "\n".join(p.read_text()[-2000:] for p in second.values()
                                        if p.exists())
            time.sleep(2)
        resume = {s["resume"] for s in starts}
        assert len(resume) == 1 and {s["world"] for s in starts} == {3}, starts
        (step,) = resume
        assert step is not None and step >= committed_before >= 4, (step, committed_before)
        for run in runs:
            assert next(x for x in run if "lanes" in x)["step"] == step
        lanes_per_rank = sorted(len(next(x for x in r if "lanes" in x)["lanes"]) for r in runs)
        assert lanes_per_rank == [2, 3, 3]
        before, after = global_hashes(steps_of(first_runs)), global_hashes(steps_of(runs))
        assert sorted(before)[:4] == [0, 1, 2, 3] and max(before) >= step - 1
        assert min(after) == step and len(after) >= AFTER
        reference = run_world(load_recipe(local_recipe()), 4, Knobs(workers=1),
                              max(after) + 1).hashes
        assert before == {s: reference[s] for s in before}
        assert after == {s: reference[s] for s in after}
    except BaseException:
        sys.stderr.write("\n".join(f"$ {c}\n{r.stdout}{r.stderr}" for c, r in out.items()))
        log = FOLDER / "playground.log"
        if log.exists():
            sys.stderr.write(log.read_text(errors="replace")[-6000:])
        raise
    finally:
        down = subprocess.run([*py, "down"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, check=False)
        assert down.returncode == 0, down.stdout + down.stderr
    assert not FOLDER.exists()
    assert not re.search(r"dlp-", subprocess.run(
        ["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
        check=False, env={**os.environ, "CONTAINERS_CONF": str(ROOT / "images/containers.conf")},
    ).stdout)
