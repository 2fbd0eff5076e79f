"""The playground's trainers, read back: what examples/pretrain.yaml's ``train.py`` prints in
each pod, and the checks that a resized job resumed with the same global batches. Shared by
test_readme_cluster.py (a PyTorchJob scaled 4 -> 3) and test_trainjob_resize.py (a TrainJob
resized 3 -> 2 under Trainer v2 and JobSet).

``train.py`` prints a JSON line when it starts (``resume``: the step it resumes from, or null;
``rank``, ``world``) and one per step (``step``, ``rank``, ``world``, ``lanes``: each lane of
the rank -> the hex digest of the lane's part of the step's global batch); the node agent
writes a container's output to ``<pods>/<namespace>_<pod>/<container>.log``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import yaml

from datalane.runner import run_world
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from playground.__main__ import FOLDER

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pretrain.yaml"
LANES = 8  # examples/pretrain.yaml's


def console_block() -> list[str]:
    """The commands of the console block of README.md's "On a cluster" section (comment-only
    continuation lines dropped, backslash continuations joined)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## On a cluster\n"):]
    section = section[:section.index("\n## ", 3)]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    block = re.sub(r"\\\n\s*", "", block)  # a line ending in a backslash goes on
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def example() -> dict[str, dict[str, Any]]:
    """examples/pretrain.yaml's objects by kind."""
    return {d["kind"]: d for d in yaml.safe_load_all(EXAMPLE.read_text())}


def local_recipe() -> dict[str, Any]:
    """examples/pretrain.yaml's recipe over the playground's local copy of the corpus."""
    spec = example()["DataPipeline"]["spec"]
    text = json.dumps(spec["recipe"]).replace("s3://playground/corpus", str(FOLDER / "corpus"))
    return {**json.loads(text), "lanes": spec["lanes"],
            "global_batch_size": spec["globalBatchSize"]}


def pod_log(namespace: str, name: str, container: str, again: str | None = None) -> Path:
    """Where the node agent writes the output of a container of the pod ``name``; ``again``:
    the uid of a pod whose name an earlier pod of the node had (its folder's name then ends in
    ``_<uid[:8]>``)."""
    folder = f"{namespace}_{name}" + (f"_{again[:8]}" if again else "")
    return FOLDER / "pods" / folder / f"{container}.log"


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
    """step -> the global batch's hash, for the steps whose every lane was read."""
    return {s: global_hash(d[k] for k in sorted(d)) for s, d in steps.items()
            if len(d) == LANES}


def wait_for_steps(logs: list[Path], count: int, timeout: float) -> list[list[dict[str, Any]]]:
    """The records of every log once each has ``count`` step records."""
    deadline = time.monotonic() + timeout
    while True:
        runs = [records(path) for path in logs]
        if all(len([x for x in r if "lanes" in x]) >= count for r in runs):
            return runs
        assert time.monotonic() < deadline, f"the trainers did not read {count} steps:\n" + \
            "\n".join(f"{p}: {p.read_text()[-2000:]}" for p in logs if p.exists())
        time.sleep(2)


def check_resumed(before_runs: list[list[dict[str, Any]]], runs: list[list[dict[str, Any]]],
                  world: int, committed_before: int, lanes_per_rank: list[int],
                  reference_world: int, after_steps: int) -> int:
    """The resized job's trainers (``runs``, one per pod) all resumed, as ``world`` ranks with
    ``lanes_per_rank`` lanes (sorted), at one committed step no older than
    ``committed_before`` (the status's ``lastCommittedStep`` before the resize); the runs
    before the resize read steps 0 onwards up to the step before that, the resumed ones at
    least ``after_steps`` whole global batches from it; and every global batch,
    before and after, equals an uninterrupted ``reference_world``-rank run of the example's
    recipe over the playground's corpus. Returns the step resumed at."""
    starts = [r[0] for r in runs]
    resume = {s["resume"] for s in starts}
    assert len(resume) == 1 and {s["world"] for s in starts} == {world}, starts
    (step,) = resume
    assert step is not None and step >= committed_before >= 4, (step, committed_before)
    for run in runs:
        assert next(x for x in run if "lanes" in x)["step"] == step
    assert sorted(len(next(x for x in r if "lanes" in x)["lanes"]) for r in runs) == \
        lanes_per_rank
    before, after = global_hashes(steps_of(before_runs)), global_hashes(steps_of(runs))
    assert sorted(before)[:4] == [0, 1, 2, 3] and max(before) >= step - 1
    assert min(after) == step and len(after) >= after_steps
    reference = run_world(load_recipe(local_recipe()), reference_world, Knobs(workers=1),
                          max(after) + 1).hashes
    assert before == {s: reference[s] for s in before}
    assert after == {s: reference[s] for s in after}
    return int(step)
