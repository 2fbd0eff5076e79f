"""Where a trainer stands in the stream, and the client's state_dict format.

A position is ``(step, consumed)``: ``consumed`` microbatches of ``step`` were handed to the
trainer. With it the client keeps the rank's checkpoint at the boundary before ``step``
(inline, a few hundred bytes per lane), so it can resume - after a sidecar restart, or from
a trainer checkpoint - without storage and without losing or repeating a sequence.

The state_dict is a :class:`ClientState` (``datalane.client/v2``), loaded through the strict
model loader (:func:`datalane.spec.model.load`): every key is required, an unknown key is an
error naming it, and every bad value is refused naming the field and the value. States of
format ``datalane.client/v1`` - what earlier clients wrote, and what users' trainer
checkpoints hold - still load (:class:`ClientStateV1`: the same fields, the later ones
optional, as v1 writers added them over time).

The lane states inside (``state``, a ``datalane.checkpoint`` object) are checked here only
for being an object or null; their contents are verified where they are used
(:meth:`datalane.spec.state.Checkpoint.from_json` in the in-process loader, the sidecar's
Open), which knows the lane-state versions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from datalane.spec import model
from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.model import doc
from datalane.spec.state import MAX_STEP

__all__ = ["CLIENT_STATE_FORMAT", "CLIENT_STATE_V1", "ClientState", "ClientStateV1", "Position",
           "load_client_state"]

CLIENT_STATE_FORMAT = "datalane.client/v2"
CLIENT_STATE_V1 = "datalane.client/v1"  # still read, never written

_WHERE = "client state"
_COUNT_MAX = 2**31 - 1  # consumed travels as the wire's uint32 skip_microbatches
_FINGERPRINT = "(?:[0-9a-f]{64})?"  # SHA-256 hex of the fingerprint document; empty = unknown
_STATE_KEY = "state"  # the lane states: a JSON object the model loader does not type

_DOCS = {
    "step": "The step the trainer is in: the next microbatch handed out belongs to it.",
    "consumed": "Microbatches of `step` already handed to the trainer (0 at a step boundary).",
    "fingerprint": "The recipe's fingerprint (SHA-256 hex) the position belongs to; empty "
                   "while not known yet (a sidecar client before its first Open).",
    "world_size": "Data-parallel world size that `consumed` counts in; 0 = unknown (a state "
                  "converted from an older client).",
    "microbatch_size": "Sequences per microbatch that `consumed` counts in; 0 = unknown.",
    "state": "The rank's checkpoint (datalane.checkpoint) at the boundary before `step`; "
             "null before the first boundary was reached.",
}


@dataclass(frozen=True)
class ClientState:
    """A client loader's state_dict: its position and the lane states it resumes from."""

    format: Literal["datalane.client/v2"] = doc("Format and version of this state.")
    step: int = doc(_DOCS["step"], ge=0, le=MAX_STEP - 1)
    consumed: int = doc(_DOCS["consumed"], ge=0, le=_COUNT_MAX)
    fingerprint: str = doc(_DOCS["fingerprint"], pattern=_FINGERPRINT)
    world_size: int = doc(_DOCS["world_size"], ge=0, le=_COUNT_MAX)
    microbatch_size: int = doc(_DOCS["microbatch_size"], ge=0, le=_COUNT_MAX)
    # required too: checked by load_client_state (the model loader types no free-form
    # objects); doc() returns a field whose default is None, which RUF009 cannot see
    state: dict[str, Any] | None = doc(_DOCS["state"], default=None)  # noqa: RUF009


@dataclass(frozen=True)
class ClientStateV1:
    """A client state of format datalane.client/v1, as earlier clients wrote it."""

    format: Literal["datalane.client/v1"] = doc("Format and version of this state.")
    step: int = doc(_DOCS["step"], ge=0, le=MAX_STEP - 1)
    consumed: int = doc(_DOCS["consumed"], default=0, ge=0, le=_COUNT_MAX)
    fingerprint: str = doc(_DOCS["fingerprint"], default="", pattern=_FINGERPRINT)
    # added to v1 later: states of the first clients have neither (unknown, 0)
    world_size: int = doc(_DOCS["world_size"], default=0, ge=0, le=_COUNT_MAX)
    microbatch_size: int = doc(_DOCS["microbatch_size"], default=0, ge=0, le=_COUNT_MAX)
    state: dict[str, Any] | None = doc(_DOCS["state"], default=None)  # noqa: RUF009


_FORMATS: dict[str, type[ClientState] | type[ClientStateV1]] = {
    CLIENT_STATE_FORMAT: ClientState,
    CLIENT_STATE_V1: ClientStateV1,
}


def load_client_state(data: Any) -> ClientState | ClientStateV1:
    """Parse a client state of any readable format; MismatchError naming the bad key/value."""
    if not isinstance(data, Mapping):
        raise MismatchError(f"not a datalane client state: expected an object, got "
                            f"{type(data).__name__}")
    fmt = data.get("format")
    cls = _FORMATS.get(fmt) if isinstance(fmt, str) else None
    if cls is None:
        raise MismatchError(f"not a datalane client state (format {fmt!r}, expected "
                            f"{CLIENT_STATE_FORMAT!r} or {CLIENT_STATE_V1!r})")
    required = cls is ClientState
    try:
        if required and _STATE_KEY not in data:
            raise ConfigError(f"{_WHERE}.{_STATE_KEY} is required ({_DOCS['state']})")
        state = data.get(_STATE_KEY)
        if state is not None and not isinstance(state, dict):
            raise ConfigError(f"{_WHERE}.{_STATE_KEY}: the lane states must be an object "
                              f"or null, got {type(state).__name__} {_short(state)}")
        loaded = model.load(cls, {k: v for k, v in data.items() if k != _STATE_KEY}, _WHERE)
    except ConfigError as e:  # a persisted state that cannot be this datalane's
        raise MismatchError(str(e)) from None
    return dataclasses.replace(loaded, state=state)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class Position:
    step: int = 0
    consumed: int = 0
    state_json: str | None = None  # checkpoint at the boundary before `step`; None = start
    fingerprint: str = ""
    # what `consumed` counts in: microbatches of `microbatch_size` of a rank of `world_size`
    # (0 = unknown, a state of an older client)
    world_size: int = 0
    microbatch_size: int = 0

    def advance(self, step: int, index: int, per_step: int, after_json: str | None) -> None:
        """Record that microbatch ``index`` of ``step`` was handed out."""
        if index + 1 >= per_step:
            self.step, self.consumed = step + 1, 0
            if after_json:
                self.state_json = after_json
        else:
            self.step, self.consumed = step, index + 1

    def check_layout(self, world_size: int, microbatch_size: int, per_step: int = 0) -> None:
        """Refuse a position inside a step taken with another world size or microbatch size:
        its ``consumed`` microbatches would name other sequences (some lost, some repeated).
        At a step boundary any layout fits. With ``per_step`` (the microbatches of a step in
        this layout; 0 = not known yet) also refuse ``consumed`` that is not inside a step."""
        if not self.consumed:
            return
        if self.world_size and (self.world_size, self.microbatch_size) != (world_size,
                                                                           microbatch_size):
            raise ConfigError(
                f"the client state is inside step {self.step} ({self.consumed} microbatches "
                f"of {self.microbatch_size} sequences consumed at world size "
                f"{self.world_size}); it resumes only with world size {self.world_size} and "
                f"microbatch size {self.microbatch_size}, not world size {world_size} and "
                f"microbatch size {microbatch_size}. Resize from a state at a step boundary")
        if per_step and self.consumed >= per_step:
            raise ConfigError(
                f"the client state has consumed {self.consumed} microbatches of step "
                f"{self.step}, but a step has {per_step} at world size {world_size} and "
                f"microbatch size {microbatch_size}: consumed must be below {per_step}")

    def to_state(self) -> dict[str, Any]:
        """The state_dict, format :data:`CLIENT_STATE_FORMAT` (plain JSON types)."""
        state = ClientState(
            format="datalane.client/v2", step=self.step, consumed=self.consumed,
            fingerprint=self.fingerprint, world_size=self.world_size,
            microbatch_size=self.microbatch_size,
            state=json.loads(self.state_json) if self.state_json else None)
        out: dict[str, Any] = model.dump(state)
        return out

    @classmethod
    def from_state(cls, data: Any) -> Position:
        """A position from a state_dict of format v2 or v1 (MismatchError naming the bad key
        or value otherwise)."""
        s = load_client_state(data)
        return cls(s.step, s.consumed,
                   json.dumps(s.state, separators=(",", ":")) if s.state is not None else None,
                   s.fingerprint, s.world_size, s.microbatch_size)
