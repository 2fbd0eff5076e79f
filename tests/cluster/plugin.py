"""pytest fixtures for the real control plane (see playground/cluster.py and
docs/control-plane.md).

Fixtures (one cluster per test run, started on first use):
  k8s_cluster        session  harness.Cluster: etcd, kube-apiserver, kube-controller-manager,
                              kube-scheduler, kwok with 3 fake GPU nodes (8 x nvidia.com/gpu)
  k8s_api            session  kubernetes.client.ApiClient for that cluster (admin)
  k8s_namespace      function a fresh namespace (its default ServiceAccount exists), deleted after
  training_operator  session  Kubeflow training-operator v1.9 running against k8s_cluster,
                              PyTorchJob CRD applied, its validating webhook registered

Marker: `cluster` (added to every test that uses k8s_cluster, so `-m "not cluster"` skips the
tier). On a failing test that used the cluster, the tails of the component logs are attached
to the report. Load from another directory with `pytest_plugins = ["tests.cluster.plugin"]`
(or the dotted name that matches your rootdir layout).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from playground.cluster import Cluster, ClusterOptions, ensure_binaries

_CLUSTER_KEY = pytest.StashKey["Cluster"]()
_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster: needs the real Kubernetes control plane (playground/cluster.py)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "k8s_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def k8s_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    # A first run builds the binaries (tens of minutes): show build.sh's progress live.
    capman = request.config.pluginmanager.getplugin("capturemanager")
    ctx = capman.global_and_fixture_disabled() if capman else _null()
    with ctx:
        bin_dir = ensure_binaries(log=lambda m: print(f"\n[cluster] {m}", flush=True))
    cluster = Cluster(ClusterOptions(), bin_dir=bin_dir)
    cluster.start()
    request.config.stash[_CLUSTER_KEY] = cluster
    failed_before = request.session.testsfailed
    try:
        yield cluster
    finally:
        keep = request.session.testsfailed > failed_before
        cluster.stop(keep_workdir=keep)


@pytest.fixture(scope="session")
def k8s_api(k8s_cluster: Cluster) -> Iterator[Any]:
    client = k8s_cluster.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def k8s_namespace(k8s_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"t{next(_counter)}-{base}".rstrip("-")
    with k8s_cluster.namespace(name) as ns:
        yield ns


@pytest.fixture(scope="session")
def training_operator(k8s_cluster: Cluster) -> Cluster:
    k8s_cluster.start_training_operator()
    return k8s_cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "k8s_cluster" in getattr(item, "fixturenames", ()):
        cluster = item.config.stash.get(_CLUSTER_KEY, None)
        if cluster is not None and cluster.workdir is not None:
            report.sections.append(("control plane logs", cluster.diagnostics(lines=30)))


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None
