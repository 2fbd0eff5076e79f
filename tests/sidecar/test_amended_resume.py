"""A run resumed through a real sidecar with a phase appended (and its ledger).

A sidecar serves recipe A (phase 'warmup' from step 2) to one rank and commits checkpoint 6
in its store; it stops, and a sidecar of recipe B = A + phase 'anneal' from step 8 (what an
edited DataPipeline's pods start with) resumes the trainer at step 6 and commits
checkpoint 16. The manifests record each recipe's phases, ``datalane audit`` proves the
steps before 6 unchanged, and the ledger equals one uninterrupted process under B.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from datalane import load_recipe
from datalane.client.sidecar import SidecarLoader
from datalane.runner import run_world
from datalane.spec.knobs import Knobs
from datalane.store import CheckpointStore
from datalane.store.amendments import PhaseStart

pytestmark = pytest.mark.slow  # real sidecar processes

WARMUP = {"name": "warmup", "start_step": 2, "weights": {"web": 1.0}}
ANNEAL = {"name": "anneal", "start_step": 8, "weights": {"web": 0.1, "code": 0.9},
          "ramp_steps": 2}


def _serve(socket: str, resume: int | None, until: int) -> None:
    """One rank reads the steps from ``resume`` to ``until`` and checkpoints ``until``."""
    done, start = 0, resume or 0
    with SidecarLoader(socket, rank=0, world_size=1, microbatch_size=16,
                       resume_step=resume) as loader:
        for batch in loader:
            if batch.lane_digests:  # the last microbatch of a step
                assert (batch.step, len(batch.lane_digests)) == (start + done, 8)
                done += 1
                if done == until - start:
                    break
        saved = loader.checkpoint()
    assert saved["committed"], saved


def test_a_resume_with_an_appended_phase_audits_and_matches(
        sidecar: Callable[..., Any], write_recipe: Callable[..., str], corpus: Any,
        tmp_path: Any) -> None:
    sources = [
        {"name": "web", "uris": [corpus.web], "epochs": None, "chunk_rows": 50, "weight": 0.7},
        {"name": "code", "uris": [corpus.code], "epochs": None, "chunk_bytes": 8192,
         "weight": 0.3}]
    a = write_recipe(sources=sources, phases=[WARMUP])
    b = write_recipe(sources=sources, phases=[WARMUP, ANNEAL])
    store_uri = str(tmp_path / "store")
    first = sidecar(a, "--store", store_uri, "--ranks-per-pod", "1")
    _serve(first.socket, None, 6)
    assert first.terminate() == 0
    second = sidecar(b, "--store", store_uri, "--ranks-per-pod", "1")
    _serve(second.socket, 6, 16)
    assert second.terminate() == 0

    store = CheckpointStore(store_uri)
    assert store.committed_steps() == [6, 16]
    assert store.manifest(6).phases == (PhaseStart("warmup", 2),)
    assert store.manifest(16).phases == (PhaseStart("warmup", 2), PhaseStart("anneal", 8))
    report = store.audit()
    assert report.ok, report.text()
    reference = run_world(load_recipe(b), 1, Knobs(workers=1), 16).hashes
    assert dict(report.ledger) == reference
    audit = subprocess.run([sys.executable, "-m", "datalane.cli", "audit", store_uri],
                           capture_output=True, text=True, check=False, timeout=300)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    lines = audit.stdout.splitlines()
    assert "  anneal           from step        8  since checkpoint 16, served since that " \
           "step" in lines
    assert any(line.startswith("  after step 6 (checkpoint 16): phase 'anneal' (from step 8) "
                               "appended; steps before 6 unchanged") for line in lines)
    assert lines[-1].endswith("recipe amended after step 6 with the steps before it "
                              "unchanged")
