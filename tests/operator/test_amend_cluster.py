"""Editing a running DataPipeline on the real control plane (phases appended, the edit rolled
into the running pods), and what an operator outage costs pod creation.

The Helm chart and the operator (tests/operator/stack.py) on the test control plane.

* A checkpoint store whose newest committed step is 350. Once the operator has recorded it
  (``status.lastCommittedStep``; the webhook itself reads the store), ``kubectl apply`` of the
  pipeline with a phase appended after step 350 is admitted and reaches the recipe ConfigMap
  the sidecars mount; an edit of a phase that began at step 100 is refused by the webhook with
  the reason, and the stored object keeps its recipe.
* **Phases roll themselves**: a job of 2 pods trains (sidecars and trainers as local
  processes, a checkpoint every 2 steps); a phase appended at step 12 is admitted, and the
  operator itself restarts both pods at the next checkpoint (``PhaseRolled``: which step),
  the training-operator recreates them, and they resume there under the new recipe: the
  store's audit shows the amendment at that step, and the ledger of every step equals an
  uninterrupted run of the new recipe, which differs from the old one from step 12 on.
* **The operator away and back**: a worker deleted while no operator runs is not recreated
  (the pod webhook fails closed); once the operator is back, the time to its webhook server,
  to the first admitted pod and to the recreated pod is measured, with the training-operator's
  retries meanwhile (docs/operator.md says where the time goes).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from datalane_operator import names
from datalane_operator.rollout import stamp_of
from kubernetes import client
from kubernetes.client.rest import ApiException

from datalane.corpus import DemoCorpus
from datalane.runner import run_world
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.store import CheckpointStore
from datalane.store.amendments import PhaseStart
from tests.cluster.harness import Cluster
from tests.cluster.util import eventually
from tests.conftest import base_recipe_dict
from tests.store.support import commit_steps

from .builders import RECIPE
from .podrunner import PodRunner
from .stack import Stack, datalane_stack
from .test_e2e import digests_of, dp_status, live_pods, wait_injection_active

pytestmark = [pytest.mark.cluster]
G, V, P = names.GROUP, names.VERSION, names.PLURAL
TG, TV, TP = names.PYTORCHJOB_GROUP, names.PYTORCHJOB_VERSION, names.PYTORCHJOB_PLURAL
MEASURED: dict[str, Any] = {}
WARMUP = {"name": "warmup", "start_step": 100, "weights": {"web": 1.0}, "ramp_steps": 1}
ANNEAL = {"name": "anneal", "start_step": 500, "weights": {"web": 0.2, "code": 0.8},
          "ramp_steps": 50}


@pytest.fixture(scope="module")
def stack(training_operator: Cluster, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[Stack]:
    with training_operator.namespace("datalane-amend") as ns, datalane_stack(
            training_operator, ns, tmp_path_factory.mktemp("amend")) as s:
        yield s
    if MEASURED:
        print(f"\n[operator amend e2e] measured: {json.dumps(MEASURED)}")


def pipeline(recipe: dict[str, Any], store: str, name: str = "amend", job: str = "ajob",
             keep: int = 3) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "DataPipeline", "metadata": {"name": name},
            "spec": {"workload": {"kind": "PyTorchJob", "name": job}, "lanes": 8,
                     "globalBatchSize": 16, "recipe": recipe,
                     "checkpoint": {"uri": store, "keep": keep}}}


def trainer_job(name: str, workers: int, *args: str) -> dict[str, Any]:
    """A PyTorchJob whose trainer is tests/operator/e2e_trainer.py (run by the PodRunner)."""
    trainer = {"name": "pytorch", "image": "registry.invalid/trainer:1",
               "command": ["python", "-m", "tests.operator.e2e_trainer", *args],
               "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {"apiVersion": f"{TG}/{TV}", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"nprocPerNode": "1", "pytorchReplicaSpecs": {"Worker": {
                "replicas": workers, "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [trainer]}}}}}}


def running(core: client.CoreV1Api, ns: str, job: str, n: int,
            not_uids: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]] | None:
    pods = live_pods(core, ns, job)
    ok = len(pods) == n and all(p.get("status", {}).get("phase") == "Running"
                                and p["metadata"]["uid"] not in not_uids for p in pods.values())
    return pods if ok else None


def rolled(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    return next((c for c in dp_status(custom, ns, name).get("conditions") or []
                 if c["type"] == "PhaseRolled"), {})


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
            name = dp_status(custom, ns, "amend").get("recipeConfigMap")
            if not name:
                return False
            try:
                data = core.read_namespaced_config_map(name, ns).data or {}
            except ApiException:
                return False
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
        # the same edit as v1beta1: the API server converts it to the v1alpha1 the webhook
        # matches (matchPolicy Equivalent), so the operator refuses it just the same
        as_beta = apply(c, ns, {**pipeline(past, store), "apiVersion": f"{G}/v1beta1"})
        assert as_beta.returncode != 0
        assert "spec.recipe edits steps the run has already consumed" in " ".join(
            as_beta.stderr.split()), as_beta.stderr
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


def gated_pod(name: str, job: str) -> dict[str, Any]:
    """A pod of ``job`` held by a scheduling gate: admitted and live (Pending), never run."""
    return {"metadata": {"name": name, "labels": {names.JOB_NAME_LABEL: job}},
            "spec": {"schedulingGates": [{"name": "datalane.io/test"}],
                     "containers": [{"name": "pytorch", "image": "x:1", "env": [
                         {"name": "PET_NPROC_PER_NODE", "value": "1"}]}]}}


def recipe_maps(core: client.CoreV1Api, ns: str, pipeline_name: str) -> set[str]:
    return {cm.metadata.name for cm in core.list_namespaced_config_map(
        ns, label_selector=f"{names.LABEL_PIPELINE}={pipeline_name}").items}


def test_a_pod_mounts_the_configmap_of_its_stamp_and_old_ones_are_collected(
        stack: Stack, k8s_api: client.ApiClient) -> None:
    """Review finding 1 on the real API server: a pod created the moment an edit is stored
    mounts the ConfigMap of the recipe it is stamped with, which exists (immutable) before the
    pod does; the old recipe's ConfigMap goes once its last pod does, the current one with the
    pipeline (owner reference, Kubernetes' garbage collector)."""
    c, ns = stack.cluster, stack.namespace
    custom, core = client.CustomObjectsApi(k8s_api), client.CoreV1Api(k8s_api)
    store = f"file://{stack.log.parent}/cm-store"
    created = apply(c, ns, pipeline(copy.deepcopy(RECIPE), store, "cmap", "cjob"))
    assert created.returncode == 0, created.stderr

    def admit(name: str) -> tuple[str, str]:
        """Create the pod; its stamp's digest and its recipe ConfigMap's name, after checking,
        right after the creation returned, that the ConfigMap holds the stamped recipe."""
        pod = json.loads(core.create_namespaced_pod(ns, gated_pod(name, "cjob"),
                                                    _preload_content=False).data)
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == names.VOLUME_RECIPE]
        cm = core.read_namespaced_config_map(vol["configMap"]["name"], ns)
        digest = json.loads(pod["metadata"]["annotations"][names.ANN_RECIPE])["digest"]
        assert stamp_of(load_recipe(json.loads(cm.data["recipe.json"]))).digest == digest
        assert cm.immutable is True
        assert vol["configMap"]["name"] == f"cmap-recipe-{digest}"
        return digest, vol["configMap"]["name"]

    try:
        wait_injection_active(core, ns, "cjob")
        old_digest, first = admit("cjob-worker-0")
        edited = apply(c, ns, pipeline({**copy.deepcopy(RECIPE), "phases": [ANNEAL]}, store,
                                       "cmap", "cjob"))
        assert edited.returncode == 0, edited.stderr
        # pods created from the moment the edit is stored, until one gets the edited recipe
        # (the replica's index follows the edit within moments): every one mounts its stamp
        deadline, tries = time.monotonic() + 30, 0
        while (found := admit(f"cjob-edit-{tries}"))[0] == old_digest:
            core.delete_namespaced_pod(f"cjob-edit-{tries}", ns)
            tries += 1
            assert time.monotonic() < deadline, "no pod admitted with the edited recipe"
        MEASURED["pods_admitted_with_the_old_recipe_after_the_edit"] = tries
        second = found[1]
        assert first != second
        with pytest.raises(ApiException) as refused:  # the API server keeps its bytes
            core.patch_namespaced_config_map(second, ns, {"data": {"recipe.json": "{}"}})
        assert refused.value.status == 422
        eventually(lambda: dp_status(custom, ns, "cmap").get("recipeConfigMap") == second,
                   timeout=30, what="status.recipeConfigMap the edited recipe's")
        time.sleep(4)  # twice the grace: the first pod still mounts the old recipe's
        assert recipe_maps(core, ns, "cmap") == {first, second}
        c.kubectl("delete", "pod", "cjob-worker-0", "-n", ns, "--wait=true")
        t0 = time.monotonic()
        eventually(lambda: recipe_maps(core, ns, "cmap") == {second}, timeout=60,
                   what="the old recipe's ConfigMap collected")
        MEASURED["recipe_configmap_collected_s"] = round(time.monotonic() - t0, 1)
        stack.check_alive()
    except BaseException:
        print(stack.log_tail())
        raise
    finally:
        c.kubectl("delete", "pod", "-l", f"{names.JOB_NAME_LABEL}=cjob", "-n", ns,
                  "--wait=true", check=False)
        c.kubectl("delete", "dp", "cmap", "-n", ns, "--wait=true", "--timeout=30s",
                  check=False)
    eventually(lambda: not recipe_maps(core, ns, "cmap"), timeout=60,
               what="the recipe ConfigMaps gone with the pipeline")


ROLL_AT = 12  # the appended phase's start step
ROLL_STEPS = 16  # each trainer run's steps


def test_an_appended_phase_rolls_the_pods_at_the_next_checkpoint(
        stack: Stack, k8s_api: client.ApiClient, corpus: DemoCorpus) -> None:
    c, ns = stack.cluster, stack.namespace
    custom, core = client.CustomObjectsApi(k8s_api), client.CoreV1Api(k8s_api)
    store = f"file://{stack.log.parent}/roll-store"
    full = base_recipe_dict(corpus)
    for src in full["sources"]:
        src["epochs"] = None  # as much data as the steps want, under either mix
    anneal = {"name": "anneal", "start_step": ROLL_AT, "weights": {"web": 0.1, "code": 0.9},
              "ramp_steps": 1}
    recipe = {k: v for k, v in full.items() if k not in ("lanes", "global_batch_size")}
    created = apply(c, ns, pipeline(recipe, store, "roll", "rolljob", keep=100))
    assert created.returncode == 0, created.stderr
    wait_injection_active(core, ns, "rolljob")
    custom.create_namespaced_custom_object(TG, TV, ns, TP, trainer_job(
        "rolljob", 2, "--steps", str(ROLL_STEPS), "--checkpoint-every", "2",
        "--step-seconds", "2.5"))
    runner = PodRunner(core, ns)
    try:
        old = eventually(lambda: running(core, ns, "rolljob", 2), timeout=90,
                         what="2 Running pods of rolljob")
        for pod in old.values():
            runner.start(pod)
        eventually(lambda: (dp_status(custom, ns, "roll").get("lastCommittedStep") or 0) >= 2,
                   timeout=120, what="a first checkpoint committed")
        edited = apply(c, ns, pipeline({**recipe, "phases": [anneal]}, store, "roll",
                                       "rolljob", keep=100))
        assert edited.returncode == 0, edited.stderr
        t0 = time.monotonic()
        # ---- the operator restarts both pods at the next checkpoint --------------------------
        old_uids = frozenset(p["metadata"]["uid"] for p in old.values())
        eventually(lambda: old_uids.isdisjoint(p["metadata"]["uid"] for p in live_pods(
            core, ns, "rolljob").values()), timeout=120, interval=0.1,
            what="the operator deletes the pods serving the old recipe")
        MEASURED["edit_to_restart_s"] = round(time.monotonic() - t0, 2)
        first = digests_of(runner)  # what the old sidecars served, up to where they stopped
        runner.stop_pods()  # the kubelet stops the deleted pods' containers
        committed = CheckpointStore(store).committed_steps()
        event = eventually(lambda: next((e.message for e in core.list_namespaced_event(
            ns, field_selector="involvedObject.name=roll").items
            if e.reason == "RestartingPods"), None), timeout=30, what="the RestartingPods event")
        match = re.search(r"at step (\d+) \(the newest checkpoint", event)
        assert match, event
        at = int(match.group(1))
        assert event.startswith("restarting 2 pods serving an older recipe (rolljob-worker-0, "
                                "rolljob-worker-1) at step"), event
        assert f"phase 'anneal' (from step {ROLL_AT})" in event
        assert 2 < at <= ROLL_AT and max(committed) <= ROLL_AT, (at, committed)
        MEASURED["restarted_at_step"], MEASURED["committed_at_restart"] = at, committed
        # ---- recreated with the new recipe, they resume at that step -------------------------
        new = eventually(lambda: running(core, ns, "rolljob", 2, old_uids), timeout=90,
                         what="2 recreated Running pods")
        for pod in new.values():
            stamp = json.loads(pod["metadata"]["annotations"][names.ANN_RECIPE])
            assert [p[:2] for p in stamp["phases"]] == [["anneal", ROLL_AT]]
        resume = max(CheckpointStore(store).committed_steps())
        assert resume == at
        for pod in new.values():
            runner.start(pod, extra_env={"E2E_RESUME_STEP": str(resume)})
        runner.wait_trainers()
        second = digests_of(runner)
        assert sorted(second) == list(range(at, at + ROLL_STEPS))
        current = eventually(lambda: (x := rolled(custom, ns, "roll")).get("status") == "True"
                             and x, timeout=30, what="PhaseRolled True")
        assert current["reason"] == "PodsCurrent"
        assert current["message"].startswith(f"restarted 2 pods serving an older recipe "
                                             f"(rolljob-worker-0, rolljob-worker-1) at step {at}")
        # ---- the data: the new recipe's, every step; the store's audit shows the amendment -
        steps = at + ROLL_STEPS
        old_run = run_world(load_recipe(full), 2, Knobs(workers=1), steps).hashes
        new_run = run_world(load_recipe({**full, "phases": [anneal]}), 2, Knobs(workers=1),
                            steps).hashes
        # the recipes serve the same steps before the phase, and not after it (from step 15
        # with this corpus: the lanes first finish the documents they hold)
        differ = [s for s in range(steps) if old_run[s] != new_run[s]]
        assert differ and min(differ) >= ROLL_AT, differ
        served = {s: d for s, d in first.items() if s < at} | second
        assert {s: global_hash(d[k] for k in sorted(d)) for s, d in served.items()} == {
            s: new_run[s] for s in range(steps)}
        report = CheckpointStore(store).audit()
        assert report.ok, report.all_problems()
        (amendment,) = report.amendments
        assert (amendment.before, amendment.after, amendment.appended, amendment.problem) == (
            at, at + 2, (PhaseStart("anneal", ROLL_AT),), None)
        assert dict(report.ledger) == {s: new_run[s] for s in range(max(
            CheckpointStore(store).committed_steps()))}
        stack.check_alive()
    except BaseException:
        print(runner.logs())
        print(stack.log_tail())
        raise
    finally:
        runner.close()
        custom.delete_namespaced_custom_object(TG, TV, ns, TP, "rolljob")
        c.kubectl("delete", "dp", "roll", "-n", ns, "--wait=true", "--timeout=30s",
                  check=False)


def test_pods_wait_for_the_operator_and_follow_it_back(
        stack: Stack, k8s_api: client.ApiClient) -> None:
    c, ns = stack.cluster, stack.namespace
    custom, core = client.CustomObjectsApi(k8s_api), client.CoreV1Api(k8s_api)
    created = apply(c, ns, pipeline(copy.deepcopy(RECIPE), f"file://{stack.log.parent}/o",
                                    "outage", "ojob"))
    assert created.returncode == 0, created.stderr
    wait_injection_active(core, ns, "ojob")
    custom.create_namespaced_custom_object(TG, TV, ns, TP, trainer_job("ojob", 1, "--steps",
                                                                       "1"))
    eventually(lambda: running(core, ns, "ojob", 1), timeout=90, what="the pod of ojob")
    probe = {"metadata": {"name": "probe", "labels": {names.JOB_NAME_LABEL: "ojob"}},
             "spec": {"containers": [{"name": "pytorch", "image": "x:1"}]}}

    def failures() -> int:
        return sum(e.count or 1 for e in core.list_namespaced_event(
            ns, field_selector="involvedObject.name=ojob").items
            if e.reason == "FailedCreatePod")

    def admitted() -> bool:
        try:
            core.create_namespaced_pod(ns, probe, dry_run="All")
            return True
        except ApiException:
            return False
    try:
        stack.stop()
        c.kubectl("delete", "pod", "ojob-worker-0", "-n", ns, "--wait=true")
        t_fail = time.monotonic()
        eventually(lambda: failures() > 0, timeout=60, interval=0.1,
                   what="the training-operator's FailedCreatePod")
        time.sleep(10)  # an outage of some seconds, as a restart of the operator's pod takes
        MEASURED["outage_failures"] = failures()
        MEASURED["outage_s"] = round(time.monotonic() - t_fail, 1)
    finally:
        t0 = time.monotonic()
        stack.start()  # returns once its webhook port answers TLS
    MEASURED["start_to_webhook_server_s"] = round(time.monotonic() - t0, 2)
    eventually(admitted, timeout=60, interval=0.05, what="a training pod admitted")
    MEASURED["start_to_admitted_s"] = round(time.monotonic() - t0, 2)
    retries: list[float] = []
    seen = failures()

    def recreated() -> bool:
        nonlocal seen
        now = failures()
        if now > seen:
            retries.append(round(time.monotonic() - t0, 2))
            seen = now
        return bool(live_pods(core, ns, "ojob"))
    eventually(recreated, timeout=180, interval=0.1, what="ojob-worker-0 recreated")
    MEASURED["start_to_pod_created_s"] = round(time.monotonic() - t0, 2)
    MEASURED["failed_retries_after_start_s"] = retries
    (pod,) = live_pods(core, ns, "ojob").values()
    assert any(x["name"] == names.SIDECAR_CONTAINER for x in pod["spec"]["initContainers"])
    custom.delete_namespaced_custom_object(TG, TV, ns, TP, "ojob")
    c.kubectl("delete", "dp", "outage", "-n", ns, "--wait=true", "--timeout=30s")
