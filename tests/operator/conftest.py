"""Fixtures of the operator tests: the real control plane (shared with tests/cluster).

tests/cluster/conftest.py registers its fixtures for that folder only. Defining them again
here would start a second control plane in a full run, so ``k8s_cluster`` here reuses the one
tests/cluster started (its plugin stashes it on the config) and otherwise starts one the same
way, through tests/cluster/harness.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import plugin as cluster_plugin
from tests.cluster.harness import Cluster, ClusterOptions, ensure_binaries

_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster: needs the real Kubernetes control plane (tests/cluster/harness.py)")


@pytest.fixture(scope="session")
def k8s_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    key = cluster_plugin._CLUSTER_KEY
    existing = request.config.stash.get(key, None)
    if existing is not None and existing.workdir is not None and existing.workdir.exists():
        yield existing
        return
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():
            bin_dir = ensure_binaries(log=lambda m: print(f"\n[cluster] {m}", flush=True))
    else:
        bin_dir = ensure_binaries()
    cluster = Cluster(ClusterOptions(), bin_dir=bin_dir)
    cluster.start()
    request.config.stash[key] = cluster
    failed_before = request.session.testsfailed
    try:
        yield cluster
    finally:
        cluster.stop(keep_workdir=request.session.testsfailed > failed_before)


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
    with k8s_cluster.namespace(f"op{next(_counter)}-{base}".rstrip("-")) as ns:
        yield ns


@pytest.fixture(scope="session")
def training_operator(k8s_cluster: Cluster) -> Cluster:
    k8s_cluster.start_training_operator()  # idempotent: shared with tests/cluster
    return k8s_cluster
