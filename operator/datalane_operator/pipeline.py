"""The ``DataPipeline`` custom resource as a typed, strictly validated value.

The CR's ``spec`` is modelled with the same typed-model layer as the recipe
(:mod:`datalane.spec.model`), so one set of frozen dataclasses gives the strict loader, the
field docs and the CRD schema (:mod:`datalane_operator.crd`). Two parts are not model fields:

* ``spec.recipe`` is a recipe **without** ``lanes`` and ``global_batch_size``: those two live
  at ``spec.lanes`` and ``spec.globalBatchSize``, where the printer columns, the CEL rule
  ``globalBatchSize % lanes == 0`` and the scale guard see them. The operator composes the
  full recipe (:func:`compose_recipe`) and delivers it to every sidecar in a ConfigMap, so a
  recipe file run locally and a DataPipeline describe the same data.
* ``spec.sidecar.resources`` is a Kubernetes ``ResourceRequirements`` copied to the sidecar.

Callers: the admission verdicts (:mod:`datalane_operator.admission`), the pod mutation
(:mod:`datalane_operator.inject`) and the reconciler. Imports only :mod:`datalane.spec`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from datalane.spec import model
from datalane.spec.errors import ConfigError
from datalane.spec.lanes import nearest_multiples
from datalane.spec.model import doc
from datalane.spec.recipe import Recipe
from datalane_operator.names import DATA_CREDENTIALS_MOUNT, DEFAULT_SOCKET_DIR, TRAINJOB_TRAINER

__all__ = [
    "CheckpointSpec",
    "DataSpec",
    "LIFTED_RECIPE_FIELDS",
    "Parallelism",
    "Pipeline",
    "PipelineSpec",
    "SecretRef",
    "SidecarSpec",
    "WorkloadRef",
    "compose_recipe",
    "load_pipeline",
    "parallelism_of",
    "parse_resources",
]

DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
# Kubernetes' resource.Quantity, as its OpenAPI schema spells it (RE2 and Python alike).
QUANTITY = (r"(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
            r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?")
_NAME_PART = r"[a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?"
RESOURCE_NAME = rf"({_NAME_PART}/)?{_NAME_PART}"
REGION = r"[a-z0-9][-a-z0-9]{0,62}"  # us-east-1, eu-west-3, or an S3-compatible store's name

TRAINER_CONTAINERS = {"PyTorchJob": "pytorch", "TrainJob": TRAINJOB_TRAINER}
"""The trainer container of each ``spec.workload.kind`` unless ``spec.workload.container``
names another (:mod:`datalane_operator.kinds` holds the rest of what a kind means)."""

LIFTED_RECIPE_FIELDS = {"lanes": "spec.lanes", "global_batch_size": "spec.globalBatchSize"}
"""Recipe fields that live at the top of the spec instead of in ``spec.recipe``."""


@dataclass(frozen=True)
class WorkloadRef:
    """The training job whose pods get a sidecar (same namespace as the DataPipeline)."""

    name: str = doc("Name of the job.", pattern=DNS_SUBDOMAIN)
    kind: Literal["PyTorchJob", "TrainJob"] = doc(
        "Kind of the job: PyTorchJob (kubeflow.org/v1, Kubeflow training-operator) or TrainJob "
        "(trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2 on JobSet).", default="PyTorchJob")
    container: str | None = doc(
        "The trainer container: it gets DATALANE_SOCKET, DATALANE_PIPELINE, the socket volume "
        "and, under spec.parallelism, DATALANE_DP_SIZE and DATALANE_DP_READERS. Null: the "
        "kind's own, pytorch for a PyTorchJob, node for a TrainJob.", default=None,
        pattern=DNS_LABEL)

    @property
    def trainer(self) -> str:
        """The trainer container's name: ``container``, else the kind's default."""
        return self.container or TRAINER_CONTAINERS[self.kind]


@dataclass(frozen=True)
class SecretRef:
    """A Secret in the DataPipeline's namespace."""

    name: str = doc("Name of the Secret.", pattern=DNS_SUBDOMAIN)


@dataclass(frozen=True)
class CheckpointSpec:
    """Where the sidecars persist lane resume points, and how many checkpoints to keep."""

    uri: str = doc("fsspec URI of the run's checkpoint store (`s3://bucket/run-7`, "
                   "`gs://...`, `file:///mnt/ckpt`).", pattern=r"\S+")
    secretRef: SecretRef | None = doc(  # noqa: RUF009 - doc() is dataclasses.field
        "Credentials: every key of this Secret becomes an environment variable of the sidecar "
        "(e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); the operator reads it to list and "
        "garbage-collect checkpoints. Credentials never appear in the spec or the status.",
        default=None)
    endpoint: str | None = doc(
        "Endpoint URL of an S3-compatible store (MinIO, Ceph...); null for AWS S3 or other "
        "schemes.", default=None, pattern=r"https?://\S+")
    region: str | None = doc(
        "Region of an s3:// store (its client's region_name); null: the SDK's default "
        "(AWS_REGION of the sidecar, or us-east-1).", default=None, pattern=REGION)
    keep: int = doc("Committed checkpoints kept; older ones are garbage-collected.",
                    default=3, ge=1, le=10000)


@dataclass(frozen=True)
class DataSpec:
    """How the sidecar reads the recipe's sources and tokenizer: credentials, endpoint and
    region of the data, which may differ from the checkpoint store's."""

    secretRef: SecretRef | None = doc(  # noqa: RUF009 - doc() is dataclasses.field
        "Credentials for the data, distinct from spec.checkpoint.secretRef: every key of this "
        "Secret becomes an environment variable of the sidecar (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN for s3://), and it is mounted read-only at "
        f"{DATA_CREDENTIALS_MOUNT} (see googleCredentials). Set, the checkpoint Secret's keys "
        "reach only the checkpoint store (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY of an "
        "s3:// store), not the sidecar's environment. Null: the checkpoint Secret, or the "
        "pod's workload identity, reads the data too.", default=None)
    endpoint: str | None = doc(
        "Endpoint URL of the S3-compatible store holding the s3:// sources (the sidecar's "
        "AWS_ENDPOINT_URL_S3); null: AWS S3.", default=None, pattern=r"https?://\S+")
    region: str | None = doc("Region of the s3:// sources (the sidecar's AWS_REGION).",
                             default=None, pattern=REGION)
    googleCredentials: str | None = doc(
        "Key of the data Secret that holds a Google service-account JSON key for gs:// "
        "sources: GOOGLE_APPLICATION_CREDENTIALS points at the mounted file. Null: gcsfs "
        "uses the pod's workload identity (or the metadata server).", default=None,
        pattern=r"[-._a-zA-Z0-9]+")


@dataclass(frozen=True)
class SidecarSpec:
    """The data sidecar injected into every pod of the workload."""

    image: str | None = doc("Sidecar image; null means the operator's default "
                            "(Helm value `sidecar.image`).", default=None, pattern=r"\S+")
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = doc(
        "Image pull policy of the sidecar; null leaves the Kubernetes default.", default=None)
    socketDir: str = doc("Directory of the Unix socket (a memory-backed emptyDir shared with "
                         "the trainer container).", default=DEFAULT_SOCKET_DIR,
                         pattern=r"/[^\s:]*")
    socketDirSizeLimit: str = doc(
        "Size limit of the socket emptyDir, which also holds the shared-memory batch rings.",
        default="1Gi", pattern=QUANTITY)
    socketMode: Literal["0600", "0660"] = doc(
        "Mode of the socket file: 0600 when trainer and sidecar run as the same user, 0660 "
        "for a shared group (fsGroup).", default="0600")
    workers: int = doc("Threads of the sidecar's map stages (a knob: never changes output).",
                       default=2, ge=1, le=256)
    prefetch: int = doc("Microbatches ready ahead of each trainer (a knob).",
                        default=8, ge=1, le=1024)
    metricsPort: int = doc("Port of the sidecar's Prometheus metrics; 0 turns them off.",
                           default=0, ge=0, le=65535)
    rankProcesses: int | Literal["auto"] = doc(
        "Processes the sidecar runs the ranks' sessions in (its --rank-processes; a knob: "
        "never changes output). 0: threads of the sidecar's one process, sharing its "
        "interpreter lock; N: N rank worker processes (data-parallel rank r in worker r % N), "
        "each with its own map pool of `workers` threads; auto: one per data-parallel rank of "
        "the pod, at most one per CPU the sidecar may run on (its affinity, not its CPU "
        "limit), 0 for a pod of one rank. Each worker holds a copy of the plan and its ranks' "
        "windows: give the sidecar memory for them (docs/operator.md, The sidecar's "
        "processes).", default=0, ge=0, le=256)
    mapProcesses: int | None = doc(
        "Child processes the sidecar runs its map stages in (its --map-processes, "
        "DATALANE_MAP_PROCESSES; a knob: never changes output). 0: `workers` threads; N: N "
        "processes (in each rank worker with rankProcesses), each with its own interpreter "
        "lock, so decoding, chat template renders and tokenizing use more cores than one lock "
        "allows. Each holds a copy of the recipe's tokenizers and templates: give the sidecar "
        "memory for them (docs/architecture.md, Map processes). Null: the sidecar's default, "
        "0 (a DataPipeline written before the field reads back unchanged).",
        default=None, ge=0, le=256)
    imageBytes: int | None = doc(
        "Decoded image bytes (patch rows) the sidecar lets each lane and image source hold in "
        "flight (its --image-bytes, DATALANE_IMAGE_BYTES; a knob: never changes output, only "
        "how far map tasks run ahead; docs/architecture.md, Backpressure). Null: the "
        "sidecar's default, 512 MiB. Vision recipes only; give the sidecar memory for it.",
        default=None, ge=1, le=1 << 40)


MAX_PARALLEL = 1 << 16


@dataclass(frozen=True)
class Parallelism:
    """How the trainer splits each model replica: only the data-parallel ranks read lanes."""

    tensor: int = doc("Tensor-parallel degree TP. TP peers read the same batch; they live in "
                      "one pod (TP x CP divides nprocPerNode).", default=1, ge=1,
                      le=MAX_PARALLEL)
    pipeline: int = doc("Pipeline-parallel degree PP (the outermost mesh dimension).",
                        default=1, ge=1, le=MAX_PARALLEL)
    context: int = doc("Context-parallel degree CP. CP peers read the same batch; they live "
                       "in one pod.", default=1, ge=1, le=MAX_PARALLEL)

    @property
    def model_parallel(self) -> int:
        """Ranks per model replica: TP x PP x CP (the world size must be a multiple)."""
        return self.tensor * self.pipeline * self.context

    @property
    def readers(self) -> int:
        """Ranks that read one data-parallel rank through their pod's sidecar: TP x CP."""
        return self.tensor * self.context

    def describe(self) -> str:
        """The degrees above 1, as a message names them ("TP 2 x PP 4"); "" when none."""
        dims = (("TP", self.tensor), ("CP", self.context), ("PP", self.pipeline))
        return " x ".join(f"{name} {n}" for name, n in dims if n > 1)


@dataclass(frozen=True)
class PipelineSpec:
    """The typed part of a DataPipeline's spec (``recipe`` and ``sidecar.resources`` aside)."""

    workload: WorkloadRef = doc("The training job the data is for.")  # noqa: RUF009
    lanes: int = doc("Number of logical lanes L, fixed for the life of the run; the "
                     "data-parallel world size may be anything from 1 to L.", ge=1,
                     le=1 << 20)
    globalBatchSize: int = doc("Sequences per step B; a multiple of `lanes`.", ge=1)
    checkpoint: CheckpointSpec = doc("Checkpoint store of the lane resume points.")  # noqa: RUF009
    data: DataSpec = doc(  # noqa: RUF009 - doc() is dataclasses.field
        "How the sidecar reads the sources (credentials, endpoint, region), when that differs "
        "from the checkpoint store.", factory=DataSpec)
    sidecar: SidecarSpec = doc("The injected sidecar.", factory=SidecarSpec)  # noqa: RUF009
    parallelism: Parallelism = doc(  # noqa: RUF009 - doc() is dataclasses.field
        "Model parallelism of the trainer. The data-parallel (DP) world size is pods x "
        "nprocPerNode / (TP x PP x CP), at most `lanes`. Ranks are laid out with "
        "TP innermost, then CP, then DP, PP outermost (TorchTitan, Megatron-LM).",
        factory=Parallelism)


@dataclass(frozen=True)
class Pipeline:
    """A loaded DataPipeline: its identity, typed spec, composed recipe and sidecar resources."""

    name: str
    namespace: str
    spec: PipelineSpec
    recipe: Recipe
    resources: dict[str, dict[str, str]] = field(default_factory=dict)
    uid: str = ""
    generation: int = 0

    def recipe_json(self) -> str:
        """The composed recipe as delivered to the sidecars (canonical JSON, every field)."""
        return json.dumps(self.recipe.to_dict(), indent=1, sort_keys=True) + "\n"


def parse_resources(value: Any, where: str) -> dict[str, dict[str, str]]:
    """Validate a ``ResourceRequirements`` mapping (``requests``/``limits``) and normalise it."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping with requests and/or limits, got "
                          f"{value!r}")
    out: dict[str, dict[str, str]] = {}
    for key, table in value.items():
        if key not in ("requests", "limits"):
            raise ConfigError(f"{where}.{key} is not a known key; known keys: requests, limits")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}.{key} must be a mapping of resource to quantity, got "
                              f"{table!r}")
        row: dict[str, str] = {}
        for res, qty in table.items():
            if not isinstance(res, str) or not re.fullmatch(RESOURCE_NAME, res):
                raise ConfigError(f"{where}.{key} has an invalid resource name {res!r}")
            if isinstance(qty, bool) or not isinstance(qty, (int, float, str)) or not (
                    re.fullmatch(QUANTITY, str(qty))):
                raise ConfigError(f"{where}.{key}.{res} {qty!r} is not a quantity "
                                  f"(e.g. 2, 500m, 4Gi)")
            row[res] = str(qty)
        out[key] = row
    return out


def compose_recipe(spec: Mapping[str, Any]) -> Recipe:
    """The full recipe: ``spec.recipe`` plus ``lanes`` and ``global_batch_size`` from the spec.

    Errors name the CR field (``spec.recipe.sources[0].format``, ``spec.globalBatchSize``).
    """
    lanes, batch = spec.get("lanes"), spec.get("globalBatchSize")
    raw = spec.get("recipe")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"spec.recipe must be a mapping (the recipe without lanes and "
                          f"global_batch_size), got {raw!r}")
    for key, home in LIFTED_RECIPE_FIELDS.items():
        if key in raw:
            raise ConfigError(f"spec.recipe.{key} is not allowed: set {home} instead "
                              f"(it is lifted out of the recipe)")
    if (isinstance(lanes, int) and isinstance(batch, int) and lanes > 0 and batch > 0
            and batch % lanes):
        options = " or ".join(str(m) for m in nearest_multiples(batch, lanes))
        raise ConfigError(f"spec.globalBatchSize {batch} is not a multiple of spec.lanes "
                          f"{lanes}; try {options}")
    data = copy.deepcopy(dict(raw))
    data["lanes"] = lanes
    data["global_batch_size"] = batch
    try:
        return model.load(Recipe, data, "spec.recipe")
    except ConfigError as e:
        text = str(e)
        for key, home in LIFTED_RECIPE_FIELDS.items():
            text = text.replace(f"spec.recipe.{key}", home)
        raise ConfigError(text) from e


def parallelism_of(spec: Mapping[str, Any]) -> Parallelism:
    """``spec.parallelism`` of a raw DataPipeline spec (the webhooks' index entries), strictly."""
    raw = spec.get("parallelism")
    return Parallelism() if raw is None else model.load(Parallelism, raw, "spec.parallelism")


def load_pipeline(body: Mapping[str, Any]) -> Pipeline:
    """Load a DataPipeline object (``metadata`` + ``spec``) strictly.

    Raises :class:`ConfigError` naming the field and the bad value.
    """
    meta = body.get("metadata") or {}
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"spec must be a mapping, got {spec!r}")
    typed = {k: v for k, v in spec.items() if k != "recipe"}
    resources: Any = None
    sidecar = typed.get("sidecar")
    if isinstance(sidecar, Mapping) and "resources" in sidecar:
        resources = sidecar["resources"]
        typed["sidecar"] = {k: v for k, v in sidecar.items() if k != "resources"}
    if "recipe" not in spec:
        raise ConfigError("spec.recipe is required (the recipe without lanes and "
                          "global_batch_size)")
    parsed = model.load(PipelineSpec, typed, "spec")
    recipe = compose_recipe(spec)
    return Pipeline(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        spec=parsed,
        recipe=recipe,
        resources=parse_resources(resources, "spec.sidecar.resources"),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
    )
