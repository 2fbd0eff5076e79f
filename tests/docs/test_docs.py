"""Docs stay true: their Python examples run, their recipes load, the reference is generated."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from datalane.spec import model
from datalane.spec.recipe import Recipe
from tests.support import paths

ROOT = paths.REPO
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(rf"^```{lang}\n(.*?)^```$", text, re.M | re.S):
            out.append((path.name, text[:m.start()].count("\n") + 1, m.group(1)))
    return out


@pytest.mark.slow  # the examples start sidecars and run loaders end to end (minutes)
@pytest.mark.parametrize("name,line,code", _blocks("python"),
                         ids=lambda v: str(v) if isinstance(v, (int,)) else None)
def test_python_examples_run(name, line, code, tmp_path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"{name}:{line} failed:\n{proc.stderr}"


def test_recipe_examples_are_valid_recipes() -> None:
    # recipe documents (Kubernetes objects such as a DataPipeline carry `kind:` instead)
    recipes = [c for _, _, c in _blocks("yaml")
               if re.search(r"^sources:", c, re.M) and "kind:" not in c]  # not `resources:`
    assert recipes
    for code in recipes:
        model.load(Recipe, yaml.safe_load(code), "")  # raises with the field on any error


def test_recipe_reference_is_generated_from_the_model() -> None:
    from tools.recipe_reference import render_fields

    text = (ROOT / "docs" / "recipe.md").read_text()
    generated = text.split("<!-- fields:begin -->\n", 1)[1].split("\n<!-- fields:end -->")[0]
    assert generated == render_fields(), "run `make generate` and commit"


def test_documented_lane_state_parses() -> None:
    import json

    from datalane.spec.state import LaneState

    examples = [c for _, _, c in _blocks("json") if '"v": 2' in c]
    assert examples
    for code in examples:
        LaneState.from_json(json.loads(code))


def _console_commands(path: Path) -> list[str]:
    """The commands of a document's ``console`` blocks: comments dropped, continued lines
    joined."""
    commands: list[str] = []
    for m in re.finditer(r"^```console\n(.*?)^```$", path.read_text(), re.M | re.S):
        pending = ""
        for line in m.group(1).splitlines():
            code = re.split(r"\s#|^#", line, maxsplit=1)[0].rstrip()
            if not code:
                continue
            pending += code.strip() if not pending else " " + code.strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            commands.append(pending)
            pending = ""
    return commands


# README commands that cannot run in this test, and where each is covered instead
_ELSEWHERE = {
    "make demo": "builds .venv: measured by hand, the time is in the README",
    "make test": "the whole suite", "make check": "the fast tier",
    "datalane-sidecar serve": "an S3 store: tests/sidecar (real sidecars, moto's S3)",
    "datalane-sidecar probe": "a running sidecar: tests/sidecar/conftest.py probes each",
    "datalane demo --sidecars": "minutes: tests/sidecar/test_sidecar.py runs it",
    "datalane audit s3://": "an S3 store: tests/store (moto's S3)",
    "helm": "a cluster: tests/playground runs the cluster section verbatim",
    "kubectl": "a cluster: tests/playground runs the cluster section verbatim",
    "make playground": "a cluster: tests/playground/test_readme_cluster.py",
    "export KUBECONFIG": "the playground's: tests/playground/test_readme_cluster.py",
}


@pytest.mark.slow
def test_readme_commands_run(tmp_path) -> None:
    """Every command of the README runs as written (``datalane`` as ``python -m
    datalane.cli``) in a folder holding the corpus's ``recipe.yaml``, in order, and does what
    its comment says; the rest are named in _ELSEWHERE with where they are covered."""
    import shlex

    from datalane.testing import make_corpus

    make_corpus(str(tmp_path))
    assert (tmp_path / "recipe.yaml").exists()
    commands = _console_commands(ROOT / "README.md")
    here = [c for c in commands if not any(c.startswith(k) for k in _ELSEWHERE)]
    assert [c.split()[0] for c in here] == ["datalane"] * len(here), here
    assert len(here) == 6, here
    outputs = []
    for command in here:
        argv = [sys.executable, "-m", "datalane.cli", *shlex.split(command)[1:]]
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True,
                              timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stderr}"
        outputs.append(proc.stdout)
    hashes = [dict(re.findall(r"^step=(\d+) sha256=([0-9a-f]{64})$", out, re.M))
              for out in outputs[:3]]
    assert len(hashes[0]) == 100 and len(hashes[1]) == 50
    # "--resume s50.json   # same hashes from 50 on" (another world size)
    assert hashes[2] == {str(s): hashes[0][str(s)] for s in range(50, 100)}
    assert "step 50" in outputs[4]
    assert outputs[5].rstrip().endswith("MATCH")


def test_readme_kubectl_get_dp_shows_the_crds_columns() -> None:
    """The columns the README shows for ``kubectl get dp`` are the CRD's printer columns
    (those of priority 0: what kubectl prints without ``-o wide``)."""
    crd = yaml.safe_load((ROOT / "crds" / "datapipelines.datalane.io.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    columns = ["NAME"] + [c["name"].upper() for c in version["additionalPrinterColumns"]
                          if not c.get("priority")]
    line = next(line for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith("kubectl get dp "))
    assert line.split("#", 1)[1].split() == columns


def test_the_tiny_elastic_bench_leaves_the_committed_figure_alone() -> None:
    """``bench/elastic_training.py --tiny`` (the CI smoke size) overwrote
    docs/elastic-loss.png, the full run's committed figure."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import elastic_training
    finally:
        sys.path.remove(str(ROOT / "bench"))
    tiny = elastic_training.options(["--tiny"])
    assert Path(tiny.plot) == ROOT / "bench" / "results" / "elastic-loss-tiny.png"
    assert Path(tiny.out) == ROOT / "bench" / "results" / "elastic_training_tiny.json"
    full = elastic_training.options([])
    assert Path(full.plot) == ROOT / "docs" / "elastic-loss.png"
    assert Path(full.out) == ROOT / "bench" / "results" / "elastic_training.json"
    assert elastic_training.options(["--tiny", "--plot", "x.png"]).plot == "x.png"


def test_helm_chart_states_the_scale_rule() -> None:
    """Any world size from 1 to the lanes is admitted: the chart's description and
    NOTES said that a world size must divide the lanes."""
    chart = (ROOT / "helm" / "datalane" / "Chart.yaml").read_text()
    notes = (ROOT / "helm" / "datalane" / "templates" / "NOTES.txt").read_text()
    for text in (chart, notes):
        flat = " ".join(text.split())
        assert "divisor of the lanes" not in flat and "does not divide the lanes" not in flat
    assert "between 1 and the lane count" in " ".join(chart.split())
    assert "more data-parallel ranks than lanes is refused" in " ".join(notes.split())
