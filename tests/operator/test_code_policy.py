"""One code policy for every stream, in the operator.

The tester's repro: admission refused ``builtins:exec`` as a training source's predicate but
admitted it on an eval source. Admission and the pod webhook now apply
:class:`datalane.spec.codepolicy.CodePolicy` to every predicate of the recipe, the eval
streams' included, and the injected sidecar gets the allow-list as
``DATALANE_PREDICATE_MODULES`` so that it applies the same rule itself.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest
from datalane_operator import handlers
from datalane_operator.admission import review_pipeline
from datalane_operator.inject import mutate_pod
from datalane_operator.pipeline import load_pipeline
from datalane_operator.policy import Policy
from datalane_operator.runtime import OperatorConfig, Runtime

from .builders import dp, pod
from .fakeapi import FakeKube

POLICY = Policy(predicate_modules=("corp.filters",))


def with_eval_predicate(predicate: str) -> dict[str, Any]:
    body = dp()
    body["spec"]["recipe"]["eval"] = [{"name": "heldout", "steps": 4, "sources": [
        {"name": "val", "uris": ["s3://data/val/part-0.jsonl"],
         "filters": {"predicate": predicate}}]}]
    return body


@pytest.mark.parametrize("policy", [Policy(), POLICY, Policy(predicate_modules=("builtins",))],
                         ids=["default", "corp.filters", "builtins listed"])
def test_builtins_exec_on_an_eval_source_is_refused(policy: Policy) -> None:
    v = review_pipeline(with_eval_predicate("builtins:exec"), policy=policy)
    assert not v.allowed
    assert v.message == (
        "spec.recipe.eval[0].sources[0].filters.predicate 'builtins:exec' is not allowed: "
        "'builtins' is a module of Python's standard library, which no filter predicate may "
        "come from (builtins:exec or os:system would run any code the data holds); write the "
        "filter in a module of your own")


def test_an_eval_source_predicate_obeys_the_allow_list() -> None:
    v = review_pipeline(with_eval_predicate("mypkg.filters:keep"), policy=POLICY)
    assert v.message == (
        "spec.recipe.eval[0].sources[0].filters.predicate 'mypkg.filters:keep' is not allowed: "
        "the cluster policy admits predicates only from the modules corp.filters "
        "(recipes.predicateModules). A predicate is code the sidecar imports and runs; ask an "
        "administrator to add its module, or drop the predicate")
    v = review_pipeline(with_eval_predicate("corp.filters.lang:en"), policy=POLICY)
    assert v.allowed, v.message
    assert v.warnings == ["filter predicate 'corp.filters.lang:en' must be importable in the "
                          "sidecar image"]


def test_the_admission_rule_is_the_spec_rule() -> None:
    """The operator does not keep a rule of its own: its policy is the spec's CodePolicy."""
    from datalane.spec.codepolicy import CodePolicy

    assert POLICY.code_policy() == CodePolicy(
        ("corp.filters",), "the cluster policy", "recipes.predicateModules", "the sidecar",
        "ask an administrator to add its module, or drop the predicate")


def _sidecar_env(out: dict[str, Any]) -> dict[str, str]:
    side = next(c for c in out["spec"]["initContainers"] if c["name"] == "datalane-sidecar")
    return {e["name"]: e.get("value", "") for e in side["env"]}


def test_the_sidecar_gets_the_allow_list() -> None:
    from datalane.spec.codepolicy import CodePolicy

    pipeline = load_pipeline(dp())
    env = _sidecar_env(mutate_pod(pod(), pipeline, "img:1", ("corp.filters", "team.x")))
    assert env["DATALANE_PREDICATE_MODULES"] == "corp.filters,team.x"
    assert CodePolicy.from_env(env).modules == ("corp.filters", "team.x")
    empty = _sidecar_env(mutate_pod(pod(), pipeline, "img:1"))
    assert empty["DATALANE_PREDICATE_MODULES"] == ""  # set and empty: no module allowed
    assert CodePolicy.from_env(empty).modules == ()


def test_the_pod_webhook_refuses_an_eval_predicate_and_passes_the_allow_list() -> None:
    """A pipeline stored while the webhook was off: its pods get no sidecar; an allowed one
    gets a sidecar that knows the allow-list."""
    index = {("ml", "llama"): [with_eval_predicate("builtins:exec")]}
    rt = Runtime(OperatorConfig(policy=Policy(predicate_modules=("builtins", "corp.filters"))),
                 kube=FakeKube(dp()))  # where the webhook writes the recipe ConfigMap

    def inject() -> tuple[str, dict[str, Any]]:
        patch = kopf.Patch()
        body = kopf.Body(copy.deepcopy(pod("llama-0")))
        try:
            asyncio.run(handlers.inject_sidecar(body=body, patch=patch, warnings=[],
                                                pipelines=index, memo=kopf.Memo(runtime=rt)))
        except kopf.AdmissionError as e:
            return str(e), {}
        out = copy.deepcopy(pod("llama-0"))
        for fn in patch.fns:
            fn(out)
        return "injected", out

    what, _ = inject()
    assert what.startswith("spec.recipe.eval[0].sources[0].filters.predicate 'builtins:exec' "
                           "is not allowed"), what
    index[("ml", "llama")] = [with_eval_predicate("corp.filters:keep")]
    what, out = inject()
    assert what == "injected"
    assert _sidecar_env(out)["DATALANE_PREDICATE_MODULES"] == "builtins,corp.filters"
