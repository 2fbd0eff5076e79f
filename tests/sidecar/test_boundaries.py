"""The step boundaries a session keeps (sidecar/datalane_sidecar/boundaries.py): lane states as
compact JSON, and the checkpoint text built from them byte for byte as the loader's
``state_dict()`` serializes, by hand."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest
from datalane_sidecar.boundaries import Boundary, CheckpointText, lane_json

from datalane.spec.state import Checkpoint, LaneState

# lane 3 of a recipe of two sources, before its first step
LANE_3 = '{"v":2,"lane":3,"seqs":0,"src":[[0,0,0,-1,0],[0,0,0,-1,0]],"mix":[0,0],"n":[0,0,0,0,{}]}'


def test_a_lane_state_or_its_json_is_kept_as_compact_json() -> None:
    """No spaces after the separators, keys in the state's order, from either form."""
    state = LaneState.initial(3, 2)
    assert lane_json(state) == LANE_3
    assert lane_json(state.to_json()) == LANE_3


def test_a_boundary_keeps_the_step_and_each_lanes_json_in_order() -> None:
    """From a state_dict: the step as an int, ``(lane, JSON)`` for each lane (keys "3", "4":
    lanes 3, 4); the fingerprint document is not kept. nbytes counts the JSON: 2 x 88."""
    lanes = {"3": LaneState.initial(3, 2).to_json(), "4": LaneState.initial(4, 2).to_json()}
    b = Boundary.of({"step": "5", "fingerprint": "f", "fingerprint_doc": {"big": 1},
                     "lanes": lanes})
    assert b == Boundary(5, ((3, LANE_3), (4, LANE_3.replace('"lane":3', '"lane":4'))))
    assert len(LANE_3) == 88 and b.nbytes() == 176
    assert Boundary(0, ()).nbytes() == 0


def test_a_boundary_is_an_immutable_value() -> None:
    """Boundaries are shared by a session's readers: frozen, hashable by value."""
    b = Boundary(5, ((3, LANE_3),))
    assert hash(b) == hash(Boundary(5, ((3, LANE_3),)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.step = 6  # type: ignore[misc]


def test_the_checkpoint_text_is_the_loaders_checkpoint_byte_for_byte() -> None:
    """The text of a boundary is ``json.dumps(Checkpoint.to_json(), separators=(",", ":"))``
    with the plan's fingerprint, lane count and fingerprint document."""
    doc: dict[str, Any] = {"sources": [{"name": "web", "files": ["a", "b"]}]}
    plan = SimpleNamespace(fingerprint="f00d", recipe=SimpleNamespace(lanes=8),
                           fingerprint_doc=doc)
    states = {3: LaneState.initial(3, 2), 4: LaneState.initial(4, 2)}
    boundary = Boundary(5, tuple((k, lane_json(v)) for k, v in states.items()))
    text = CheckpointText(plan).text(boundary)  # type: ignore[arg-type]
    want = Checkpoint(5, "f00d", doc, states, 8).to_json()
    assert text == json.dumps(want, separators=(",", ":"))
    assert (want["step"], want["lanes_total"], list(want["lanes"])) == (5, 8, ["3", "4"])
