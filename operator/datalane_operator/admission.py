"""Admission verdicts: what the validating webhooks answer, as pure functions.

* :func:`review_pipeline` - a DataPipeline at CREATE/UPDATE: everything the CRD schema cannot
  express (the composed recipe loads, relative paths, formats that cannot be inferred, the
  endpoint fits the URI, one pipeline per workload, fields fixed for the life of a run, edits
  of ``spec.recipe`` only where the run has not been yet by its checkpoint store's newest
  committed step (:mod:`datalane_operator.amend`), an
  existing workload's data-parallel world size is at most the lanes and its ranks fit
  ``spec.parallelism``; and the cluster :class:`~datalane_operator.policy.Policy`: the
  operator may act on the checkpoint store, the filter predicates come from allowed modules);
* :func:`review_workload` - a PyTorchJob or TrainJob at CREATE/UPDATE whose data-parallel world size
  (ranks / (TP x PP x CP)) must not exceed the lanes of the pipeline that references it, with
  whole TP x CP groups in each pod;
* :func:`review_scale` - the same for ``pytorchjobs/scale`` (``kubectl scale``).

Each returns a :class:`Verdict`; a refusal's message names the field and the value, and the
sizes that would work. Warnings go back to ``kubectl`` as admission warnings.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datalane.spec.errors import ConfigError
from datalane.spec.formats import compression_of, infer_format
from datalane_operator.amend import Progress, review_recipe_edit
from datalane_operator.kinds import PYTORCHJOB, WorkloadKind, kind_named
from datalane_operator.pipeline import Parallelism, Pipeline, load_pipeline
from datalane_operator.policy import Policy, predicates_of
from datalane_operator.storage import DEFAULT_PROTOCOLS, scheme_of, sidecar_store_options
from datalane_operator.workload import Topology, check_workers

__all__ = ["Verdict", "dropped_nulls", "review_pipeline", "review_scale", "review_workload"]

MAX_NAME = 63  # the name is a label value on every injected pod
_GLOB = re.compile(r"[*?\[]")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
IMMUTABLE = (("lanes", "spec.lanes"), ("globalBatchSize", "spec.globalBatchSize"),
             ("workload", "spec.workload"))
"""Fields fixed for the life of a run; ``spec.recipe`` may change where the run has not been
yet (:func:`_check_recipe_edit`)."""


@dataclass(frozen=True)
class Verdict:
    """An admission answer: allowed or not, why, and warnings for the user."""

    allowed: bool
    message: str = ""
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def deny(cls, message: str, warnings: list[str] | None = None) -> Verdict:
        return cls(False, message, list(warnings or []))


def _check_protocol(uri: str, where: str, protocols: Sequence[str], image: str | None,
                    warnings: list[str]) -> None:
    """Warn (never refuse: the image may be a custom one) when the sidecar image cannot read
    ``uri``: its scheme is not in the chart's ``sidecar.protocols``."""
    scheme = scheme_of(uri)
    if scheme in protocols:
        return
    listed = ", ".join(protocols) or "none"
    if image is None:
        warnings.append(f"{where} {uri!r} uses the scheme {scheme!r}, which the sidecar image "
                        f"cannot read (it reads {listed}: Helm value sidecar.protocols); the "
                        f"sidecars will fail to start")
    else:
        warnings.append(f"{where} {uri!r} uses the scheme {scheme!r}, which the default "
                        f"sidecar image cannot read (it reads {listed}: Helm value "
                        f"sidecar.protocols); spec.sidecar.image {image!r} must have an "
                        f"fsspec implementation for it")


def _check_uri(uri: str, where: str, warnings: list[str]) -> None:
    if "://" not in uri and not os.path.isabs(uri):
        raise ConfigError(f"{where} {uri!r} is a relative path; in a cluster use an absolute "
                          f"path or a URI (s3://, gs://, file:///)")
    if scheme_of(uri) == "file":
        warnings.append(f"{where} {uri!r} is a local path: the sidecar sees it only if a "
                        f"volume is mounted there")


def _check_format(uri: str, where: str) -> None:
    """Refuse a concrete file whose format could never be inferred (the engine's rule)."""
    last = uri.rstrip("/").rsplit("/", 1)[-1]
    if _GLOB.search(last):
        return
    stem = os.path.splitext(last)[0] if compression_of(last) else last
    ext = os.path.splitext(stem)[1].lower()
    if ext and infer_format(last) is None:
        raise ConfigError(f"{where} {uri!r}: the format cannot be inferred from {ext!r}; set "
                          f"the source's format to 'parquet' or 'jsonl'")


def dropped_nulls(obj: Mapping[str, Any]) -> list[str]:
    """Fields the user set to null that the stored object holds with a value.

    Client-side ``kubectl apply`` deletes null fields before it sends an object, and the API
    server then fills in the schema's default: ``epochs: null`` ("repeat forever") would
    silently become ``epochs: 1``. The user's manifest survives in the last-applied
    annotation, so the difference can be found and refused.
    """
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not raw:
        return []
    try:
        applied = json.loads(raw)
    except ValueError:
        return []
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key, value in a.items():
                where = f"{path}.{key}"
                if value is None and b.get(key) is not None:
                    out.append(where)
                elif key in b:
                    walk(value, b[key], where)
        elif isinstance(a, list) and isinstance(b, list):
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(x, y, f"{path}[{i}]")

    walk(applied.get("spec"), obj.get("spec"), "spec")
    return out


def _data_uris(p: Pipeline) -> list[tuple[str, str]]:
    """(field, URI) of everything the sidecar reads: tokenizer, sources, chat files."""
    r = p.recipe
    out = [("spec.recipe.tokenizer.uri", r.tokenizer.uri)]
    for i, src in enumerate(r.sources):
        out += [(f"spec.recipe.sources[{i}].uris[{j}]", uri) for j, uri in enumerate(src.uris)]
        chat = getattr(src, "chat", None)
        for name in ("template", "tokenizer_config"):
            uri = getattr(chat, name, None) if chat is not None else None
            if isinstance(uri, str):
                out.append((f"spec.recipe.sources[{i}].chat.{name}", uri))
    return out


def _check_data(p: Pipeline, warnings: list[str]) -> None:
    data = p.spec.data
    if data.googleCredentials is not None and data.secretRef is None:
        raise ConfigError(f"spec.data.googleCredentials {data.googleCredentials!r} names a key "
                          f"of the data Secret, but spec.data.secretRef is not set")
    schemes = {scheme_of(uri) for _, uri in _data_uris(p)}
    if (data.endpoint is not None or data.region is not None) and not schemes & {"s3", "s3a"}:
        field = "endpoint" if data.endpoint is not None else "region"
        warnings.append(f"spec.data.{field} is set, but no source of the recipe is an s3:// "
                        f"URI: it has no effect")


def _semantics(p: Pipeline, policy: Policy | None, warnings: list[str],
               protocols: Sequence[str] = DEFAULT_PROTOCOLS) -> None:
    """The checks beyond the schema; ``policy`` None skips the cluster policy's."""
    if len(p.name) > MAX_NAME:
        raise ConfigError(f"metadata.name {p.name!r} has {len(p.name)} characters; at most "
                          f"{MAX_NAME} (it becomes a label value on every injected pod)")
    r = p.recipe
    image = p.spec.sidecar.image
    for where, uri in _data_uris(p):
        _check_uri(uri, where, warnings)
        _check_protocol(uri, where, protocols, image, warnings)
    for i, src in enumerate(r.sources):
        for j, uri in enumerate(src.uris):
            if src.format is None:
                _check_format(uri, f"spec.recipe.sources[{i}].uris[{j}]")
    _check_data(p, warnings)
    if policy is not None:
        policy.check_predicates(r)
    for _where, pred in predicates_of(r):
        warnings.append(f"filter predicate {pred!r} must be importable in the sidecar image")
    ckpt = p.spec.checkpoint
    if "://" not in ckpt.uri and not os.path.isabs(ckpt.uri):
        raise ConfigError(f"spec.checkpoint.uri {ckpt.uri!r} is a relative path; use a URI "
                          f"such as s3://bucket/run or an absolute path")
    sidecar_store_options(ckpt)  # the endpoint must fit the scheme
    _check_protocol(ckpt.uri, "spec.checkpoint.uri", protocols, image, warnings)
    if policy is not None:  # never the operator's identity unless allowed
        policy.store_access(p.namespace, ckpt)
    if scheme_of(ckpt.uri) == "file":
        warnings.append(f"spec.checkpoint.uri {ckpt.uri!r} is local to each pod unless a "
                        f"shared volume is mounted there; pods cannot resume each other's lanes")
    if scheme_of(ckpt.uri) == "s3" and ckpt.secretRef is None:
        warnings.append("spec.checkpoint.secretRef is not set: the sidecars and the operator "
                        "need ambient credentials (workload identity) for the store, and "
                        "the operator acts on it with its own identity (cluster policy)")


def review_pipeline(new: Mapping[str, Any], old: Mapping[str, Any] | None = None, *,
                    others: Iterable[tuple[str, str]] = (),
                    workload: Mapping[str, Any] | None = None,
                    policy: Policy | None = None,
                    protocols: Sequence[str] = DEFAULT_PROTOCOLS,
                    progress: Progress | None = None) -> Verdict:
    """Verdict on a DataPipeline at CREATE (``old`` None) or UPDATE.

    ``others`` are ``(pipeline name, workload name)`` of the other pipelines in the namespace;
    ``workload`` is the referenced job if it exists already; ``policy`` is the cluster's
    (default: the strictest, Helm's defaults); ``protocols`` the URI schemes the sidecar
    image reads (the chart's ``sidecar.protocols``): any other gets a warning. ``progress``
    is the run's progress as its checkpoint store says (:class:`~datalane_operator.amend.
    Progress`), which an UPDATE of ``spec.recipe`` is checked against; without it such an
    update is refused. The stored object's ``status`` is never trusted for it.
    """
    warnings: list[str] = []
    try:
        nulls = dropped_nulls(new)
        if nulls:
            raise ConfigError(
                f"{nulls[0]} is null in your manifest, but client-side `kubectl apply` drops "
                f"null fields, so it would get the default {_value_at(new, nulls[0])!r}; use "
                f"`kubectl apply --server-side` or `kubectl create` to keep null")
        p = load_pipeline(new)
        # An update that leaves the spec alone (kopf's annotations, labels) is not refused for
        # the policy: a pipeline stored before it is never acted on anyway (the store look
        # re-checks), and refusing would wedge every metadata change of it.
        same_spec = old is not None and old.get("spec") == new.get("spec")
        _semantics(p, None if same_spec else policy or Policy(), warnings, protocols)
        for other, job in others:
            if other != p.name and job == p.spec.workload.name:
                raise ConfigError(f"spec.workload.name {job!r} is already the workload of "
                                  f"DataPipeline {other!r}; one pipeline per job")
        if old is not None:
            old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
            for key, where in IMMUTABLE:
                if old_spec.get(key) != new_spec.get(key):
                    before, after = _short(old_spec.get(key)), _short(new_spec.get(key))
                    raise ConfigError(f"{where} is fixed for the life of a run ({before} -> "
                                      f"{after}); create a new DataPipeline for a new run")
            if old_spec.get("recipe") != new_spec.get("recipe"):
                warnings += _check_recipe_edit(old, p, workload, progress)
        if workload is not None:
            par = p.spec.parallelism
            topo = kind_named(p.spec.workload.kind).topology(workload, p.spec.workload.trainer,
                                                             par)
            try:
                check_workers(p.spec.lanes, topo)
            except ConfigError as e:
                fields = (f"spec.lanes {p.spec.lanes} does" if par.model_parallel == 1 else
                          f"spec.lanes {p.spec.lanes} and spec.parallelism ({par.describe()}) "
                          f"do")
                raise ConfigError(f"{fields} not fit {p.spec.workload.kind} "
                                  f"{p.spec.workload.name} as it runs now: {e}") from None
            if topo.nproc is None:
                warnings.append(f"the ranks per pod of {p.spec.workload.name} cannot be known "
                                f"from its spec ({topo.nproc_source}); the scale guard is off")
    except ConfigError as e:
        return Verdict.deny(str(e), warnings)
    return Verdict(True, "", warnings)


def _check_recipe_edit(old: Mapping[str, Any], new: Pipeline,
                       workload: Mapping[str, Any] | None,
                       progress: Progress | None) -> list[str]:
    """An UPDATE that changes ``spec.recipe``: refused (ConfigError) when it edits steps the
    run has consumed by its store's progress (or the progress is unknown); returns warnings
    when admitted."""
    try:
        before = load_pipeline(old)
    except ConfigError as e:  # stored while the webhook was off: fixing it must stay possible
        return [f"the stored spec.recipe does not load ({e}), so this edit was not checked "
                f"against the steps the run has consumed"]
    running = f"{new.spec.workload.kind} {new.spec.workload.name}" if workload else None
    return review_recipe_edit(before.recipe, new.recipe, progress, running=running)


def _value_at(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        value = value[int(part[1:-1])] if part.startswith("[") else value.get(part)
    return value


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _guard(lanes: int, topo: Topology, pipeline: str, field: str | None = None) -> Verdict:
    """``field``: the job's field that holds the scaled pods' count, named in a refusal."""
    try:
        check_workers(lanes, topo)
    except ConfigError as e:
        where = f"{field} {topo.workers}: " if field else ""
        return Verdict.deny(f"{where}{e} (DataPipeline {pipeline})")
    warnings = []
    if topo.nproc is None:
        warnings.append(f"DataPipeline {pipeline}: the ranks per pod cannot be known "
                        f"({topo.nproc_source}), so the world size is not checked")
    return Verdict(True, "", warnings)


def review_workload(job: Mapping[str, Any], lanes: int, pipeline: str,
                    container: str = "pytorch", parallelism: Parallelism | None = None,
                    kind: WorkloadKind = PYTORCHJOB) -> Verdict:
    """Verdict on a job of ``kind`` (CREATE/UPDATE: a TrainJob's resize is an update of
    ``spec.trainer.numNodes``) that DataPipeline ``pipeline`` references; ``parallelism`` is
    the pipeline's ``spec.parallelism``."""
    return _guard(lanes, kind.topology(job, container, parallelism), pipeline, kind.scale_field)


def review_scale(scale: Mapping[str, Any], job: Mapping[str, Any], lanes: int, pipeline: str,
                 container: str = "pytorch", parallelism: Parallelism | None = None,
                 ) -> Verdict:
    """Verdict on an update of ``pytorchjobs/scale`` (``spec.replicas`` = Worker replicas)."""
    replicas = (scale.get("spec") or {}).get("replicas")
    if replicas is None:
        return Verdict(True)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        return Verdict.deny(f"spec.replicas {replicas!r} is not a non-negative integer")
    return _guard(lanes, PYTORCHJOB.topology(job, container, parallelism).with_workers(replicas),
                  pipeline)
