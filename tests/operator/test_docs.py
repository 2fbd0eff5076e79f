"""docs/operator.md: the generated reference is current and the examples are accepted."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from datalane_operator.admission import review_pipeline
from datalane_operator.reference import BEGIN, END, render_reference

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operator.md"


def test_reference_is_generated_from_the_schema() -> None:
    text = DOC.read_text()
    section = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert section == "\n" + render_reference(), (
        "docs/operator.md is stale: run `datalane-operator reference --write docs/operator.md`")


def test_examples_are_valid_pipelines() -> None:
    # (fenced as ```yaml title=...: tests/docs/test_docs.py reads plain ```yaml blocks as recipes)
    blocks = re.findall(r"```yaml[^\n]*\n(.*?)```", DOC.read_text(), re.S)
    docs = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict)]
    pipelines = [d for d in docs if d.get("kind") == "DataPipeline"]
    jobs = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "PyTorchJob"}
    assert pipelines and jobs
    for body in pipelines:
        body["metadata"]["namespace"] = "ml"
        # an example's job, if the docs show it, must fit its lanes and parallelism
        verdict = review_pipeline(body, workload=jobs.get(body["spec"]["workload"]["name"]))
        assert verdict.allowed, verdict.message


def test_notes_example_is_valid() -> None:
    notes = (ROOT / "helm" / "datalane" / "templates" / "NOTES.txt").read_text()
    block = notes.split("<<YAML | kubectl apply --server-side -f -\n", 1)[1].split("  YAML")[0]
    body = yaml.safe_load(block)
    body["metadata"]["namespace"] = "ml"
    assert review_pipeline(body).allowed


def test_messages_quoted_in_the_docs_are_the_real_ones() -> None:
    from datalane_operator.pipeline import Parallelism
    from datalane_operator.workload import check_workers, topology_of

    from .builders import job

    text = " ".join(DOC.read_text().split())
    for workers, lanes, master, nproc, par in (
            (9, 8, 0, "1", {}), (4, 8, 1, "2", {}), (9, 8, 0, "2", {"tensor": 2}),
            (2, 8, 0, "2", {"tensor": 4}), (3, 8, 0, "2", {"tensor": 2, "pipeline": 2}),
            (1, 8, 0, "8", {"tensor": 2, "pipeline": 2})):
        topo = topology_of(job(workers=workers, master=master, nproc=nproc),
                           parallelism=Parallelism(**par))
        try:
            check_workers(lanes, topo)
        except ValueError as e:
            message = " ".join(str(e).split())
            # quoted whole, or cut after one of its "; " parts (the table's "; ...")
            cuts = [message[:i] + "; ..." for i, c in enumerate(message) if c == ";"]
            assert message in text or any(cut in text for cut in cuts), message
        else:
            raise AssertionError("expected a refusal")
