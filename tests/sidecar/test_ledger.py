"""The ledger policy (sidecar/datalane_sidecar/ledger.py): which steps' digests a rank's
checkpoint lists and when a session rebuilds digests, on hand-computed cases."""

from __future__ import annotations

import pytest
from datalane_sidecar.ledger import backfill_from, ledger_since, ledger_steps, next_since


@pytest.mark.parametrize("committed,first,expected", [
    ([], 5, None),  # nothing committed: the first checkpoint's ledger starts at the session
    ([5], 5, None),  # the session starts at the newest commit: nothing to rebuild
    ([2, 5], 5, None),  # the same, with an older commit: the one at the start wins
    ([2, 4], 7, 4),  # restarted at 7 after the commit of 4: steps 4, 5, 6 are rebuilt
    ([2, 4, 9], 7, 4),  # a commit past the session's start is no start for it
    ([4, 2], 7, 4),  # the store's order does not matter
    ([8, 9], 7, None),  # every commit is later: nothing at or before 7
    ([0], 3, 0),  # from step 0 (a checkpoint of the very start)
])
def test_backfill_starts_at_the_newest_commit_before_the_session(committed, first,
                                                                 expected) -> None:
    assert backfill_from(committed, first) == expected


@pytest.mark.parametrize("since,step,committed,expected", [
    (4, 8, None, 4),  # the pod's last object committed: the start stays
    (4, 8, [2, 4], 4),  # uncommitted, and nothing newer in the store
    (4, 8, [2, 4, 6], 6),  # another pod committed 6 since: the ledger starts there
    (4, 8, [5, 6, 7], 7),  # the newest before the step
    (4, 8, [5, 8], 5),  # the step itself is not before itself
    (4, 8, [9, 12], 4),  # later commits are not a start
])
def test_an_uncommitted_pod_starts_its_ledger_at_the_newest_commit(since, step, committed,
                                                                   expected) -> None:
    assert ledger_since(since, step, committed) == expected


def test_the_listed_steps_are_the_start_up_to_the_step_excluded() -> None:
    assert list(ledger_steps(4, 8)) == [4, 5, 6, 7]
    assert list(ledger_steps(8, 8)) == []  # a checkpoint of the step just committed


@pytest.mark.parametrize("committed,has_store,expected", [
    (True, True, 8),  # committed: the next ledger starts here
    (False, True, None),  # not committed: keep every digest since the last commit
    (False, False, 8),  # no store: nothing to commit to, nothing to carry
])
def test_the_next_ledger_starts_after_a_commit(committed, has_store, expected) -> None:
    assert next_since(8, committed, has_store) == expected
