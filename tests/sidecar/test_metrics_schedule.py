"""The sidecar's mixture gauges under a schedule: the weights in force at the sessions' step,
and the target share the realized share tracks (the mean of each step's normalized weights).

Hand-computed: sources web 1.0 and code 1.0; a phase at step 2 sets code to 3.0 (a jump).
Steps 0, 1 ask for 1/2 code each, steps 2.. for 3/4: after 4 steps the target share of code
is (1/2 + 1/2 + 3/4 + 3/4) / 4 = 0.625, and the weights in force (step 3) are 1:3.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from datalane_sidecar.metrics import Metrics

from datalane.spec.recipe import load_recipe
from datalane.spec.state import Counters


def recipe(phases):
    return load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 7, "tokenizer": {"uri": "tok.json"},
        "sources": [{"name": "web", "uris": ["web.jsonl"]},
                    {"name": "code", "uris": ["code.jsonl"]}],
        "phases": phases})


def session(r, step, taken):
    """What the metrics read of a session (in a rank worker's process too): its plan's recipe
    and one ``gauges()`` call."""
    return SimpleNamespace(plan=SimpleNamespace(recipe=r), gauges=lambda: {
        "waited_seconds": 0.0, "step": step, "skipped": dict(Counters().skipped),
        "mixture_tokens": list(taken)})


def gauge(m: Metrics, name: str) -> dict[str, float]:
    return {s.labels["source"]: s.value for metric in m.registry.collect()
            if metric.name == name for s in metric.samples}


def test_the_gauges_follow_the_schedule_step_by_step() -> None:
    r = recipe([{"name": "more-code", "start_step": 2, "weights": {"code": 3.0}}])
    m = Metrics()
    m.refresh([session(r, 1, [5, 5])])
    assert gauge(m, "datalane_source_weight") == {"web": 0.5, "code": 0.5}
    assert gauge(m, "datalane_source_target_share") == {"web": 0.5, "code": 0.5}
    m.refresh([session(r, 4, [40, 60])])
    assert gauge(m, "datalane_source_weight") == {"web": 0.25, "code": 0.75}, (
        "the weight gauge is the share of the weights in force at the last step served")
    assert gauge(m, "datalane_source_target_share") == pytest.approx(
        {"web": 0.375, "code": 0.625}), "the target is the mean of the steps' shares"
    assert gauge(m, "datalane_source_share") == {"web": 0.4, "code": 0.6}
    m.refresh([session(r, 2, [5, 5])])  # a restarted session: fewer steps, summed again
    assert gauge(m, "datalane_source_target_share") == {"web": 0.5, "code": 0.5}


def test_without_phases_the_target_is_the_weights() -> None:
    r = recipe([])
    m = Metrics()
    m.refresh([session(r, 9, [3, 1])])
    assert gauge(m, "datalane_source_weight") == gauge(m, "datalane_source_target_share") == {
        "web": 0.5, "code": 0.5}
