"""Where a trainer stands in the stream, and the client's state_dict format.

A position is ``(step, consumed)``: ``consumed`` microbatches of ``step`` were handed to the
trainer. With it the client keeps the rank's checkpoint at the boundary before ``step``
(inline, a few hundred bytes per lane), so it can resume - after a sidecar restart, or from
a trainer checkpoint - without storage and without losing or repeating a sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.state import check_step

__all__ = ["CLIENT_STATE_FORMAT", "Position"]

CLIENT_STATE_FORMAT = "datalane.client/v1"


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

    def check_layout(self, world_size: int, microbatch_size: int) -> None:
        """Refuse a position inside a step taken with another world size or microbatch size:
        its ``consumed`` microbatches would name other sequences (some lost, some repeated).
        At a step boundary any layout fits."""
        if not self.consumed or not self.world_size:
            return
        if (self.world_size, self.microbatch_size) != (world_size, microbatch_size):
            raise ConfigError(
                f"the client state is inside step {self.step} ({self.consumed} microbatches "
                f"of {self.microbatch_size} sequences consumed at world size "
                f"{self.world_size}); it resumes only with world size {self.world_size} and "
                f"microbatch size {self.microbatch_size}, not world size {world_size} and "
                f"microbatch size {microbatch_size}. Resize from a state at a step boundary")

    def to_state(self) -> dict[str, Any]:
        return {"format": CLIENT_STATE_FORMAT, "step": self.step, "consumed": self.consumed,
                "fingerprint": self.fingerprint,
                "state": json.loads(self.state_json) if self.state_json else None,
                "world_size": self.world_size, "microbatch_size": self.microbatch_size}

    @classmethod
    def from_state(cls, data: Any) -> Position:
        if not isinstance(data, dict) or data.get("format") != CLIENT_STATE_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise MismatchError(f"not a datalane client state (format {got!r}, expected "
                                f"{CLIENT_STATE_FORMAT!r})")
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise MismatchError(f"the client state has unknown keys {unknown}")
        try:
            step = check_step(data["step"], "the client state's step")
            consumed, world, mbs = (_count(data.get(k) or 0, k)
                                    for k in ("consumed", "world_size", "microbatch_size"))
        except KeyError as e:
            raise MismatchError(f"the client state lacks the key {e.args[0]!r}") from None
        state = data.get("state")
        if state is not None and not isinstance(state, dict):
            raise MismatchError(f"the client state's lane states must be an object or null, "
                                f"got {type(state).__name__}")
        return cls(step, consumed,
                   json.dumps(state, separators=(",", ":")) if state is not None else None,
                   str(data.get("fingerprint", "")), world, mbs)


_KEYS = {"format", "step", "consumed", "fingerprint", "state", "world_size", "microbatch_size"}


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise MismatchError(f"the client state's {key} must be a count, got {value!r}")
    return value
