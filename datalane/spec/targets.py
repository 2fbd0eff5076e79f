"""Trained targets: which next-token targets of a sequence the trainer learns from.

A sequence of ``seq_len + 1`` tokens gives ``seq_len`` targets (tokens ``1..seq_len``). A
target is trained unless it is padding (position -1) or, when the schema has a ``loss_mask``,
its mask is 0. The torch adapter's ``labels`` are -100 exactly where this says "not trained",
and a microbatch's ``step_tokens`` (the rank's count of trained targets in its step, for
normalizing the loss over the global batch) counts where it says "trained": one definition,
so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["IGNORE_INDEX", "trained_targets", "trained_tokens"]

#: the label of a target that is not trained (torch's ``cross_entropy`` default ignore index)
IGNORE_INDEX = -100


def trained_targets(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """A bool array (rows, seq_len): True where target ``j`` (token ``j + 1``) is trained."""
    positions = columns["positions"]
    trained = positions[:, 1:] >= 0
    mask = columns.get("loss_mask")
    if mask is not None:
        trained &= mask[:, 1:] != 0
    return trained


def trained_tokens(columns: Mapping[str, np.ndarray]) -> int:
    """How many targets of ``columns`` are trained."""
    return int(np.count_nonzero(trained_targets(columns)))
