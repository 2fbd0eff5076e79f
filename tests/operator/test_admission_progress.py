"""The recipe-edit guard takes the run's progress from its checkpoint store.

The tester's repro: a status patch setting ``status.lastCommittedStep`` to null, then an edit
of a phase that had already started, was admitted (and every resume under it refused: a
wedged job). The webhook now reads the newest committed step from the store the run writes
(a real store on disk here, through the operator's own handler), never from the status; a
store it cannot read refuses the edit, saying why.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import kopf
import pytest
from datalane_operator import handlers
from datalane_operator.admission import review_pipeline
from datalane_operator.policy import Policy
from datalane_operator.reconciler import store_progress
from datalane_operator.runtime import OperatorConfig, Runtime

from datalane.store import CheckpointStore
from tests.store.support import commit_steps

from .builders import dp

WARMUP = {"name": "warmup", "start_step": 100, "weights": {"web": 1.0}}
ANNEAL = {"name": "anneal", "start_step": 500, "weights": {"web": 0.2, "code": 0.8}}
OWN_IDENTITY = Policy(allow_operator_identity=True)  # file:// stores: the operator's identity


def _pipelines(store: str, status: dict[str, Any] | None) -> tuple[dict[str, Any],
                                                                   dict[str, Any]]:
    """(stored, edited): a run with phase 'warmup' (from step 100) whose status says
    ``status``, and the same pipeline with the started phase's weights edited."""
    old = dp(checkpoint={"uri": store, "keep": 2})
    old["spec"]["recipe"]["phases"] = [copy.deepcopy(WARMUP)]
    if status is not None:
        old["status"] = status
    new = copy.deepcopy(old)
    new["spec"]["recipe"]["phases"] = [{**WARMUP, "weights": {"web": 0.5}}, ANNEAL]
    return old, new


def _validate(old: dict[str, Any], new: dict[str, Any], policy: Policy = OWN_IDENTITY) -> str:
    """What the webhook answers, under ``policy``: "admitted", or the refusal's message."""
    memo = kopf.Memo(runtime=Runtime(OperatorConfig(policy=policy)))
    try:
        asyncio.run(handlers.validate_pipeline(body=kopf.Body(copy.deepcopy(new)), warnings=[],
                                               old=kopf.Body(copy.deepcopy(old)),
                                               pipelines={}, jobs={}, trainjobs={},
                                               memo=memo))
    except kopf.AdmissionError as e:
        return str(e)
    return "admitted"


@pytest.mark.parametrize("status", [{"lastCommittedStep": None}, None, {},
                                    {"lastCommittedStep": 0}],
                         ids=["patched to null", "no status", "empty status", "patched to 0"])
def test_a_patched_status_does_not_open_the_past(tmp_path: Path,
                                                 status: dict[str, Any] | None) -> None:
    store = str(tmp_path / "store")
    commit_steps(CheckpointStore(store), [300, 350])
    old, new = _pipelines(store, status)
    assert _validate(old, new) == (
        f"spec.recipe edits steps the run has already consumed (the newest checkpoint "
        f"committed in {store}, step 350): phases[0] 'warmup' (starts at step 100, before the "
        f"resume step 350): weights.web saved 1.0, now 0.5. Only phases that start at step 350 "
        f"or later, and eval streams, may change on a running DataPipeline; create a new "
        f"DataPipeline for a new run")
    appended = copy.deepcopy(old)
    appended["spec"]["recipe"]["phases"] = [copy.deepcopy(WARMUP), ANNEAL]
    assert _validate(old, appended) == "admitted"  # the future may still change


def test_before_the_first_checkpoint_any_valid_edit_is_admitted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    old, new = _pipelines(str(store), {"lastCommittedStep": 350})  # a status that lies high
    assert _validate(old, new) == "admitted"  # the store has no checkpoint: step 0


def test_a_store_that_cannot_be_read_refuses_the_edit(tmp_path: Path) -> None:
    """The default policy does not let the operator act on a file:// store with its own
    identity: the progress is unknown, and the edit is refused saying so."""
    store = str(tmp_path / "store")
    commit_steps(CheckpointStore(store), [350])
    old, new = _pipelines(store, {"lastCommittedStep": None})
    progress = asyncio.run(store_progress(Runtime(OperatorConfig(policy=Policy())), old))
    assert progress.step is None and progress.error is not None
    assert "the cluster policy does not allow that" in progress.error
    v = review_pipeline(new, old, policy=OWN_IDENTITY, progress=progress)
    assert not v.allowed
    assert v.message.startswith(
        f"spec.recipe cannot be edited now: the run's progress, the newest checkpoint "
        f"committed in its store {store}, is unknown (the operator would list and delete "
        f"checkpoints of spec.checkpoint.uri {store!r} with its own identity"), v.message


def test_the_pure_guard_without_a_progress_refuses_a_recipe_edit() -> None:
    from datalane_operator.amend import Progress

    old, new = _pipelines("s3://ckpt/run-1", {"lastCommittedStep": None})
    old["spec"]["checkpoint"] = new["spec"]["checkpoint"] = dp()["spec"]["checkpoint"]
    v = review_pipeline(new, old)
    assert v.message == (
        "spec.recipe cannot be edited now: the run's progress, the newest checkpoint committed "
        "in its store, is unknown (the checkpoint store was not read); an edit is checked "
        "against the steps the run has consumed, so try again once the store can be read")
    assert review_pipeline(new, old, progress=Progress("s3://ckpt/run-1", 50)).allowed
    same = copy.deepcopy(old)
    same["metadata"]["labels"] = {"team": "a"}  # no recipe change: no progress needed
    assert review_pipeline(same, old).allowed
