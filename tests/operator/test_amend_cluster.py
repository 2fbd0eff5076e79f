"""Editing a running DataPipeline on the real control plane (issue 12 part 3).

The Helm chart and the operator (tests/operator/stack.py) on the test control plane; a
checkpoint store whose newest committed step is 350. Once the operator has recorded it
(``status.lastCommittedStep``; the webhook itself reads the store), ``kubectl apply`` of the
pipeline with a phase appended after step 350 is admitted and reaches the recipe ConfigMap
the sidecars mount; an edit of a phase that began at step 100 is refused by the webhook with
the reason, and the stored object keeps its recipe.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from datalane_operator import names
from kubernetes import client

from datalane.store import CheckpointStore
from tests.cluster.harness import Cluster
from tests.cluster.util import eventually
from tests.store.support import commit_steps

from .builders import RECIPE
from .stack import Stack, datalane_stack

pytestmark = [pytest.mark.cluster]
G, V, P = names.GROUP, names.VERSION, names.PLURAL
WARMUP = {"name": "warmup", "start_step": 100, "weights": {"web": 1.0}, "ramp_steps": 1}
ANNEAL = {"name": "anneal", "start_step": 500, "weights": {"web": 0.2, "code": 0.8},
          "ramp_steps": 50}


@pytest.fixture(scope="module")
def stack(training_operator: Cluster, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[Stack]:
    with training_operator.namespace("datalane-amend") as ns, datalane_stack(
            training_operator, ns, tmp_path_factory.mktemp("amend")) as s:
        yield s


def pipeline(recipe: dict[str, Any], store: str) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "DataPipeline", "metadata": {"name": "amend"},
            "spec": {"workload": {"kind": "PyTorchJob", "name": "ajob"}, "lanes": 8,
                     "globalBatchSize": 16, "recipe": recipe, "checkpoint": {"uri": store}}}


def apply(c: Cluster, ns: str, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    out: subprocess.CompletedProcess[str] = c.kubectl(
        "apply", "--server-side", "--field-manager=amend", "-n", ns, "-f", "-",
        input=yaml.safe_dump(body), check=False)
    return out


def test_appending_a_phase_is_admitted_and_editing_the_past_refused(
        stack: Stack, k8s_api: client.ApiClient) -> None:
    c, ns = stack.cluster, stack.namespace
    custom, core = client.CustomObjectsApi(k8s_api), client.CoreV1Api(k8s_api)
    store = f"file://{stack.log.parent}/amend-store"
    commit_steps(CheckpointStore(store), [300, 350])
    recipe = {**copy.deepcopy(RECIPE), "phases": [WARMUP]}
    created = apply(c, ns, pipeline(recipe, store))
    assert created.returncode == 0, created.stderr
    try:
        eventually(lambda: (custom.get_namespaced_custom_object(G, V, ns, P, "amend").get(
            "status") or {}).get("lastCommittedStep") == 350, timeout=60,
            what="status.lastCommittedStep 350")

        appended = apply(c, ns, pipeline({**recipe, "phases": [WARMUP, ANNEAL]}, store))
        assert appended.returncode == 0, appended.stderr
        stored = custom.get_namespaced_custom_object(G, V, ns, P, "amend")
        assert stored["spec"]["recipe"]["phases"] == [WARMUP, ANNEAL]

        def delivered() -> bool:
            data = core.read_namespaced_config_map("amend-recipe", ns).data or {}
            phases = json.loads(data.get("recipe.json", "{}")).get("phases", [])
            return [p["name"] for p in phases] == ["warmup", "anneal"]
        eventually(delivered, timeout=30, what="the recipe ConfigMap with the new phase")

        past = {**recipe, "phases": [{**WARMUP, "weights": {"web": 0.5}}, ANNEAL]}
        refused = apply(c, ns, pipeline(past, store))
        assert refused.returncode != 0
        assert ("spec.recipe edits steps the run has already consumed (the newest "
                f"checkpoint committed in {store}, step 350): phases[0] 'warmup' (starts at "
                "step 100, before the resume step 350): weights.web saved 1.0, now 0.5. Only "
                "phases that start at step 350 or later") in " ".join(refused.stderr.split()), (
            refused.stderr)
        after = custom.get_namespaced_custom_object(G, V, ns, P, "amend")
        assert after["spec"]["recipe"]["phases"] == [WARMUP, ANNEAL]
        assert after["metadata"]["generation"] == stored["metadata"]["generation"]
        stack.check_alive()
    except BaseException:
        print(stack.log_tail())
        raise
    finally:
        c.kubectl("delete", "dp", "amend", "-n", ns, "--wait=true", "--timeout=30s",
                  check=False)
