"""A client state as one entry per lane: what ``torch.distributed.checkpoint`` saves.

``torch.distributed.checkpoint`` stores every key of every rank's state dict once: a key that
several ranks write with the same value is kept once, keys of different ranks sit side by
side, and on load each rank reads the keys its own state dict names. So the torch adapter
does not save "this rank's state" under one key (every rank would write the same key, and
DCP would keep one rank's copy): it saves one entry per lane it owns, ``lane_00005``, plus a
``recipe`` entry that every rank writes alike. A rank of any other world size asks for the
entries of the lanes it owns now, and DCP re-deals them; tensor-parallel peers, which own the
same lanes, write identical entries that DCP keeps once.

Each entry carries the position it was saved at (step, microbatches consumed, and the world
size and microbatch size they count in), the lane's state at the step boundary and a SHA-256
of its own canonical JSON, so a damaged or hand-edited entry is refused, never used.

Callers: :mod:`datalane.client.torch` (``DataLaneDataset.state_dict``/``load_state_dict``).
Plain JSON, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from datalane.client.position import CLIENT_STATE_FORMAT
from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.integrity import SEAL_KEY, check_seal, parse_json, seal
from datalane.spec.state import CHECKPOINT_FORMAT, checkpoint_sha256

__all__ = ["LANE_ENTRY_FORMAT", "RECIPE_ENTRY_FORMAT", "RECIPE_KEY", "join", "lane_key", "split"]

LANE_ENTRY_FORMAT = "datalane.lane-entry/v1"
RECIPE_ENTRY_FORMAT = "datalane.recipe-entry/v1"
RECIPE_KEY = "recipe"
_POSITION = ("step", "consumed", "world_size", "microbatch_size")


def lane_key(lane: int) -> str:
    """The state-dict key of one lane's entry."""
    return f"lane_{lane:05d}"


def _seal(body: dict[str, Any]) -> str:
    return json.dumps(seal(body), separators=(",", ":"), sort_keys=True)


_KEYS = {RECIPE_ENTRY_FORMAT: {"lanes_total", "fingerprint", "fingerprint_doc"},
         LANE_ENTRY_FORMAT: {"lane", "state", *_POSITION}}


def _open(raw: Any, fmt: str, where: str) -> dict[str, Any]:
    """Parse and verify one sealed entry, with every field its format has (a seal can be
    recomputed by whoever edits an entry: it proves the bytes whole, not the writer)."""
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str):
        raise MismatchError(f"{where} must be a JSON string, got {type(raw).__name__}")
    data = parse_json(raw, where, MismatchError)
    if not isinstance(data, dict) or data.get("format") != fmt:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise MismatchError(f"{where} is not a datalane entry (format {got!r}, expected "
                            f"{fmt!r})")
    check_seal(data, where, required=True)
    missing = sorted(_KEYS[fmt] - set(data))
    if missing:
        raise MismatchError(f"{where} lacks the fields {missing} of a {fmt} entry")
    return {k: v for k, v in data.items() if k != SEAL_KEY}


def split(state: Mapping[str, Any], lanes: range, lanes_total: int) -> dict[str, str]:
    """One sealed entry per lane of ``lanes`` (plus the recipe entry) from a client state
    (``SidecarLoader.state_dict()`` / ``InProcessLoader.state_dict()``)."""
    if state.get("format") != CLIENT_STATE_FORMAT:
        raise MismatchError(f"not a datalane client state (format {state.get('format')!r})")
    ckpt = state.get("state")
    step = state["step"]
    if ckpt is None and step != 0:
        raise ConfigError(f"the loader stands at step {step} with no lane states yet (it "
                          f"resumes from the store and has not opened): iterate it once "
                          f"before saving")
    if ckpt is not None and ckpt.get("step") != step:
        raise MismatchError(f"the client state at step {step} carries lane states of step "
                            f"{ckpt.get('step')}")
    position = {k: state[k] for k in _POSITION}
    out = {RECIPE_KEY: _seal({
        "format": RECIPE_ENTRY_FORMAT, "lanes_total": lanes_total,
        "fingerprint": state.get("fingerprint", ""),
        "fingerprint_doc": ckpt.get("fingerprint_doc") if ckpt else None})}
    for lane in lanes:
        lane_json = None
        if ckpt is not None:
            lane_json = ckpt["lanes"].get(str(lane))
            if lane_json is None:
                raise MismatchError(f"the client state of step {step} has no state for "
                                    f"lane {lane}")
        out[lane_key(lane)] = _seal({"format": LANE_ENTRY_FORMAT, "lane": lane, **position,
                                     "state": lane_json})
    return out


def join(entries: Mapping[str, Any], lanes: range, lanes_total: int) -> dict[str, Any]:
    """The client state of a rank owning ``lanes``, from the entries of a checkpoint saved by
    any world size (every entry checked, and all of them at one position)."""
    recipe = _open(entries.get(RECIPE_KEY), RECIPE_ENTRY_FORMAT, f"the {RECIPE_KEY!r} entry")
    if recipe["lanes_total"] != lanes_total:
        raise MismatchError(f"the checkpoint was saved with {recipe['lanes_total']} lanes; "
                            f"this recipe has {lanes_total}")
    heads: dict[tuple[Any, ...], list[int]] = {}
    lane_states: dict[str, Any] = {}
    for lane in lanes:
        key = lane_key(lane)
        if key not in entries:
            raise MismatchError(f"the checkpoint has no entry {key!r} for lane {lane}")
        body = _open(entries[key], LANE_ENTRY_FORMAT, f"entry {key!r}")
        if body["lane"] != lane:
            raise MismatchError(f"entry {key!r} holds lane {body['lane']}")
        head = tuple(body[k] for k in _POSITION)
        heads.setdefault(head, []).append(lane)
        if body["state"] is not None:
            lane_states[str(lane)] = body["state"]
    if len(heads) > 1:
        parts = "; ".join(f"lanes {v[0]}-{v[-1]} at step {h[0]} ({h[1]} microbatches in)"
                          for h, v in heads.items())
        raise MismatchError(f"the checkpoint's lanes stand at different positions ({parts}): "
                            f"they were not saved at the same point of training")
    step, consumed, world_size, microbatch_size = next(iter(heads))
    state = None
    if lane_states:
        if len(lane_states) != len(lanes):
            raise MismatchError("the checkpoint mixes lanes with and without states")
        state = {"format": CHECKPOINT_FORMAT, "step": step,
                 "fingerprint": recipe["fingerprint"], "lanes_total": lanes_total,
                 "lanes": lane_states, "fingerprint_doc": recipe["fingerprint_doc"]}
        state["sha256"] = checkpoint_sha256(state)  # its parts were each verified above
    return {"format": CLIENT_STATE_FORMAT, "step": step, "consumed": consumed,
            "fingerprint": recipe["fingerprint"], "state": state, "world_size": world_size,
            "microbatch_size": microbatch_size}
