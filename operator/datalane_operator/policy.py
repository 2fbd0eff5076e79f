"""Cluster policy: what a tenant's DataPipeline may make the operator do, as pure checks.

An administrator sets it with Helm values, which reach ``datalane-operator run`` as flags;
a user who may only create DataPipelines in a namespace cannot change it.

* **Whose identity acts on a checkpoint store.** The operator lists checkpoint stores and
  *deletes* old checkpoints. It acts on a store with the credentials of
  ``spec.checkpoint.secretRef``, a Secret of the DataPipeline's own namespace (a
  :class:`~datalane_operator.pipeline.SecretRef` has no namespace), for the schemes whose
  credentials it can take from a Secret (:data:`SECRET_SCHEMES`). Anything else would run
  with the operator's *own* identity: its cloud role, its file system (``file://``), its
  memory (``memory://``); without a policy a user of namespace A could name namespace B's
  store and have its checkpoints deleted. That is allowed only when the administrator opts
  in (``checkpoints.allowOperatorIdentity``), and then only under the URI prefixes listed
  for the pipeline's namespace (``checkpoints.operatorIdentityPrefixes``; no list: every
  store, for a single-tenant cluster).
* **Which modules a recipe's filter predicates may come from.** A predicate is an import
  path the sidecar imports and calls: code, not data. Only modules under
  ``recipes.predicateModules`` are admitted (default none: datalane ships no predicates),
  for training and eval sources alike, and never one of Python's standard library. The rule
  is :class:`datalane.spec.codepolicy.CodePolicy`, which the sidecar (given the allow-list as
  ``$DATALANE_PREDICATE_MODULES`` by the pod webhook) and the engine apply again.

Callers: :func:`datalane_operator.admission.review_pipeline` refuses what the policy does
not allow; :mod:`datalane_operator.reconciler` checks the store rule again before every look
at a store (a pipeline stored while the webhook was off, or before the policy changed, is
never acted on), and :mod:`datalane_operator.webhooks` the predicate rule before injecting a
pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from datalane.spec.codepolicy import CodePolicy, code_hooks, parse_modules
from datalane.spec.errors import ConfigError
from datalane.spec.recipe import Recipe
from datalane_operator.pipeline import CheckpointSpec
from datalane_operator.storage import SECRET_SCHEMES, scheme_of

__all__ = ["ALL_NAMESPACES", "Policy", "StoreAccess", "predicates_of"]

ALL_NAMESPACES = "*"
"""The key of ``operatorIdentityPrefixes`` whose prefixes apply in every namespace."""
IDENTITY_VALUE = "checkpoints.allowOperatorIdentity"
PREFIXES_VALUE = "checkpoints.operatorIdentityPrefixes"
PREDICATES_VALUE = "recipes.predicateModules"


@dataclass(frozen=True)
class StoreAccess:
    """How the operator may act on a pipeline's store: with the Secret ``secret`` of the
    pipeline's namespace, or (``secret`` None) with its own identity, as the policy allows."""

    secret: str | None


def _parts(uri: str, where: str) -> tuple[str, list[str]]:
    """(scheme, path segments) of a URI or absolute path; ``.`` and ``..`` are refused, so
    a prefix can never be escaped (``file:///ckpt/a/../b`` is ``/ckpt/b``)."""
    scheme = scheme_of(uri)
    path = uri.split("://", 1)[1] if "://" in uri else uri
    segments = [s for s in path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ConfigError(f"{where} {uri!r} has a '.' or '..' segment; write the path "
                          f"without them")
    return scheme, segments


def _under(uri: str, prefix: str) -> bool:
    """Whether ``uri`` is ``prefix`` or below it, segment by segment (``s3://b/team-a`` does
    not cover ``s3://b/team-ab``; ``s3://`` covers every S3 store)."""
    scheme, segments = _parts(uri, "uri")
    p_scheme, p_segments = _parts(prefix, "prefix")
    return scheme == p_scheme and segments[:len(p_segments)] == p_segments


def predicates_of(recipe: Recipe) -> Iterator[tuple[str, str]]:
    """``(field, predicate)`` of every filter predicate of a DataPipeline's recipe, the eval
    streams' included."""
    return code_hooks(recipe, "spec.recipe.")


@dataclass(frozen=True)
class Policy:
    """The administrator's rules (Helm values -> ``datalane-operator run`` flags)."""

    allow_operator_identity: bool = False
    identity_prefixes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    predicate_modules: tuple[str, ...] = ()

    @classmethod
    def from_flags(cls, allow_operator_identity: bool, identity_prefixes: str,
                   predicate_modules: str) -> Policy:
        """Parse the flags: prefixes as a JSON object ``{namespace: [URI prefix, ...]}``
        (``"*"`` for every namespace), predicate modules comma-separated."""
        try:
            raw = json.loads(identity_prefixes or "{}")
        except ValueError as e:
            raise ConfigError(f"--operator-identity-prefixes {identity_prefixes!r} is not "
                              f"JSON ({e}); give an object such as "
                              f'{{"team-a": ["s3://ckpt/team-a/"]}}') from None
        if not isinstance(raw, dict) or not all(
                isinstance(v, list) and all(isinstance(p, str) and p for p in v)
                for v in raw.values()):
            raise ConfigError(f"--operator-identity-prefixes {identity_prefixes!r} must map "
                              f"namespaces to lists of URI prefixes, e.g. "
                              f'{{"team-a": ["s3://ckpt/team-a/"]}}')
        prefixes = {str(ns): tuple(v) for ns, v in raw.items()}
        for ns, values in prefixes.items():
            for p in values:
                _parts(p, f"--operator-identity-prefixes[{ns!r}]")
        if prefixes and not allow_operator_identity:
            raise ConfigError(f"--operator-identity-prefixes {identity_prefixes!r} is set but "
                              f"--allow-operator-identity is not; set both ({IDENTITY_VALUE} "
                              f"true) or neither")
        modules = parse_modules(predicate_modules)
        return cls(allow_operator_identity, prefixes, modules)

    def prefixes_for(self, namespace: str) -> tuple[str, ...]:
        return (*self.identity_prefixes.get(namespace, ()),
                *self.identity_prefixes.get(ALL_NAMESPACES, ()))

    def store_access(self, namespace: str, ckpt: CheckpointSpec) -> StoreAccess:
        """How the operator may list and garbage-collect ``ckpt.uri``; a
        :class:`ConfigError` says why it may not and what to do."""
        scheme = scheme_of(ckpt.uri)
        if ckpt.secretRef is not None and scheme in SECRET_SCHEMES:
            return StoreAccess(ckpt.secretRef.name)
        if ckpt.secretRef is None:
            why = "spec.checkpoint.secretRef is not set"
        else:
            why = (f"the operator cannot take credentials for {scheme}:// from Secret "
                   f"{ckpt.secretRef.name!r} (only for "
                   f"{', '.join(s + '://' for s in SECRET_SCHEMES)})")
        admin = (f"ask an administrator to allow the operator's own identity there "
                 f"({IDENTITY_VALUE}, {PREFIXES_VALUE})")
        fix = (f"set spec.checkpoint.secretRef to a Secret in namespace {namespace!r} with "
               f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or {admin}"
               if scheme in SECRET_SCHEMES else f"use an s3:// store with a secretRef, or {admin}")
        what = (f"the operator would list and delete checkpoints of spec.checkpoint.uri "
                f"{ckpt.uri!r} with its own identity: {why}")
        if not self.allow_operator_identity:
            raise ConfigError(f"{what}, and the cluster policy does not allow that "
                              f"({IDENTITY_VALUE} is false); {fix}")
        _parts(ckpt.uri, "spec.checkpoint.uri")
        if not self.identity_prefixes:
            return StoreAccess(None)
        allowed = self.prefixes_for(namespace)
        if any(_under(ckpt.uri, p) for p in allowed):
            return StoreAccess(None)
        listed = ", ".join(allowed) if allowed else "none"
        raise ConfigError(f"{what}, and the cluster policy allows that in namespace "
                          f"{namespace!r} only under: {listed} ({PREFIXES_VALUE}); {fix}")

    def code_policy(self) -> CodePolicy:
        """The allow-list as the rule every place applies (:mod:`datalane.spec.codepolicy`)."""
        return CodePolicy(self.predicate_modules, "the cluster policy", PREDICATES_VALUE,
                          "the sidecar", "ask an administrator to add its module, or drop the "
                                         "predicate")

    def check_predicates(self, recipe: Recipe) -> None:
        """Refuse a filter predicate - of a training or an eval source - whose module the
        allow-list ``predicate_modules`` does not cover, or that comes from Python's
        standard library (never allowed)."""
        self.code_policy().check_recipe(recipe, "spec.recipe.")
