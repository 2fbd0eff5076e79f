"""Pod mutation: the native data sidecar, its volumes, and the trainer's environment.

:func:`mutate_pod` returns the pod a DataPipeline wants, given the pod the workload's
controller created:

* a **native sidecar**: an init container ``datalane-sidecar`` with ``restartPolicy: Always``
  (it starts before the trainer and lives as long as the pod), running
  ``datalane-sidecar serve`` configured only through environment variables, with a startup
  probe ``datalane-sidecar probe --socket ...`` so the trainer starts once the socket serves;
  a read-only root filesystem, no privileges, resources from ``spec.sidecar.resources``;
* a memory-backed ``emptyDir`` for the Unix socket (and the shared-memory batch rings),
  mounted in the sidecar and the trainer container;
* the composed recipe from the ConfigMap of exactly the recipe the pod is stamped with,
  ``<pipeline>-recipe-<digest>`` (:mod:`datalane_operator.recipemap`), mounted read-only;
* credentials only by reference: the Secret ``spec.checkpoint.secretRef`` as ``envFrom``;
  with a data Secret of its own (``spec.data.secretRef``), that one is the ``envFrom`` (and
  is mounted read-only for file credentials, such as a Google service-account key) and the
  checkpoint Secret's S3 keys reach only the checkpoint store: ``secretKeyRef`` variables
  that the kubelet expands into ``DATALANE_STORE_OPTIONS`` (``$(VAR)``), so both
  credentials stay out of the pod spec; ``spec.data.endpoint``/``region`` become the SDK's
  ``AWS_ENDPOINT_URL_S3``/``AWS_REGION``, which the sources read with no options;
* the annotation ``datalane.io/recipe``: what the recipe it is injected with is (digests of
  the composed recipe and of its phases), from which the operator knows, after an edit of
  ``spec.recipe``, which pods to restart (:mod:`datalane_operator.rollout`);
* the cluster policy's allow-list of filter predicate modules as
  ``DATALANE_PREDICATE_MODULES``, which the sidecar applies again before it imports any
  (:mod:`datalane.spec.codepolicy`);
* the sidecar's fatal error as its termination message (``/dev/termination-log``, falling
  back to its log tail), which the operator reads back from the pod status;
* in the trainer container: ``DATALANE_SOCKET`` and ``DATALANE_PIPELINE``; for a pipeline
  that declares ``spec.parallelism``, also ``DATALANE_DP_READERS`` (TP x CP) and
  ``DATALANE_DP_SIZE`` (pods x nproc / (TP x PP x CP)), from which the client takes its
  data-parallel rank ``(RANK // DATALANE_DP_READERS) % DATALANE_DP_SIZE`` (TP innermost, then
  CP, then DP, PP outermost, as in TorchTitan and Megatron-LM).

The sidecar's ``DATALANE_RANKS_PER_POD`` counts the pod's *data-parallel* ranks,
nproc / (TP x CP): one session per DP rank, read by its TP x CP peers. With PP > 1 a pod holds
ranks of one pipeline stage (the workload guard refuses pods spanning stages), so these are
DP ranks of that stage.

The mutation is idempotent (everything it adds is first removed, then added again in the
same order), so a re-invoked webhook or a pod created from an already injected template
gives the same pod. :func:`pipeline_for_pod` decides whether a pod is a pipeline's at all;
a pod that is not is never changed. Pure functions on plain dicts.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from datalane.spec.codepolicy import PREDICATE_MODULES_ENV
from datalane.spec.errors import ConfigError
from datalane.store.signing import LEDGER_KEY_ENV
from datalane_operator.kinds import trainer_pod_of
from datalane_operator.names import (
    ANN_INJECTED,
    ANN_RECIPE,
    DATA_CREDENTIALS_MOUNT,
    LABEL_PIPELINE,
    RECIPE_FILE,
    RECIPE_MOUNT,
    SIDECAR_CONTAINER,
    SOCKET_FILE,
    VOLUME_DATA_CREDENTIALS,
    VOLUME_RECIPE,
    VOLUME_SOCKET,
    VOLUME_TMP,
)
from datalane_operator.pipeline import Pipeline
from datalane_operator.recipemap import configmap_name
from datalane_operator.rollout import stamp_text
from datalane_operator.storage import scheme_of, sidecar_store_options
from datalane_operator.workload import nproc_of_container

__all__ = [
    "TRAINER_ENV",
    "data_parallel_env",
    "is_injected",
    "mutate_pod",
    "pipeline_for_pod",
    "ranks_per_pod",
    "socket_path",
]

TRAINER_ENV = ("DATALANE_SOCKET", "DATALANE_PIPELINE", "DATALANE_DP_SIZE",
               "DATALANE_DP_READERS")
_OUR_VOLUMES = (VOLUME_SOCKET, VOLUME_RECIPE, VOLUME_TMP, VOLUME_DATA_CREDENTIALS)
_TMP_SIZE = "64Mi"
TERMINATION_LOG = "/dev/termination-log"
CHECKPOINT_KEY_ENV = {"key": ("DATALANE_CHECKPOINT_AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
                      "secret": ("DATALANE_CHECKPOINT_AWS_SECRET_ACCESS_KEY",
                                 "AWS_SECRET_ACCESS_KEY")}
"""With a data Secret of its own, the checkpoint Secret's S3 keys: fsspec option -> (the
sidecar's variable, the Secret's key)."""


def socket_path(pipeline: Pipeline) -> str:
    return f"{pipeline.spec.sidecar.socketDir.rstrip('/')}/{SOCKET_FILE}"


def pipeline_for_pod(pod: Mapping[str, Any], pipelines: Iterable[Pipeline],
                     namespace: str | None = None) -> Pipeline | None:
    """The pipeline whose workload's trainer ``pod`` is (same namespace, the kind's job label
    and trainer labels, :mod:`datalane_operator.kinds`), or None."""
    meta = pod.get("metadata") or {}
    owner = trainer_pod_of(pod)
    if owner is None:
        return None
    kind, job = owner
    ns = namespace or meta.get("namespace") or ""
    for p in pipelines:
        if (p.spec.workload.kind == kind.kind and p.spec.workload.name == job
                and (not ns or not p.namespace or p.namespace == ns)):
            return p
    return None


def is_injected(pod: Mapping[str, Any]) -> bool:
    """Whether a pod carries the datalane sidecar."""
    return any(c.get("name") == SIDECAR_CONTAINER
               for c in (pod.get("spec") or {}).get("initContainers") or [])


def _env_value(container: Mapping[str, Any], name: str) -> str | None:
    for e in container.get("env") or []:
        if e.get("name") == name and "value" in e:
            return str(e["value"])
    return None


def ranks_per_pod(trainer: Mapping[str, Any]) -> int | None:
    """Ranks torchrun starts in this pod: the ``PET_NPROC_PER_NODE`` the training-operator (or
    Trainer v2) set on the trainer (``auto``/``gpu`` resolved from its GPU limit), or None if
    unknown."""
    return nproc_of_container(_env_value(trainer, "PET_NPROC_PER_NODE"), trainer)[0]


def _int_env(container: Mapping[str, Any], name: str) -> int | None:
    raw = _env_value(container, name)
    return int(raw) if raw is not None and raw.isdigit() and int(raw) > 0 else None


def data_parallel_env(pipeline: Pipeline, trainer: Mapping[str, Any],
                      nproc: int | None) -> dict[str, str]:
    """``DATALANE_DP_READERS`` and ``DATALANE_DP_SIZE`` for the trainer, when the pipeline
    declares a parallelism; none for pure data parallelism (the client uses ``$RANK`` and
    ``$WORLD_SIZE``).

    The DP size comes from the training-operator's ``PET_NNODES`` (the pods torchrun
    rendezvouses) x nproc / (TP x PP x CP); it is left out when ``PET_NNODES`` is a range
    (an elastic job: the trainer must pass its DeviceMesh or dp_size to the client).
    """
    par = pipeline.spec.parallelism
    if par.model_parallel == 1:
        return {}
    out = {"DATALANE_DP_READERS": str(par.readers)}
    nodes = _int_env(trainer, "PET_NNODES")
    if nodes is not None and nproc is not None:
        ranks = nodes * nproc
        if ranks % par.model_parallel:
            raise ConfigError(
                f"the {ranks} ranks of {pipeline.spec.workload.kind} "
                f"{pipeline.spec.workload.name} (PET_NNODES {nodes} x {nproc}) are not a "
                f"multiple of {par.describe()} = {par.model_parallel} (spec.parallelism of "
                f"DataPipeline {pipeline.name}); scale the job to whole model replicas")
        out["DATALANE_DP_SIZE"] = str(ranks // par.model_parallel)
    return out


def _set_env(env: list[dict[str, Any]], name: str, value: str) -> None:
    env[:] = [e for e in env if e.get("name") != name]
    env.append({"name": name, "value": value})


def _probe(path: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {
        "exec": {"command": ["datalane-sidecar", "probe", "--socket", path, "--timeout", "2"]},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def sidecar_container(pipeline: Pipeline, image: str, ranks: int | None,
                      predicate_modules: Sequence[str] = ()) -> dict[str, Any]:
    """The native sidecar container for ``pipeline``; ``ranks`` is the pod's data-parallel
    ranks (None: unknown, 1 is assumed); ``predicate_modules`` the cluster policy's allow-list
    of predicate modules, which the sidecar applies again (``DATALANE_PREDICATE_MODULES``)."""
    side = pipeline.spec.sidecar
    ckpt = pipeline.spec.checkpoint
    sock = socket_path(pipeline)
    data = pipeline.spec.data
    options = sidecar_store_options(ckpt)
    env: list[dict[str, Any]] = []
    if (data.secretRef is not None and ckpt.secretRef is not None
            and scheme_of(ckpt.uri) == "s3"):
        for option, (var, key) in CHECKPOINT_KEY_ENV.items():
            env.append({"name": var, "valueFrom": {"secretKeyRef": {
                "name": ckpt.secretRef.name, "key": key}}})
            options[option] = f"$({var})"  # expanded by the kubelet, never in the spec
        # the run's ledger key, when the checkpoint Secret holds one (envFrom is the data's)
        env.append({"name": LEDGER_KEY_ENV, "valueFrom": {"secretKeyRef": {
            "name": ckpt.secretRef.name, "key": LEDGER_KEY_ENV, "optional": True}}})
    if data.endpoint is not None and scheme_of(ckpt.uri) == "s3" and ckpt.endpoint is None:
        # AWS_ENDPOINT_URL_S3 is the data's store: the checkpoints' (AWS S3) must ignore it
        options["config_kwargs"] = {"ignore_configured_endpoint_urls": True}
    env += [
        {"name": "DATALANE_SOCKET", "value": sock},
        {"name": "DATALANE_RECIPE", "value": f"{RECIPE_MOUNT}/{RECIPE_FILE}"},
        {"name": "DATALANE_STORE", "value": ckpt.uri},
        {"name": "DATALANE_STORE_OPTIONS",
         "value": json.dumps(options, sort_keys=True, separators=(",", ":"))},
        {"name": "DATALANE_POD",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "DATALANE_RANKS_PER_POD", "value": str(ranks or 1)},
        {"name": "DATALANE_WORKERS", "value": str(side.workers)},
        {"name": "DATALANE_PREFETCH", "value": str(side.prefetch)},
        {"name": "DATALANE_RANK_PROCESSES", "value": str(side.rankProcesses)},
        {"name": "DATALANE_SOCKET_MODE", "value": side.socketMode},
        {"name": "DATALANE_METRICS_PORT", "value": str(side.metricsPort)},
        {"name": "DATALANE_PIPELINE", "value": pipeline.name},
        {"name": PREDICATE_MODULES_ENV, "value": ",".join(predicate_modules)},
    ]
    if side.mapProcesses is not None:  # unset: no variable, the sidecar's default (threads)
        env.append({"name": "DATALANE_MAP_PROCESSES", "value": str(side.mapProcesses)})
    if side.imageBytes is not None:  # unset: no variable, the sidecar's default
        env.append({"name": "DATALANE_IMAGE_BYTES", "value": str(side.imageBytes)})
    if data.endpoint is not None:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": data.endpoint})
    if data.region is not None:
        env.append({"name": "AWS_REGION", "value": data.region})
    if data.googleCredentials is not None:
        env.append({"name": "GOOGLE_APPLICATION_CREDENTIALS",
                    "value": f"{DATA_CREDENTIALS_MOUNT}/{data.googleCredentials}"})
    c: dict[str, Any] = {
        "name": SIDECAR_CONTAINER,
        "image": image,
        "restartPolicy": "Always",
        "command": ["datalane-sidecar", "serve"],
        "env": env,
    }
    if side.imagePullPolicy:
        c["imagePullPolicy"] = side.imagePullPolicy
    if data.secretRef is not None:
        c["envFrom"] = [{"secretRef": {"name": data.secretRef.name}}]
        if ckpt.secretRef is not None and scheme_of(ckpt.uri) != "s3":
            # no per-store keys for other schemes: both Secrets, the data's winning a clash
            c["envFrom"].insert(0, {"secretRef": {"name": ckpt.secretRef.name}})
    elif ckpt.secretRef is not None:
        c["envFrom"] = [{"secretRef": {"name": ckpt.secretRef.name}}]
    if side.metricsPort:
        c["ports"] = [{"name": "dl-metrics", "containerPort": side.metricsPort,
                       "protocol": "TCP"}]
        # the pod IP, not every interface (the sidecar's default is loopback)
        env.append({"name": "DATALANE_METRICS_ADDR", "valueFrom": {
            "fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}})
    if pipeline.resources:
        c["resources"] = copy.deepcopy(pipeline.resources)
    # Planning a large recipe (listing sources) may take minutes: allow 30 of them to start.
    c["startupProbe"] = _probe(sock, period=2, failures=900, timeout=5)
    c["livenessProbe"] = _probe(sock, period=30, failures=4, timeout=10)
    c["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    c["volumeMounts"] = [
        {"name": VOLUME_SOCKET, "mountPath": side.socketDir},
        {"name": VOLUME_RECIPE, "mountPath": RECIPE_MOUNT, "readOnly": True},
        {"name": VOLUME_TMP, "mountPath": "/tmp"},
    ]
    if data.secretRef is not None:
        c["volumeMounts"].append({"name": VOLUME_DATA_CREDENTIALS,
                                  "mountPath": DATA_CREDENTIALS_MOUNT, "readOnly": True})
    # A sidecar that cannot start (a glob that matches nothing, missing credentials, an
    # unreachable store) writes its error here; the kubelet puts it in the pod status, where
    # the operator reads it for the DataPipeline's conditions. An error before Python runs
    # (a bad image, an import error) leaves the file empty: then the log tail is used.
    c["terminationMessagePath"] = TERMINATION_LOG
    c["terminationMessagePolicy"] = "FallbackToLogsOnError"
    return c


def _volumes(pipeline: Pipeline) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": VOLUME_SOCKET,
         "emptyDir": {"medium": "Memory", "sizeLimit": pipeline.spec.sidecar.socketDirSizeLimit}},
        {"name": VOLUME_RECIPE,
         "configMap": {"name": configmap_name(pipeline),
                       "items": [{"key": RECIPE_FILE, "path": RECIPE_FILE}]}},
        {"name": VOLUME_TMP, "emptyDir": {"medium": "Memory", "sizeLimit": _TMP_SIZE}},
    ]
    secret = pipeline.spec.data.secretRef
    if secret is not None:
        # 0440: readable by the sidecar's group (fsGroup), never by others
        out.append({"name": VOLUME_DATA_CREDENTIALS,
                    "secret": {"secretName": secret.name, "defaultMode": 0o440}})
    return out


def _strip(pod: dict[str, Any], trainer_name: str) -> None:
    """Remove everything :func:`mutate_pod` adds (what makes the mutation idempotent)."""
    spec = pod["spec"]
    if "initContainers" in spec:
        spec["initContainers"] = [c for c in spec["initContainers"] or []
                                  if c.get("name") != SIDECAR_CONTAINER]
    if "volumes" in spec:
        spec["volumes"] = [v for v in spec["volumes"] or [] if v.get("name") not in _OUR_VOLUMES]
    for c in spec.get("containers") or []:
        if c.get("name") != trainer_name:
            continue
        if "env" in c:
            c["env"] = [e for e in c["env"] or [] if e.get("name") not in TRAINER_ENV]
        if "volumeMounts" in c:
            c["volumeMounts"] = [m for m in c["volumeMounts"] or []
                                 if m.get("name") != VOLUME_SOCKET]


def mutate_pod(pod: Mapping[str, Any], pipeline: Pipeline, default_image: str,
               predicate_modules: Sequence[str] = ()) -> dict[str, Any]:
    """The pod with the pipeline's sidecar injected (a new dict; ``pod`` is not changed);
    ``predicate_modules`` is the cluster policy's allow-list (default: no module).

    Raises :class:`ConfigError` when the pod has no trainer container of the expected name or
    no image is known for the sidecar.
    """
    out: dict[str, Any] = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    meta = out.setdefault("metadata", {})
    trainer_name = pipeline.spec.workload.trainer
    containers = spec.get("containers") or []
    trainer = next((c for c in containers if c.get("name") == trainer_name), None)
    if trainer is None:
        names = ", ".join(repr(c.get("name")) for c in containers) or "none"
        raise ConfigError(
            f"pod {meta.get('name') or meta.get('generateName', '')!s} of "
            f"{pipeline.spec.workload.kind} {pipeline.spec.workload.name} has no container "
            f"{trainer_name!r} (spec.workload.container of DataPipeline {pipeline.name}); "
            f"its containers: {names}")
    image = pipeline.spec.sidecar.image or default_image
    if not image:
        raise ConfigError(f"DataPipeline {pipeline.name} sets no spec.sidecar.image and the "
                          f"operator has no default sidecar image (Helm value sidecar.image)")
    _strip(out, trainer_name)
    nproc = ranks_per_pod(trainer)
    par = pipeline.spec.parallelism
    if nproc is not None and nproc % par.readers:
        raise ConfigError(
            f"pod {meta.get('name') or meta.get('generateName', '')!s} runs {nproc} ranks, "
            f"not a multiple of TP x CP = {par.readers} (spec.parallelism of DataPipeline "
            f"{pipeline.name}): the TP and CP peers of a data-parallel rank must share a pod; "
            f"set nprocPerNode to a multiple of {par.readers}")
    dp_env = data_parallel_env(pipeline, trainer, nproc)
    dp_ranks = None if nproc is None else nproc // par.readers
    spec.setdefault("initContainers", [])
    spec["initContainers"] = [*(spec["initContainers"] or []),
                              sidecar_container(pipeline, image, dp_ranks,
                                                predicate_modules)]
    spec["volumes"] = [*(spec.get("volumes") or []), *_volumes(pipeline)]
    env = trainer.setdefault("env", []) if trainer.get("env") is not None else []
    trainer["env"] = env
    _set_env(env, "DATALANE_SOCKET", socket_path(pipeline))
    _set_env(env, "DATALANE_PIPELINE", pipeline.name)
    for name, value in dp_env.items():
        _set_env(env, name, value)
    mounts = list(trainer.get("volumeMounts") or [])
    mounts.append({"name": VOLUME_SOCKET, "mountPath": pipeline.spec.sidecar.socketDir})
    trainer["volumeMounts"] = mounts
    labels = meta.get("labels")
    meta["labels"] = {**(labels or {}), LABEL_PIPELINE: pipeline.name}
    meta["annotations"] = {**(meta.get("annotations") or {}), ANN_INJECTED: image,
                           ANN_RECIPE: stamp_text(pipeline.recipe)}
    return out
