"""The operator's blast radius, its two replicas and its view of failures, on the real
control plane (API server, training-operator, kwok).

One stack: the chart scoped by the opt-in label only (as installed for real), two
``datalane-operator run`` replicas electing a leader through the chart's Lease, behind a
loopback spreader that plays the Service.

* **No replica answers** (the operator scaled to 0): a training pod and a PyTorchJob in a
  namespace that is not opted in are created at once; in the opted-in namespace a pod
  without the training-operator's label is created, a pod of the referenced job is refused,
  and a worker that the training-operator recreates is not created without its sidecar:
  it appears, injected, once a replica is back.
* **Two replicas**: both answer admission reviews; one holds the Lease and alone reconciles
  (one ``WorkloadObserved`` event, the follower counts no reconcile); killed (SIGKILL), the
  follower takes the Lease within the lease duration and acts (a scale shows in the status);
  stopped cleanly (SIGTERM), it releases the Lease and the other takes over at once.
* **A sidecar that cannot start**: a glob that matches nothing (the sidecar's own error,
  written to its termination message and reported by the pod runner as a kubelet does) and
  a Secret that does not exist (the kubelet's CreateContainerConfigError) surface as the
  ``SidecarFailed`` condition with that message, a Warning event, and ``False`` in the
  ``Ready`` column of ``kubectl get dp``.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from datalane_operator import names
from kubernetes import client
from kubernetes.client.rest import ApiException

from datalane.corpus import DemoCorpus
from tests.cluster.harness import Cluster
from tests.cluster.util import eventually
from tests.conftest import base_recipe_dict

from .builders import RECIPE
from .podrunner import ContainerConfigError, PodRunError, PodRunner
from .stack import Replica, Stack, datalane_stack
from .test_e2e import apply, dp_status, live_pods, pipeline, pytorchjob, wait_injection_active

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TG, TV, TP = names.PYTORCHJOB_GROUP, names.PYTORCHJOB_VERSION, names.PYTORCHJOB_PLURAL
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6.0, 4.0, 0.5
MEASURED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def ha(training_operator: Cluster, tmp_path_factory: pytest.TempPathFactory,
       ) -> Iterator[tuple[Stack, str]]:
    c = training_operator
    with c.namespace("datalane-ha") as ns, c.namespace("datalane-ha-other") as other, \
            datalane_stack(c, ns, tmp_path_factory.mktemp("ha"), replicas=2, release="dlha",
                           only_this_namespace=False,
                           lease_timings=(LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD)) as s:
        yield s, other
    if MEASURED:
        print(f"\n[operator ha e2e] measured: {json.dumps(MEASURED)}")


def holder(coord: client.CoordinationV1Api, stack: Stack) -> str:
    assert stack.lease is not None
    lease = coord.read_namespaced_lease(stack.lease, stack.namespace)
    return str(lease.spec.holder_identity or "")


def replica(stack: Stack, identity: str) -> Replica:
    return next(r for r in stack.replicas if r.identity == identity)


def training_pod(name: str, job: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {names.JOB_NAME_LABEL: job,
                                                  names.REPLICA_INDEX_LABEL: "0"}},
            "spec": {"containers": [{"name": "pytorch", "image": "x:1", "env": [
                {"name": "PET_NPROC_PER_NODE", "value": "1"}]}]}}


def injected(pod: dict[str, Any]) -> bool:
    return any(c["name"] == names.SIDECAR_CONTAINER
               for c in pod["spec"].get("initContainers") or [])


def review(replica: Replica, ca: bytes, namespace: str, job: str) -> dict[str, Any]:
    """POST one pod AdmissionReview straight to a replica's webhook (no API server)."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    pod = {"apiVersion": "v1", "kind": "Pod", **training_pod(f"{job}-worker-0", job)}
    pod["metadata"]["namespace"] = namespace
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace, "operation": "CREATE", "userInfo": {"username": "test"},
        "object": pod, "dryRun": True}}
    req = urllib.request.Request(
        f"https://127.0.0.1:{replica.webhook_port}/{names.WEBHOOK_INJECT}",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


def test_with_no_replica_only_opted_in_training_pods_wait(
        ha: tuple[Stack, str], k8s_api: client.ApiClient) -> None:
    stack, other = ha
    c, ns = stack.cluster, stack.namespace
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    apply(c, ns, pipeline("guard", "gjob", copy.deepcopy(RECIPE),
                          {"uri": f"file://{stack.log.parent}/guard-store"}))
    wait_injection_active(core, ns, "gjob")
    custom.create_namespaced_custom_object(TG, TV, ns, TP, pytorchjob("gjob", 2))
    eventually(lambda: len(p := live_pods(core, ns, "gjob")) == 2 and all(
        injected(x) for x in p.values()), timeout=90, what="2 injected pods of gjob")
    # a DataPipeline where the pod webhook does not fire is refused, naming the fix
    refused = c.kubectl("apply", "--server-side", "--field-manager=e2e", "-n", other, "-f", "-",
                        input=yaml.safe_dump(pipeline("elsewhere", "ejob", copy.deepcopy(
                            RECIPE), {"uri": "s3://ckpt/e", "secretRef": {"name": "e"}})),
                        check=False)
    assert refused.returncode != 0
    assert (f"kubectl label namespace {other} {names.NAMESPACE_OPT_IN_LABEL}="
            f"{names.NAMESPACE_OPT_IN_VALUE}") in " ".join(refused.stderr.split()), refused.stderr
    try:
        # ---- the operator scaled to 0: nothing answers the webhooks ----------------------
        stack.stop()
        t0 = time.monotonic()
        core.create_namespaced_pod(other, training_pod("free-worker-0", "free"))
        MEASURED["outside_pod_create_s"] = round(time.monotonic() - t0, 3)
        assert MEASURED["outside_pod_create_s"] < 5  # never waited for a webhook timeout
        custom.create_namespaced_custom_object(TG, TV, other, TP, pytorchjob("fjob", 1))
        eventually(lambda: live_pods(core, other, "fjob"), timeout=60,
                   what="the training-operator creates the pods of a job outside")
        assert not injected(next(iter(live_pods(core, other, "fjob").values())))
        # opted in: a pod that is no training pod is created; a pod of the job is refused
        core.create_namespaced_pod(ns, {"metadata": {"name": "plain"}, "spec": {
            "containers": [{"name": "c", "image": "x:1"}]}})
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(ns, training_pod("gjob-worker-9", "gjob"))
        assert 'failed calling webhook "inject.pods.datalane.io"' in json.loads(
            err.value.body)["message"]
        # the training-operator's own retry: a lost worker is not recreated without sidecar
        c.kubectl("delete", "pod", "gjob-worker-1", "-n", ns, "--wait=true")
        eventually(lambda: any(
            e.reason == "FailedCreatePod" and "inject.pods.datalane.io" in (e.message or "")
            for e in core.list_namespaced_event(
                ns, field_selector="involvedObject.name=gjob").items),
            timeout=60, what="the training-operator's FailedCreatePod event")
        assert set(live_pods(core, ns, "gjob")) == {"gjob-worker-0"}
    finally:
        stack.start()
    # ---- a replica is back: the worker comes back, with its sidecar ----------------------
    pods = eventually(lambda: (p := live_pods(core, ns, "gjob")) and len(p) == 2 and p,
                      timeout=180, interval=1, what="gjob-worker-1 recreated")
    assert all(injected(p) for p in pods.values())
    custom.delete_namespaced_custom_object(TG, TV, ns, TP, "gjob")
    custom.delete_namespaced_custom_object(TG, TV, other, TP, "fjob")
    c.kubectl("delete", "pod", "plain", "-n", ns, "--wait=false")
    c.kubectl("delete", "pod", "free-worker-0", "-n", other, "--wait=false")
    c.kubectl("delete", "dp", "guard", "-n", ns, "--wait=true", "--timeout=30s")


def test_one_leader_reconciles_and_hands_over(ha: tuple[Stack, str],
                                              k8s_api: client.ApiClient) -> None:
    stack, _ = ha
    c, ns = stack.cluster, stack.namespace
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    coord = client.CoordinationV1Api(k8s_api)
    ca = (stack.log.parent / "tls" / "ca.crt").read_bytes()
    first = eventually(lambda: holder(coord, stack), timeout=30, what="a leader")
    leader = replica(stack, first)
    follower = next(r for r in stack.replicas if r is not leader)
    apply(c, ns, pipeline("ha", "hajob", copy.deepcopy(RECIPE),
                          {"uri": f"file://{stack.log.parent}/ha-store"}))
    # both replicas answer admission (the Service sends reviews to either)
    for r in stack.replicas:
        out = eventually(lambda r=r: review(r, ca, ns, "hajob")["response"].get("patch"),
                         timeout=30, what=f"{r.identity} injects")
        assert out
    wait_injection_active(core, ns, "hajob")
    custom.create_namespaced_custom_object(TG, TV, ns, TP, pytorchjob("hajob", 2))
    eventually(lambda: dp_status(custom, ns, "ha").get("worldSize") == 2, timeout=60,
               what="status worldSize 2")
    # one replica reconciled: one WorkloadObserved event; the follower did nothing
    events = [e for e in core.list_namespaced_event(
        ns, field_selector="involvedObject.name=ha").items if e.reason == "WorkloadObserved"]
    assert len(events) == 1 and (events[0].count or 1) == 1, events
    lead = eventually(lambda: (p := leader.probes()["leader"])["reconciles"] > 0 and p,
                      timeout=30, what="the leader's reconcile count")
    assert lead["leading"] is True and lead["identity"] == leader.identity
    follows = follower.probes()["leader"]
    assert (follows["leading"], follows["reconciles"]) == (False, 0), follows

    # ---- the leader is killed: the follower takes over within the lease duration --------
    t0 = time.monotonic()
    leader.kill()
    eventually(lambda: holder(coord, stack) == follower.identity,
               timeout=LEASE_DURATION + 20, interval=0.1, what="the follower takes the Lease")
    took = time.monotonic() - t0
    MEASURED["handover_after_kill_s"] = round(took, 2)
    assert took <= LEASE_DURATION + RETRY_PERIOD + 3, took
    c.kubectl("scale", "pytorchjob", "hajob", "--replicas=1", "-n", ns)  # webhook: survivor
    eventually(lambda: dp_status(custom, ns, "ha").get("worldSize") == 1, timeout=30,
               what="the new leader reconciles the scale")
    # back, the killed replica follows (the Lease is held and renewed)
    leader.start()
    time.sleep(3 * RETRY_PERIOD)
    assert holder(coord, stack) == follower.identity

    # ---- a clean stop releases the Lease: the other takes over at once ------------------
    t0 = time.monotonic()
    follower.stop()
    eventually(lambda: holder(coord, stack) == leader.identity, timeout=LEASE_DURATION + 20,
               interval=0.1, what="the restarted replica takes the released Lease")
    took = time.monotonic() - t0
    MEASURED["handover_after_sigterm_s"] = round(took, 2)
    assert took < LEASE_DURATION, took  # released, not expired
    follower.start()
    c.kubectl("scale", "pytorchjob", "hajob", "--replicas=2", "-n", ns)
    eventually(lambda: dp_status(custom, ns, "ha").get("worldSize") == 2, timeout=30,
               what="the third leader reconciles")
    custom.delete_namespaced_custom_object(TG, TV, ns, TP, "hajob")
    c.kubectl("delete", "dp", "ha", "-n", ns, "--wait=true", "--timeout=30s")
    stack.check_alive()


def condition(custom: client.CustomObjectsApi, ns: str, name: str, ctype: str,
              ) -> dict[str, Any]:
    return next((x for x in dp_status(custom, ns, name).get("conditions") or []
                 if x["type"] == ctype), {})


def column(table: str, name: str) -> str:
    """The cell under header ``name`` of a one-row `kubectl get` table (cells may be empty)."""
    header, row = table.splitlines()[:2]
    start = header.index(name)
    word = re.compile(r"\S+\s*").match(header, start)
    assert word is not None
    end = word.end() if word.end() < len(header) else len(row)
    return row[start:end].strip()


def check_surfaces(stack: Stack, custom: client.CustomObjectsApi, core: client.CoreV1Api,
                   name: str, text: str) -> None:
    """``text`` is in the Ready and Degraded conditions (SidecarFailed), in a Warning event,
    in `kubectl describe dp`, and `kubectl get dp` shows Ready False."""
    c, ns = stack.cluster, stack.namespace
    ready = eventually(lambda: (x := condition(custom, ns, name, "Ready")).get(
        "reason") == "SidecarFailed" and x, timeout=60, what=f"{name}: Ready SidecarFailed")
    assert ready["status"] == "False" and text in ready["message"], ready
    degraded = condition(custom, ns, name, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "SidecarFailed")
    assert dp_status(custom, ns, name)["phase"] == "Degraded"
    event = eventually(lambda: next((e for e in core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}").items
        if e.reason == "SidecarFailed"), None), timeout=30, what="the SidecarFailed event")
    assert event.type == "Warning" and text in event.message
    assert column(c.kubectl("get", "dp", name, "-n", ns).stdout, "READY") == "False"
    assert column(c.kubectl("get", "dp", name, "-n", ns, "-o", "wide").stdout,
                  "REASON") == "SidecarFailed"
    described = " ".join(c.kubectl("describe", "dp", name, "-n", ns).stdout.split())
    assert "SidecarFailed" in described and " ".join(text.split()) in described


def test_a_sidecar_that_cannot_start_shows_on_the_pipeline(
        ha: tuple[Stack, str], k8s_api: client.ApiClient, corpus: DemoCorpus) -> None:
    stack, _ = ha
    c, ns = stack.cluster, stack.namespace
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    runner = PodRunner(core, ns)
    try:
        # ---- a glob that matches nothing: the sidecar's own words --------------------------
        recipe = base_recipe_dict(corpus)
        del recipe["lanes"], recipe["global_batch_size"]
        missing = f"{stack.log.parent}/no-such-data/*.parquet"
        recipe["sources"][0]["uris"] = [missing]
        apply(c, ns, pipeline("broken", "bjob", recipe,
                              {"uri": f"file://{stack.log.parent}/broken-store"}))
        wait_injection_active(core, ns, "bjob")
        custom.create_namespaced_custom_object(TG, TV, ns, TP, pytorchjob("bjob", 1))
        (pod,) = eventually(lambda: list(live_pods(core, ns, "bjob").values()), timeout=60,
                            what="the pod of bjob")
        with pytest.raises(PodRunError) as err:
            runner.start(pod)
        assert "exited with 2" in str(err.value)
        sidecar_message = f"sources[0].uris[0] '{missing}' matches no file"
        status = core.read_namespaced_pod(pod["metadata"]["name"], ns).status
        (side,) = [s for s in status.init_container_statuses
                   if s.name == names.SIDECAR_CONTAINER]
        assert side.last_state.terminated.exit_code == 2
        assert side.last_state.terminated.message == sidecar_message  # the termination log
        assert side.state.waiting.reason == "CrashLoopBackOff"
        check_surfaces(stack, custom, core, "broken",
                       f"the sidecar of pod bjob-worker-0 exited with code 2: "
                       f"{sidecar_message}")

        # ---- credentials that do not exist: the kubelet's words ---------------------------
        apply(c, ns, pipeline("nocreds", "njob", copy.deepcopy(recipe) | {
            "sources": base_recipe_dict(corpus)["sources"]},
            {"uri": "s3://nowhere/run", "secretRef": {"name": "absent-creds"}}))
        wait_injection_active(core, ns, "njob")
        custom.create_namespaced_custom_object(TG, TV, ns, TP, pytorchjob("njob", 1))
        (pod,) = eventually(lambda: list(live_pods(core, ns, "njob").values()), timeout=60,
                            what="the pod of njob")
        with pytest.raises(ContainerConfigError):
            runner.start(pod)
        check_surfaces(stack, custom, core, "nocreds",
                       'the sidecar of pod njob-worker-0 CreateContainerConfigError: secret '
                       '"absent-creds" not found')
    except BaseException:
        print(runner.logs())
        print(stack.log_tail())
        raise
    finally:
        runner.close()
    for job, dpn in (("bjob", "broken"), ("njob", "nocreds")):
        custom.delete_namespaced_custom_object(TG, TV, ns, TP, job)
        c.kubectl("delete", "dp", dpn, "-n", ns, "--wait=true", "--timeout=30s")
