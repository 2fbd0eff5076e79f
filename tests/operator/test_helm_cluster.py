"""The chart on the real control plane: install with hooks, RBAC as `kubectl auth can-i` sees it."""

from __future__ import annotations

import re

import pytest

from tests.cluster.harness import Cluster

from .helmchart import CHART, CLUSTER_RULES, LEASE_RULES, OPERATOR_RULES, OPTED_IN_RULES

pytestmark = pytest.mark.cluster
# granted to every authenticated user by the API server's default roles
DEFAULTS = {"selfsubjectreviews.authentication.k8s.io",
            "selfsubjectaccessreviews.authorization.k8s.io",
            "selfsubjectrulesreviews.authorization.k8s.io",
            "clustertrustbundles.certificates.k8s.io"}
# The session's CRD may be another's (tests/operator/test_crd_cluster.py applies it, an earlier
# release kept it): adopt it, as docs/operator.md#upgrades says to.
TAKE_CRD = ("--take-ownership",)


def can_i_list(cluster: Cluster, user: str, namespace: str = "default",
               ) -> dict[tuple[str, str, str], set[str]]:
    out = cluster.kubectl("auth", "can-i", "--list", f"--as={user}", "-n", namespace).stdout
    rights: dict[tuple[str, str, str], set[str]] = {}
    for line in out.splitlines()[1:]:
        if not line.strip() or line.startswith(" "):
            continue  # non-resource URLs
        resource, _urls, names, verbs = re.findall(r"\[[^\]]*\]|\S+", line)
        if resource in DEFAULTS:
            continue
        plural, _, group = resource.partition(".")
        if "/" in group:  # "datapipelines.datalane.io/status"
            group, _, sub = group.partition("/")
            plural = f"{plural}/{sub}"
        for name in names.strip("[]").split() or [""]:
            key = (group, plural, name)
            rights.setdefault(key, set()).update(verbs.strip("[]").split())
    return rights


def test_install_and_least_privilege(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    release = k8s_namespace[:20].rstrip("-")
    out = k8s_cluster.helm("install", release, str(CHART), "--namespace", k8s_namespace,
                           *TAKE_CRD, "--wait", "--timeout", "120s")
    assert "STATUS: deployed" in out.stdout
    try:
        fullname = f"{release}-datalane"
        sa = f"system:serviceaccount:{k8s_namespace}:{fullname}"
        expected = {(g, r, fullname if n == "{name}" else n): v
                    for (g, r, n), v in OPERATOR_RULES.items()}
        assert can_i_list(k8s_cluster, sa) == expected
        # spot checks of what must stay out of reach
        for verb, what in (("list", "secrets"), ("get", "secrets"), ("delete", "pods"),
                           ("create", "pods"),
                           ("patch", "mutatingwebhookconfigurations/other"),
                           ("update", "pytorchjobs.kubeflow.org"),
                           ("delete", "datapipelines.datalane.io")):
            res = k8s_cluster.kubectl("auth", "can-i", verb, what, f"--as={sa}", check=False)
            assert res.stdout.strip() == "no", (verb, what)
        # the hook Job ran (kwok completes it) and was cleaned up; the Deployment is up
        deploy = k8s_cluster.kubectl("get", "deploy", fullname, "-n", k8s_namespace, "-o",
                                     "jsonpath={.status.readyReplicas}").stdout
        assert deploy == "2"  # two replicas (kwok runs no container: both "ready")
        pdb = k8s_cluster.kubectl("get", "pdb", fullname, "-n", k8s_namespace, "-o",
                                  "jsonpath={.spec.minAvailable}").stdout
        assert pdb == "1"
        # the Lease of leader election: in the release namespace, by name, nowhere else
        lease = f"{fullname}-leader"
        here = can_i_list(k8s_cluster, sa, k8s_namespace)
        assert here == expected | {(g, r, lease if n == "{name}" else n): v
                                   for (g, r, n), v in LEASE_RULES.items()}
        for verb, ns, answer in (("update", k8s_namespace, "yes"),
                                 ("update", "default", "no"), ("delete", k8s_namespace, "no")):
            res = k8s_cluster.kubectl("auth", "can-i", verb, f"leases/{lease}", f"--as={sa}",
                                      "-n", ns, check=False)
            assert res.stdout.strip() == answer, (verb, ns)
        res = k8s_cluster.kubectl("auth", "can-i", "update", "leases/other", f"--as={sa}", "-n",
                                  k8s_namespace, check=False)
        assert res.stdout.strip() == "no"
        jobs = k8s_cluster.kubectl("get", "jobs", "-n", k8s_namespace, "-o", "name").stdout
        assert jobs.strip() == ""
    finally:
        k8s_cluster.helm("uninstall", release, "--namespace", k8s_namespace, "--wait")
    left = k8s_cluster.kubectl("get", "clusterrole,clusterrolebinding,"
                               "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                               "-o", "name").stdout
    assert fullname not in left


def test_watched_namespaces_only(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    """With operator.watchNamespaces, the operator may read Secrets and write ConfigMaps in
    the watched namespace only: everywhere else it has just the cluster-scoped rules."""
    release = "w" + k8s_namespace[:18].rstrip("-")
    watched, other = f"{k8s_namespace}-w", f"{k8s_namespace}-o"
    with k8s_cluster.namespace(watched), k8s_cluster.namespace(other):
        k8s_cluster.helm("install", release, str(CHART), "--namespace", k8s_namespace,
                         "--set", f"operator.watchNamespaces={{{watched}}}", *TAKE_CRD, "--wait",
                         "--timeout", "120s")
        try:
            fullname = f"{release}-datalane"
            sa = f"system:serviceaccount:{k8s_namespace}:{fullname}"
            named = {(g, r, fullname if n == "{name}" else n): v
                     for (g, r, n), v in OPERATOR_RULES.items()}
            assert can_i_list(k8s_cluster, sa, watched) == {
                k: named.get(k, set()) | OPTED_IN_RULES.get(k, set())
                for k in named.keys() | OPTED_IN_RULES.keys()}
            assert can_i_list(k8s_cluster, sa, other) == {
                (g, r, fullname if n == "{name}" else n): v
                for (g, r, n), v in CLUSTER_RULES.items()}
            for verb, what in (("get", "secrets"), ("create", "configmaps"),
                               ("list", "pods"), ("watch", "datapipelines.datalane.io")):
                for ns, answer in ((watched, "yes"), (other, "no"), (k8s_namespace, "no")):
                    res = k8s_cluster.kubectl("auth", "can-i", verb, what, f"--as={sa}", "-n",
                                              ns, check=False)
                    assert res.stdout.strip() == answer, (verb, what, ns)
        finally:
            k8s_cluster.helm("uninstall", release, "--namespace", k8s_namespace, "--wait")
