"""Render the Helm chart with the real ``helm`` binary (built by tests/cluster/build.sh)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.harness import ensure_binaries

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "datalane"

# What the operator calls (datalane_operator/kube.py and kopf), nothing more.
OPERATOR_RULES = {
    ("datalane.io", "datapipelines", ""): {"get", "list", "watch"},
    ("datalane.io", "datapipelines/status", ""): {"patch"},
    ("apiextensions.k8s.io", "customresourcedefinitions", ""): {"list", "watch"},
    ("kubeflow.org", "pytorchjobs", ""): {"get", "list", "watch"},
    ("trainer.kubeflow.org", "trainjobs", ""): {"get", "list", "watch"},
    ("", "pods", ""): {"list", "watch"},
    ("", "configmaps", ""): {"create", "patch"},
    ("", "events", ""): {"create"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "{name}"): {"get", "patch"},
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "{name}"): {
        "get", "patch"},
}
# Secrets, pod deletion, the recipe ConfigMaps' collection: the ClusterRole
# <fullname>-opted-in, bound only by RoleBindings per namespace.
OPTED_IN_RULES = {("", "secrets", ""): {"get"}, ("", "pods", ""): {"delete"},
                  ("", "configmaps", ""): {"list", "delete"}}
# The Role of leader election, in the release namespace only.
LEASE_RULES = {
    ("coordination.k8s.io", "leases", ""): {"create"},
    ("coordination.k8s.io", "leases", "{name}"): {"get", "update"},
}
# Those that are not namespaced: the ClusterRole's rules when watchNamespaces is set.
CLUSTER_SCOPED = {"customresourcedefinitions", "mutatingwebhookconfigurations",
                  "validatingwebhookconfigurations"}
CLUSTER_RULES = {k: v for k, v in OPERATOR_RULES.items() if k[1] in CLUSTER_SCOPED}
NAMESPACED_RULES = {k: v for k, v in OPERATOR_RULES.items() if k[1] not in CLUSTER_SCOPED}


@cache
def helm_bin() -> str:
    return str(ensure_binaries() / "helm")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([helm_bin(), *args], capture_output=True, text=True, check=False,
                         timeout=120)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


def render(*sets: str, release: str = "dl", namespace: str = "datalane-system",
           ) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rules_of(role: dict[str, Any], name: str) -> dict[tuple[str, str, str], set[str]]:
    out: dict[tuple[str, str, str], set[str]] = {}
    for rule in role["rules"]:
        names = rule.get("resourceNames") or [""]
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                for rn in names:
                    key = (group, res, "{name}" if rn == name else rn)
                    out.setdefault(key, set()).update(rule["verbs"])
    return out
