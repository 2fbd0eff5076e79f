"""Names the operator shares with the cluster: API group, labels, container and volume names.

Everything that appears in an object the operator writes or recognises is spelled here once,
so the CRD generator, the pod mutation, the reconciler, the Helm chart test and the
end-to-end test cannot disagree. Pure constants; no imports beyond the standard library.
"""

from __future__ import annotations

__all__ = [
    "ANN_INJECTED",
    "ANN_RECIPE",
    "DATA_CREDENTIALS_MOUNT",
    "DEFAULT_SOCKET_DIR",
    "FIELD_MANAGER",
    "GROUP",
    "JOBSET_NAME_LABEL",
    "JOBSET_REPLICATED_JOB_LABEL",
    "JOB_COMPLETION_INDEX",
    "JOB_NAME_LABEL",
    "KIND",
    "LABEL_MANAGED_BY",
    "LABEL_PIPELINE",
    "NAMESPACE_OPT_IN_LABEL",
    "NAMESPACE_OPT_IN_VALUE",
    "PLURAL",
    "PYTORCHJOB_GROUP",
    "PYTORCHJOB_PLURAL",
    "PYTORCHJOB_VERSION",
    "RECIPE_FILE",
    "RECIPE_MOUNT",
    "REPLICA_INDEX_LABEL",
    "REPLICA_TYPE_LABEL",
    "SHORT_NAME",
    "SERVED_VERSIONS",
    "SIDECAR_CONTAINER",
    "SINGULAR",
    "SOCKET_FILE",
    "TRAINJOB_GROUP",
    "TRAINJOB_PLURAL",
    "TRAINJOB_TRAINER",
    "TRAINJOB_VERSION",
    "VERSION",
    "VOLUME_DATA_CREDENTIALS",
    "VOLUME_RECIPE",
    "VOLUME_SOCKET",
    "VOLUME_TMP",
    "WEBHOOK_INJECT",
    "WEBHOOK_REFUSE_NAMESPACE",
    "WEBHOOK_VALIDATE_PIPELINE",
    "WEBHOOK_VALIDATE_SCALE",
    "WEBHOOK_VALIDATE_TRAINJOB",
    "WEBHOOK_VALIDATE_WORKLOAD",
    "WEBHOOKS",
    "legacy_recipe_configmap_name",
    "recipe_configmap_name",
]

GROUP = "datalane.io"
# The version the operator reads and writes, and the CRD's storage version.
VERSION = "v1alpha1"
# Every version the CRD serves: the same schema, converted by the API server alone (conversion
# None); docs/operator.md#upgrades says why v1beta1 is served and v1alpha1 stays the storage.
SERVED_VERSIONS = (VERSION, "v1beta1")
KIND = "DataPipeline"
PLURAL = "datapipelines"
SINGULAR = "datapipeline"
SHORT_NAME = "dp"

PYTORCHJOB_GROUP = "kubeflow.org"
PYTORCHJOB_VERSION = "v1"
PYTORCHJOB_PLURAL = "pytorchjobs"
# Labels Kubeflow's training-operator puts on every pod of a job.
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"

TRAINJOB_GROUP = "trainer.kubeflow.org"
TRAINJOB_VERSION = "v1alpha1"
TRAINJOB_PLURAL = "trainjobs"
TRAINJOB_TRAINER = "node"
"""Kubeflow Trainer v2's trainer: the name of its replicated job and of its container."""
# Labels JobSet puts on every pod of a JobSet (a TrainJob's JobSet is named after it).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""An indexed Job's pod's index (label and annotation): a TrainJob pod's node rank."""

LABEL_PIPELINE = "datalane.io/pipeline"
"""On an injected pod and on the recipe ConfigMaps: the DataPipeline's name."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
NAMESPACE_OPT_IN_LABEL = "datalane.io/inject"
NAMESPACE_OPT_IN_VALUE = "enabled"
"""The namespace label that opts a namespace in: the pod and job webhooks fire only in
namespaces labelled ``datalane.io/inject=enabled`` (set by the namespace's administrator; the
operator never patches namespaces), and a DataPipeline is created only there."""
ANN_INJECTED = "datalane.io/injected"
"""On an injected pod: the sidecar image that was injected."""
ANN_RECIPE = "datalane.io/recipe"
"""On an injected pod: the recipe its sidecar was injected with (a digest of the composed
recipe and of each phase, :mod:`datalane_operator.rollout`), so that the operator knows which
pods serve an older recipe after an edit."""
FIELD_MANAGER = "datalane-operator"

SIDECAR_CONTAINER = "datalane-sidecar"
VOLUME_SOCKET = "datalane-socket"
VOLUME_RECIPE = "datalane-recipe"
VOLUME_TMP = "datalane-tmp"
VOLUME_DATA_CREDENTIALS = "datalane-data-credentials"
DATA_CREDENTIALS_MOUNT = "/etc/datalane/data-credentials"
DEFAULT_SOCKET_DIR = "/var/run/datalane"
SOCKET_FILE = "datalane.sock"
RECIPE_MOUNT = "/etc/datalane/recipe"
RECIPE_FILE = "recipe.json"

# Admission webhook paths: kopf routes `<server>/<handler id>` to the handler of that id, and
# the Helm chart's webhook configurations use the same paths.
WEBHOOK_VALIDATE_PIPELINE = "validate-datapipeline"
WEBHOOK_INJECT = "inject-sidecar"
WEBHOOK_VALIDATE_WORKLOAD = "validate-pytorchjob"
WEBHOOK_VALIDATE_SCALE = "validate-pytorchjob-scale"
WEBHOOK_VALIDATE_TRAINJOB = "validate-trainjob"
WEBHOOK_REFUSE_NAMESPACE = "refuse-datapipeline-namespace"
"""Refuses the creation of a DataPipeline in a namespace that is not opted in (the chart
registers it with a namespaceSelector matching exactly those namespaces)."""
WEBHOOKS = (WEBHOOK_VALIDATE_PIPELINE, WEBHOOK_INJECT, WEBHOOK_VALIDATE_WORKLOAD,
            WEBHOOK_VALIDATE_SCALE, WEBHOOK_VALIDATE_TRAINJOB, WEBHOOK_REFUSE_NAMESPACE)
"""Every webhook id (log filtering, metric labels)."""


def recipe_configmap_name(pipeline: str, digest: str) -> str:
    """Name of the ConfigMap that holds the composed recipe of DataPipeline ``pipeline`` whose
    digest is ``digest`` (the ``digest`` of its stamp, :func:`datalane_operator.rollout.
    stamp_of`): one immutable ConfigMap per recipe, so a name always means the same bytes."""
    return f"{pipeline}-recipe-{digest}"


def legacy_recipe_configmap_name(pipeline: str) -> str:
    """The one mutable recipe ConfigMap of ``pipeline`` that operators before the
    content-named ConfigMaps wrote; their pods still mount it, and it is collected once none
    does (:mod:`datalane_operator.recipemap`)."""
    return f"{pipeline}-recipe"
