"""CRD upgrades on the real API server (docs/operator.md#upgrades).

The previous chart is ``testdata/datalane-0.1.0.tgz`` (``helm package`` of the chart at the
commit before the CRD became a template): its CRD sits in the chart's ``crds/``, which Helm
installs once and never upgrades, and serves v1alpha1 only. Each test starts from that CRD
(the cluster's CRD is deleted first and the current one applied again at the end: the CRD is
cluster-wide, shared with the other cluster tests), creates a DataPipeline, takes one upgrade
path, and checks that the new CRD is served (v1beta1) and that the old object still reads,
validates and takes status under both versions.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from datalane_operator.names import GROUP, PLURAL
from kubernetes import client

from tests.cluster.harness import Cluster
from tests.cluster.util import eventually

from .builders import dp
from .helmchart import CHART, ROOT

pytestmark = pytest.mark.cluster
NAME = f"{PLURAL}.{GROUP}"
CRD = ROOT / "crds" / f"{NAME}.yaml"
PREVIOUS = Path(__file__).parent / "testdata" / "datalane-0.1.0.tgz"
# The chart's webhooks call an operator that kwok does not run: keep them off this namespace.
NO_WEBHOOKS = ("--set", "webhook.namespaceSelector.matchLabels.datalane-test=no-webhooks")


def previous_crd() -> str:
    with tarfile.open(PREVIOUS) as tar:
        member = tar.extractfile(f"datalane/crds/{NAME}.yaml")
        assert member is not None
        return member.read().decode()


def delete_crd(c: Cluster) -> None:
    c.kubectl("delete", "crd", NAME, "--ignore-not-found", "--wait", "--timeout", "60s")


@pytest.fixture
def no_crd(k8s_cluster: Cluster) -> Iterator[Cluster]:
    """No DataPipeline CRD in the cluster; the current one, owned by nobody, afterwards."""
    delete_crd(k8s_cluster)
    try:
        yield k8s_cluster
    finally:
        delete_crd(k8s_cluster)
        k8s_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        k8s_cluster.wait_crd_established(NAME)


def crd_of(c: Cluster) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(c.kubectl("get", "crd", NAME, "-o", "json").stdout)
    return out


def served(c: Cluster) -> list[str]:
    return [v["name"] for v in crd_of(c)["spec"]["versions"] if v["served"]]


def create_pipeline(api: client.ApiClient, ns: str, version: str, body: dict[str, Any],
                    ) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    body["apiVersion"] = f"{GROUP}/{version}"
    body["metadata"] = {"name": body["metadata"]["name"], "namespace": ns}
    out: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, version, ns, PLURAL, body)
    return out


def read(api: client.ApiClient, ns: str, version: str, name: str = "pretrain") -> dict[str, Any]:
    out: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, version, ns, PLURAL, name)
    return out


def refused(call: Any, *args: Any) -> str:
    with pytest.raises(client.ApiException) as err:
        call(*args)
    assert err.value.status == 422, err.value.body
    return str(err.value.body)


def check_the_upgrade(c: Cluster, api: client.ApiClient, ns: str,
                      before: dict[str, Any]) -> None:
    """The upgraded CRD serves v1beta1; ``before`` (created under the previous CRD) reads,
    validates and takes status under both versions; v1alpha1 stays the storage version."""
    beta = eventually(lambda: _read_or_none(api, ns, "v1beta1"), timeout=30,
                      what="v1beta1 to be served")
    alpha = read(api, ns, "v1alpha1")
    assert (alpha["apiVersion"], beta["apiVersion"]) == ("datalane.io/v1alpha1",
                                                         "datalane.io/v1beta1")
    assert alpha["spec"] == beta["spec"] == before["spec"]
    assert alpha["metadata"]["uid"] == beta["metadata"]["uid"] == before["metadata"]["uid"]
    assert crd_of(c)["status"]["storedVersions"] == ["v1alpha1"]
    custom = client.CustomObjectsApi(api)
    # the rules of the old schema hold under the new name
    body = refused(custom.patch_namespaced_custom_object, GROUP, "v1beta1", ns, PLURAL,
                   "pretrain", {"spec": {"lanes": 16, "globalBatchSize": 32}})
    assert "spec.lanes is fixed for the life of a run" in body
    body = refused(create_pipeline, api, ns, "v1beta1", dp("odd", batch=12))
    assert "spec.globalBatchSize must be a multiple of spec.lanes" in body
    # the status the operator writes (v1alpha1) is the status a v1beta1 reader sees
    custom.patch_namespaced_custom_object_status(GROUP, "v1alpha1", ns, PLURAL, "pretrain",
                                                 {"status": {"phase": "Running",
                                                             "worldSize": 4}})
    assert read(api, ns, "v1beta1")["status"] == {"phase": "Running", "worldSize": 4}
    # a pipeline written as v1beta1 is the same object under v1alpha1, with its defaults
    made = create_pipeline(api, ns, "v1beta1", dp("beta", lanes=4, batch=8))
    again = read(api, ns, "v1alpha1", "beta")
    assert again["spec"] == made["spec"]
    assert again["spec"]["parallelism"] == {"tensor": 1, "pipeline": 1, "context": 1}


def _read_or_none(api: client.ApiClient, ns: str, version: str) -> dict[str, Any] | None:
    try:
        return read(api, ns, version)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def test_kubectl_apply_of_crds_upgrades_the_previous_crd(
        no_crd: Cluster, k8s_api: client.ApiClient, k8s_namespace: str) -> None:
    """Without Helm (or with crds.install=false): ``kubectl apply --server-side
    --force-conflicts -f crds/`` upgrades the CRD in place, and the previous one undoes it;
    the pipelines stay."""
    c, ns = no_crd, k8s_namespace
    c.kubectl("apply", "--server-side", "-f", "-", input=previous_crd())
    c.wait_crd_established(NAME)
    assert served(c) == ["v1alpha1"]
    before = create_pipeline(k8s_api, ns, "v1alpha1", dp())
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    assert served(c) == ["v1alpha1", "v1beta1"]
    check_the_upgrade(c, k8s_api, ns, before)
    # undone: nothing was stored as v1beta1, so the previous CRD applies again, and the
    # pipeline written as v1beta1 reads as the v1alpha1 it is stored as
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=previous_crd())
    assert served(c) == ["v1alpha1"]
    assert read(k8s_api, ns, "v1alpha1", "beta")["spec"]["lanes"] == 4


@pytest.mark.parametrize("adopt", ["--take-ownership", "owner labels"])
def test_helm_upgrade_from_the_previous_chart_upgrades_the_crd_and_uninstall_keeps_it(
        no_crd: Cluster, k8s_api: client.ApiClient, k8s_namespace: str, tmp_path: Path,
        adopt: str) -> None:
    """0.1.0 (CRD in crds/) -> this chart: the upgrade that adopts the CRD once (Helm's
    ``--take-ownership``, or, before Helm 3.17, the owner's label and annotations set by
    hand) applies the new CRD; a later chart's changed CRD takes effect on a plain ``helm
    upgrade``; ``helm uninstall`` leaves the CRD and the pipelines."""
    c, ns = no_crd, k8s_namespace
    release = "up" + ns[:16].rstrip("-")
    wait = ("--wait", "--timeout", "120s")
    c.helm("install", release, str(PREVIOUS), "--namespace", ns, *NO_WEBHOOKS, *wait)
    c.wait_crd_established(NAME)
    assert served(c) == ["v1alpha1"]
    before = create_pipeline(k8s_api, ns, "v1alpha1", dp())
    try:
        # crds/ left no Helm ownership on the CRD: a plain upgrade refuses to adopt it
        out = c.helm("upgrade", release, str(CHART), "--namespace", ns, *NO_WEBHOOKS, *wait,
                      check=False)
        assert out.returncode != 0 and "invalid ownership metadata" in out.stderr, out.stderr
        assert served(c) == ["v1alpha1"]
        if adopt == "--take-ownership":
            c.helm("upgrade", release, str(CHART), "--namespace", ns, adopt, *NO_WEBHOOKS,
                   *wait)
        else:
            c.kubectl("label", "crd", NAME, "app.kubernetes.io/managed-by=Helm")
            c.kubectl("annotate", "crd", NAME, f"meta.helm.sh/release-name={release}",
                      f"meta.helm.sh/release-namespace={ns}")
            c.helm("upgrade", release, str(CHART), "--namespace", ns, *NO_WEBHOOKS, *wait)
        crd = crd_of(c)
        assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1", "v1beta1"]
        annotations = crd["metadata"]["annotations"]
        assert annotations["helm.sh/resource-policy"] == "keep"
        assert annotations["meta.helm.sh/release-name"] == release
        check_the_upgrade(c, k8s_api, ns, before)

        # the next chart changes the CRD: a plain `helm upgrade` applies it
        chart = tmp_path / "datalane"
        shutil.copytree(CHART, chart)
        template = chart / "templates" / "crd.yaml"
        text = template.read_text()
        assert text.count("    - datalane\n") == 1
        template.write_text(text.replace("    - datalane\n", "    - datalane\n    - training\n"))
        c.helm("upgrade", release, str(chart), "--namespace", ns, *NO_WEBHOOKS, *wait)
        assert crd_of(c)["spec"]["names"]["categories"] == ["datalane", "training"]
    finally:
        c.helm("uninstall", release, "--namespace", ns, "--wait", check=False)
    # kept: the CRD and, with it, every pipeline
    assert crd_of(c)["spec"]["names"]["categories"] == ["datalane", "training"]
    assert read(k8s_api, ns, "v1beta1")["metadata"]["uid"] == before["metadata"]["uid"]
    assert c.helm("list", "--namespace", ns, "-q").stdout.strip() == ""

