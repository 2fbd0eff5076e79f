"""The ledger policy: which steps' window digests a rank's checkpoint lists, and when a
session must rebuild digests it never produced (issue 20). Pure functions of step numbers;
:class:`~datalane_sidecar.service.DataLaneService` keeps the state (each session's ledger
start, whether its pod's last object committed) and asks these.

A pod object of step ``s`` lists the digests of steps ``since .. s-1``, where ``since`` is
the step of the rank's previous checkpoint that was committed (every pod wrote its object),
so the committed manifests together cover every step once. A session that starts after the
newest committed step at or before its first step (a restarted sidecar or rank worker, a
trainer resumed from its own position) has no digests for the steps in between: they are
rebuilt on the side (:meth:`datalane_sidecar.session.Session.backfill`).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["backfill_from", "ledger_since", "ledger_steps", "next_since"]


def backfill_from(committed: Iterable[int], first_step: int) -> int | None:
    """The committed step a session starting at ``first_step`` must rebuild digests from
    (its ledger starts there), or None when nothing needs rebuilding: no step is committed
    at or before ``first_step``, or the newest one is ``first_step`` itself."""
    since = max((s for s in committed if s <= first_step), default=None)
    return None if since is None or since == first_step else since


def ledger_since(since: int, step: int, committed: Iterable[int] | None) -> int:
    """Where the ledger of a checkpoint of ``step`` starts, given the rank's ``since``.

    ``committed`` (the store's committed steps) is passed only when the pod's last object
    did not complete its step: a later pod may have committed a step after ``since`` since,
    and the ledger then starts at the newest one before ``step`` (older digests need not be
    carried; else the object of a pod that never commits grows with every step)."""
    if committed is None:
        return since
    newer = [s for s in committed if since < s < step]
    return max(newer) if newer else since


def ledger_steps(since: int, step: int) -> range:
    """The steps whose digests the checkpoint of ``step`` lists (ledger start ``since``)."""
    return range(since, step)


def next_since(step: int, committed: bool, has_store: bool) -> int | None:
    """The ledger start after a checkpoint of ``step`` was saved: ``step`` when the step was
    committed (or there is no store to commit to), else None (keep the start: the next
    object carries every digest since the last commit)."""
    return step if committed or not has_store else None
