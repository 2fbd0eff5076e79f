"""The Helm chart: lint, rendering, least-privilege RBAC, webhooks wired to the handlers, the
webhooks' blast radius (opt-in namespaces, per-webhook failure policies), two replicas with a
Lease, a PodDisruptionBudget and a rolling update that never leaves no replica."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from datalane_operator import names
from datalane_operator.policy import Policy

from .helmchart import (
    CHART,
    CLUSTER_RULES,
    LEASE_RULES,
    NAMESPACED_RULES,
    OPERATOR_RULES,
    OPTED_IN_RULES,
    ROOT,
    by_kind,
    helm,
    render,
    rules_of,
)

# helm is one of the tools `make cluster` builds from Go modules: on a fresh machine the first
# call builds the whole control plane (about 25 minutes), which the fast tier must never wait on.
pytestmark = [pytest.mark.cluster]


def test_lint_is_clean() -> None:
    out = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


def test_chart_crd_is_the_generated_one_and_upgrades_with_the_chart() -> None:
    """The chart renders the generated CRD as a template (Helm applies crds/ on the first
    install only, never on an upgrade), kept by Helm on uninstall; crds.install=false leaves
    it to whoever manages it (another release, kubectl, GitOps)."""
    assert not (CHART / "crds").exists()  # Helm would install it once and never upgrade it
    (crd,) = by_kind(render(), "CustomResourceDefinition")
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert crd == yaml.safe_load((ROOT / "crds" / "datapipelines.datalane.io.yaml").read_text())
    assert by_kind(render("crds.install=false"), "CustomResourceDefinition") == []


def test_default_render() -> None:
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ServiceAccount", "ServiceAccount", "ClusterRole", "ClusterRole",
                            "ClusterRoleBinding", "Service", "Deployment",
                            "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                            "Role", "RoleBinding", "Role", "RoleBinding", "Job",
                            "PodDisruptionBudget", "CustomResourceDefinition"])
    (dep,) = by_kind(docs, "Deployment")
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/datalane/datalane-operator:0.1.0"
    assert c["args"] == ["run"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DATALANE_OPERATOR_TLS_DIR"] == "/tls"
    assert env["DATALANE_OPERATOR_WEBHOOK_CONFIGURATION"] == "dl-datalane"
    assert env["DATALANE_OPERATOR_SIDECAR_IMAGE"] == "ghcr.io/datalane/datalane-sidecar:0.1.0"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["tls"]["secret"]["secretName"] == "dl-datalane-webhook-tls"
    (job,) = by_kind(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][0] == "certs"


def test_webhooks_reach_the_kopf_handlers() -> None:
    docs = render()
    (mut,) = by_kind(docs, "MutatingWebhookConfiguration")
    (val,) = by_kind(docs, "ValidatingWebhookConfiguration")
    inject, inject_jobset = mut["webhooks"]
    assert inject_jobset["clientConfig"]["service"] == {
        "name": "dl-datalane", "namespace": "datalane-system",
        "path": f"/{names.WEBHOOK_INJECT}", "port": 443}
    assert inject_jobset["rules"] == inject["rules"]
    assert inject["clientConfig"]["service"] == {
        "name": "dl-datalane", "namespace": "datalane-system",
        "path": f"/{names.WEBHOOK_INJECT}", "port": 443}
    assert "caBundle" not in inject["clientConfig"]  # filled in by the operator
    assert inject["objectSelector"]["matchExpressions"] == [
        {"key": names.JOB_NAME_LABEL, "operator": "Exists"}]
    assert inject["rules"][0]["resources"] == ["pods"]
    assert inject["rules"][0]["operations"] == ["CREATE"]
    paths = {w["name"]: (w["clientConfig"]["service"]["path"], w["rules"][0]["resources"])
             for w in val["webhooks"]}
    assert paths.pop("namespace.datapipelines.datalane.io") == (
        f"/{names.WEBHOOK_REFUSE_NAMESPACE}", ["datapipelines"])
    assert paths == {
        "datapipelines.datalane.io": (f"/{names.WEBHOOK_VALIDATE_PIPELINE}", ["datapipelines"]),
        "pytorchjobs.datalane.io": (f"/{names.WEBHOOK_VALIDATE_WORKLOAD}", ["pytorchjobs"]),
        "scale.pytorchjobs.datalane.io": (f"/{names.WEBHOOK_VALIDATE_SCALE}",
                                          ["pytorchjobs/scale"]),
        "trainjobs.datalane.io": (f"/{names.WEBHOOK_VALIDATE_TRAINJOB}", ["trainjobs"]),
    }
    assert next(w for w in val["webhooks"] if w["name"] == "trainjobs.datalane.io")[
        "rules"][0]["apiGroups"] == [names.TRAINJOB_GROUP]
    # the pod webhooks write the ConfigMap of the recipe they inject, never on a dry run
    assert inject["sideEffects"] == inject_jobset["sideEffects"] == "NoneOnDryRun"
    for w in val["webhooks"]:
        assert w["sideEffects"] == "None"


def webhooks_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    confs = by_kind(docs, "MutatingWebhookConfiguration") + by_kind(
        docs, "ValidatingWebhookConfiguration")
    return {w["name"]: w for c in confs for w in c["webhooks"]}


def test_webhooks_fire_only_where_a_pipeline_can_apply() -> None:
    """Pods, PyTorchJobs and scales are sent to the operator only from opted-in namespaces
    (pods: only those of a training job too); DataPipelines from everywhere, and their
    creation outside opted-in namespaces goes to the refusal webhook. Each webhook has the
    failure policy and timeout of docs/operator.md's table."""
    hooks = webhooks_of(render())
    opted_in = {"matchLabels": {names.NAMESPACE_OPT_IN_LABEL: names.NAMESPACE_OPT_IN_VALUE}}
    assert {name: (w.get("namespaceSelector"), w.get("objectSelector"), w["failurePolicy"],
                   w["timeoutSeconds"], w["rules"][0]["operations"])
            for name, w in hooks.items()} == {
        "inject.pods.datalane.io": (opted_in, {"matchExpressions": [
            {"key": names.JOB_NAME_LABEL, "operator": "Exists"}]}, "Fail", 10, ["CREATE"]),
        # a TrainJob's trainer pods only, not its JobSet's initializer pods
        "inject.jobset-pods.datalane.io": (opted_in, {"matchExpressions": [
            {"key": names.JOBSET_NAME_LABEL, "operator": "Exists"},
            {"key": names.JOBSET_REPLICATED_JOB_LABEL, "operator": "In",
             "values": [names.TRAINJOB_TRAINER]}]}, "Fail", 10, ["CREATE"]),
        "pytorchjobs.datalane.io": (opted_in, None, "Fail", 5, ["CREATE", "UPDATE"]),
        "trainjobs.datalane.io": (opted_in, None, "Fail", 5, ["CREATE", "UPDATE"]),
        "scale.pytorchjobs.datalane.io": (opted_in, None, "Fail", 5, ["UPDATE"]),
        "datapipelines.datalane.io": (None, None, "Fail", 10, ["CREATE", "UPDATE"]),
        "namespace.datapipelines.datalane.io": ({"matchExpressions": [
            {"key": names.NAMESPACE_OPT_IN_LABEL, "operator": "NotIn",
             "values": [names.NAMESPACE_OPT_IN_VALUE]}]}, None, "Fail", 10, ["CREATE"]),
    }
    # a user selector narrows every webhook further, ANDed with the opt-in label
    hooks = webhooks_of(render("webhook.namespaceSelector.matchLabels.team=ml",
                               "webhook.pods.failurePolicy=Ignore",
                               "webhook.pods.timeoutSeconds=3"))
    assert hooks["inject.pods.datalane.io"]["namespaceSelector"] == {"matchLabels": {
        "team": "ml", names.NAMESPACE_OPT_IN_LABEL: names.NAMESPACE_OPT_IN_VALUE}}
    assert (hooks["inject.pods.datalane.io"]["failurePolicy"],
            hooks["inject.pods.datalane.io"]["timeoutSeconds"]) == ("Ignore", 3)
    assert hooks["datapipelines.datalane.io"]["namespaceSelector"] == {
        "matchLabels": {"team": "ml"}}
    assert hooks["pytorchjobs.datalane.io"]["failurePolicy"] == "Fail"  # only pods changed


def test_two_replicas_a_lease_and_upgrades_that_keep_one_serving() -> None:
    docs = render()
    (dep,) = by_kind(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DATALANE_OPERATOR_LEADER_ELECTION_LEASE"] == "dl-datalane-leader"
    assert env["DATALANE_OPERATOR_LEADER_ELECTION_NAMESPACE"] == "datalane-system"
    assert (env["DATALANE_OPERATOR_LEASE_DURATION"], env["DATALANE_OPERATOR_RENEW_DEADLINE"],
            env["DATALANE_OPERATOR_RETRY_PERIOD"]) == ("15", "10", "2")
    pod_name = next(e for e in c["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["DATALANE_OPERATOR_SIDECAR_PROTOCOLS"] == "file,memory,s3,s3a,gs,gcs"
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "python"
    # an endpoint of the webhook Service within a second of the port opening
    assert c["readinessProbe"] == {"tcpSocket": {"port": "webhook"}, "periodSeconds": 1,
                                   "failureThreshold": 3}
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {
        "matchLabels": spec["selector"]["matchLabels"]}}
    # the Lease: its own Role in the release namespace, nothing cluster-wide
    lease = next(r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "dl-datalane-leader")
    assert lease["metadata"]["namespace"] == "datalane-system"
    assert rules_of(lease, "dl-datalane-leader") == LEASE_RULES
    binding = next(b for b in by_kind(docs, "RoleBinding")
                   if b["metadata"]["name"] == "dl-datalane-leader")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dl-datalane",
                                    "namespace": "datalane-system"}]
    # one replica: no PodDisruptionBudget, which would block every drain
    assert not by_kind(render("operator.replicas=1"), "PodDisruptionBudget")
    assert not by_kind(render("operator.enabled=false"), "PodDisruptionBudget")


def cluster_roles(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}


def test_rbac_is_least_privilege() -> None:
    docs = render()
    role = cluster_roles(docs)["dl-datalane"]
    assert rules_of(role, "dl-datalane") == OPERATOR_RULES
    hook_role = next(r for r in by_kind(docs, "Role")
                     if r["metadata"]["name"] == "dl-datalane-certs")
    assert rules_of(hook_role, "dl-datalane-webhook-tls") == {
        ("", "secrets", ""): {"create"}, ("", "secrets", "{name}"): {"get", "update"}}
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dl-datalane",
                                    "namespace": "datalane-system"}]


def test_watched_namespaces_get_roles_not_cluster_wide_secrets() -> None:
    docs = render("operator.watchNamespaces={team-a,team-b}")
    role = cluster_roles(docs)["dl-datalane"]
    assert rules_of(role, "dl-datalane") == CLUSTER_RULES  # no secrets, configmaps, pods
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role")
             if r["metadata"]["name"] == "dl-datalane"}
    assert sorted(roles) == ["team-a", "team-b"]
    for role in roles.values():
        assert rules_of(role, "dl-datalane") == NAMESPACED_RULES
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding")
                if b["metadata"]["name"] == "dl-datalane"}
    secret_bindings = {b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding")
                       if b["metadata"]["name"] == "dl-datalane-opted-in"}
    assert secret_bindings == {"team-a", "team-b"}  # Secrets readable where it watches
    assert sorted(bindings) == ["team-a", "team-b"]
    for binding in bindings.values():
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": "dl-datalane"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dl-datalane",
                                        "namespace": "datalane-system"}]
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "run", "--namespace=team-a", "--namespace=team-b"]
    # the webhooks admit only the watched namespaces (the operator could not look elsewhere),
    # and the opted-in ones among them where pods and jobs are concerned
    confs = by_kind(docs, "MutatingWebhookConfiguration") + by_kind(
        docs, "ValidatingWebhookConfiguration")
    selectors = {w["name"]: w["namespaceSelector"] for c in confs for w in c["webhooks"]}
    watched = {"key": "kubernetes.io/metadata.name", "operator": "In",
               "values": ["team-a", "team-b"]}
    assert len(selectors) == 7
    for name in ("inject.pods.datalane.io", "inject.jobset-pods.datalane.io",
                 "pytorchjobs.datalane.io", "scale.pytorchjobs.datalane.io",
                 "trainjobs.datalane.io"):
        assert selectors[name] == {"matchLabels": {names.NAMESPACE_OPT_IN_LABEL: "enabled"},
                                   "matchExpressions": [watched]}, name
    assert selectors["datapipelines.datalane.io"] == {"matchExpressions": [watched]}
    assert selectors["namespace.datapipelines.datalane.io"] == {"matchExpressions": [
        watched, {"key": names.NAMESPACE_OPT_IN_LABEL, "operator": "NotIn",
                  "values": ["enabled"]}]}
    # watching every namespace: one ClusterRole, no namespaced Role of the operator
    docs = render()
    assert not [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "dl-datalane"]
    assert rules_of(cluster_roles(docs)["dl-datalane"], "dl-datalane") == OPERATOR_RULES


def test_secrets_and_pod_deletion_only_where_a_role_binding_grants_them() -> None:
    """Watching every namespace, the operator still reads Secrets and deletes pods only in the
    namespaces of operator.optedInNamespaces (and the watched ones): a ClusterRole of those two
    rules, bound by a RoleBinding in each, never by a ClusterRoleBinding."""
    for sets, where in (
            ((), []),
            (("operator.optedInNamespaces={team-a,team-b}",), ["team-a", "team-b"]),
            (("operator.watchNamespaces={team-a}", "operator.optedInNamespaces={team-a,x}"),
             ["team-a", "x"])):
        docs = render(*sets)
        roles = cluster_roles(docs)
        assert sorted(roles) == ["dl-datalane", "dl-datalane-opted-in"]
        assert rules_of(roles["dl-datalane-opted-in"], "-") == OPTED_IN_RULES
        main = rules_of(roles["dl-datalane"], "-")
        assert not any(k[1] == "secrets" for k in main)
        assert "delete" not in main.get(("", "pods", ""), set())
        namespaced = [rule for r in by_kind(docs, "Role") if r["metadata"]["name"] ==
                      "dl-datalane" for rule in r["rules"]]
        assert not any("secrets" in rule["resources"] for rule in namespaced)
        assert not any("delete" in rule["verbs"] for rule in namespaced)
        assert [b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")] == [
            "dl-datalane"]
        secret_bindings = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding")
                           if b["metadata"]["name"] == "dl-datalane-opted-in"}
        assert sorted(secret_bindings) == where, sets
        for b in secret_bindings.values():
            assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                    "kind": "ClusterRole", "name": "dl-datalane-opted-in"}
            assert b["subjects"] == [{"kind": "ServiceAccount", "name": "dl-datalane",
                                      "namespace": "datalane-system"}]


def operator_policy(*sets: str) -> Policy:
    """The policy the operator builds from the env that the chart's Deployment gives it."""
    (dep,) = by_kind(render(*sets), "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0][
        "env"]}
    return Policy.from_flags(env["DATALANE_OPERATOR_ALLOW_OPERATOR_IDENTITY"] == "true",
                             env["DATALANE_OPERATOR_OPERATOR_IDENTITY_PREFIXES"],
                             env["DATALANE_OPERATOR_PREDICATE_MODULES"])


def test_policy_values_reach_the_operator() -> None:
    assert operator_policy() == Policy()  # the default: no operator identity, no predicates
    assert operator_policy(
        "checkpoints.allowOperatorIdentity=true",
        "checkpoints.operatorIdentityPrefixes.team-a={s3://ckpt/team-a/,file:///mnt/a/}",
        "recipes.predicateModules={corp.filters,corp.lang}") == Policy(
        True, {"team-a": ("s3://ckpt/team-a/", "file:///mnt/a/")}, ("corp.filters", "corp.lang"))


def test_operator_outside_the_cluster() -> None:
    docs = render("operator.enabled=false", "tls.mode=secret", "tls.secretName=mine",
                  "webhook.url=https://127.0.0.1:9443/", "webhook.caBundle=QUJD")
    assert not by_kind(docs, "Deployment") and not by_kind(docs, "Job")
    (mut,) = by_kind(docs, "MutatingWebhookConfiguration")
    assert mut["webhooks"][0]["clientConfig"] == {
        "url": f"https://127.0.0.1:9443/{names.WEBHOOK_INJECT}", "caBundle": "QUJD"}


def test_cert_manager_mode() -> None:
    docs = render("tls.mode=certManager")
    (cert,) = by_kind(docs, "Certificate")
    assert cert["spec"]["secretName"] == "dl-datalane-webhook-tls"
    assert cert["spec"]["dnsNames"][0] == "dl-datalane.datalane-system.svc"
    assert by_kind(docs, "Issuer") and not by_kind(docs, "Job")
    for conf in by_kind(docs, "MutatingWebhookConfiguration") + by_kind(
            docs, "ValidatingWebhookConfiguration"):
        assert conf["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            "datalane-system/dl-datalane")
    (dep,) = by_kind(docs, "Deployment")
    env = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "DATALANE_OPERATOR_WEBHOOK_CONFIGURATION" not in env  # cainjector owns the bundle


@pytest.mark.parametrize(("value", "message"), [
    ("tls.mode=bogus", "/tls/mode"),
    ("image.tag=latest", "/image/tag"),
    ("sidecar.image=repo/sidecar:latest", "/sidecar/image"),
    ("webhook.url=http://insecure", "/webhook/url"),
    ("operator.replicas=0", "/operator/replicas"),
    ("webhook.failurePolicy=Ignore", "failurePolicy"),  # per webhook now: webhook.pods...
    ("webhook.pods.failurePolicy=Maybe", "/webhook/pods/failurePolicy"),
    ("webhook.scale.timeoutSeconds=60", "/webhook/scale/timeoutSeconds"),
    ("sidecar.protocols={S3://}", "/sidecar/protocols/0"),
    ("checkpoints.operatorIdentityPrefixes.team-a={s3://b/}", "/checkpoints/allowOperatorIdentity"),
    ("checkpoints.operatorIdentityPrefixes.team-a={relative/path}",
     "/checkpoints/operatorIdentityPrefixes/team-a/0"),
    ("operator.watchNamespaces={team-*}", "/operator/watchNamespaces/0"),
    ("recipes.predicateModules={os:system}", "/recipes/predicateModules/0"),
    ("metrics.port=0", "/metrics/port"),
    ("metrics.serviceMonitor.interval=often", "/metrics/serviceMonitor/interval"),
    ("metrics.prometheusRule.reconcileErrorRatio=2", "/metrics/prometheusRule/reconcileErrorRatio"),
    ("crds.install=maybe", "/crds/install"),
    ("crds.keep=false", "/crds"),  # the CRD is always kept: no value deletes every pipeline
])
def test_values_schema_refuses(value: str, message: str) -> None:
    out = helm("template", "dl", str(CHART), "--set", value, check=False)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_metrics_are_served_and_monitoring_is_off_by_default() -> None:
    docs = render()
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "PrometheusRule")
    (dep,) = by_kind(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DATALANE_OPERATOR_METRICS"] == "http://0.0.0.0:8081/metrics"
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in c["ports"]
    off = render("metrics.enabled=false", "metrics.serviceMonitor.enabled=true")
    (dep,) = by_kind(off, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert "DATALANE_OPERATOR_METRICS" not in {e["name"] for e in c["env"]}
    assert not by_kind(off, "ServiceMonitor")


def exported_series() -> set[str]:
    """Every series name the operator's metrics have, with one sample of each."""
    from datalane_operator.metrics import Metrics, Outcome, StoreKind, StoreOutcome, Verdict
    from prometheus_client.parser import text_string_to_metric_families

    m = Metrics()
    m.reconciled(Outcome.OK, 0.1)
    m.reviewed("inject-sidecar", Verdict.ALLOWED, 0.01)
    m.stored(StoreKind.LOOK, StoreOutcome.OK)
    return {s.name for f in text_string_to_metric_families(m.render(leading=True))
            for s in f.samples}


def test_service_monitor_and_alerts_render_when_enabled() -> None:
    """The ServiceMonitor selects the metrics Service, which selects the operator's pods on
    the port the operator listens on; every series the alerts read is one the operator
    exports (datalane_operator.metrics)."""
    import re

    docs = render("metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
                  "metrics.serviceMonitor.labels.release=prom", "metrics.port=9100",
                  "metrics.prometheusRule.webhookLatencySeconds=3")
    (mon,) = by_kind(docs, "ServiceMonitor")
    (rule,) = by_kind(docs, "PrometheusRule")
    (svc,) = [d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "dl-datalane-metrics"]
    (dep,) = by_kind(docs, "Deployment")
    assert mon["metadata"]["labels"]["release"] == "prom"
    assert mon["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics",
                                         "interval": "30s"}]
    assert mon["spec"]["namespaceSelector"] == {"matchNames": ["datalane-system"]}
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["spec"]["clusterIP"] == "None"  # every replica is scraped
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9100, "targetPort": "metrics",
                                     "protocol": "TCP"}]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in c["ports"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DATALANE_OPERATOR_METRICS"] == "http://0.0.0.0:9100/metrics"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert sorted(alerts) == ["DatalaneOperatorNoLeader", "DatalaneOperatorReconcileFailures",
                              "DatalaneOperatorWebhookSlow"]
    assert alerts["DatalaneOperatorNoLeader"]["labels"]["severity"] == "critical"
    assert alerts["DatalaneOperatorWebhookSlow"]["expr"].rstrip().endswith("> 3")
    assert alerts["DatalaneOperatorReconcileFailures"]["expr"].rstrip().endswith("> 0.1")
    exported = exported_series()
    for r in alerts.values():
        series = set(re.findall(r"datalane_operator_\w+", r["expr"]))
        assert series and series <= exported, (r["alert"], series - exported)
        assert 'job="dl-datalane-metrics",namespace="datalane-system"' in r["expr"]
    assert "{{ $labels.webhook }}" in alerts["DatalaneOperatorWebhookSlow"]["annotations"][
        "summary"]  # Prometheus' template, not Helm's
    assert not by_kind(render("operator.enabled=false", "metrics.prometheusRule.enabled=true",
                              "metrics.serviceMonitor.enabled=true"), "PrometheusRule")


def test_grafana_dashboard_renders_when_enabled() -> None:
    """A ConfigMap the Grafana sidecar discovers, holding the chart's dashboard file as is;
    every panel queries series the operator exports, in the chosen namespace."""
    import json
    import re

    assert not by_kind(render(), "ConfigMap")
    docs = render("metrics.grafanaDashboard.enabled=true")
    (cm,) = by_kind(docs, "ConfigMap")
    assert cm["metadata"]["name"] == "dl-datalane-dashboard"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    text = cm["data"]["datalane-operator.json"]
    assert text == (CHART / "dashboards" / "datalane-operator.json").read_text().rstrip("\n")
    dash = json.loads(text)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) == 8
    exported = exported_series()
    queried = set()
    for expr in exprs:
        series = set(re.findall(r"datalane_operator_\w+", expr))
        assert series and series <= exported, (expr, series - exported)
        assert 'namespace="$namespace"' in expr
        queried |= series
    # every metric family is on the dashboard (histograms through their buckets)
    assert {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported} == {
        re.sub(r"_bucket$", "", n) for n in queried}
