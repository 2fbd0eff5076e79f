"""The history records (``HEAD.json``, gc records) and the verdict on a store's head and tail.

Pure functions of :mod:`datalane.store.history`, on hand-made records and manifests: the exact
bytes a commit and a garbage collection write, every record a reader refuses and why, and
every line and problem :func:`audit_history` gives for a head or tail that is intact, cut,
replaced, collected, or of an older datalane. ``test_truncation`` runs the same through a
real store.
"""

from __future__ import annotations

import json

from datalane.store.history import (
    Head,
    History,
    Removed,
    audit_history,
    gc_record,
    head_record,
    read_gc_record,
    read_head,
)
from datalane.store.manifest import Manifest
from datalane.store.signing import key_id

KEY = b"k" * 32
HEAD = "s3://b/run/HEAD.json"
GC = "s3://b/run/gc/000000000020.json"


def sha(c: str) -> str:
    return c * 64


def manifest(step: int, seq: int | None, previous: tuple[int, str] | None) -> Manifest:
    """A manifest of ``step`` at place ``seq`` of the chain, linking to ``previous``."""
    return Manifest(step, "f" * 64, None, 1, {}, {}, (), previous[0] if previous else None,
                    previous[1] if previous else None, (), seq)


def store(*steps: tuple[int, int | None, int | None]) -> dict[int, tuple[str, Manifest | None]]:
    """Manifests of ``(step, seq, previous step)``; step ``s`` hashes to ``sha(str(s)[0])``."""
    return {s: (sha(str(s)[0]), manifest(s, seq, None if p is None else (p, sha(str(p)[0]))))
            for s, seq, p in steps}


# ---------------------------------------------------------------------------- the records


def test_head_json_is_the_canonical_record_of_the_newest_step() -> None:
    data = head_record(None, 40, sha("4"), 3)
    assert data == (b'{"format":"datalane.head/v1","seq":3,"sha256":"' + sha("4").encode()
                    + b'","step":40}\n')
    assert read_head(data, HEAD, None) == (Head(40, sha("4"), 3), None)
    old = head_record(None, 40, sha("4"), None)
    assert read_head(old, HEAD, None) == (Head(40, sha("4"), None), None)
    signed = head_record(KEY, 40, sha("4"), 3)
    assert json.loads(signed)["signature"]["key_id"] == key_id(KEY)
    assert read_head(signed, HEAD, KEY) == (Head(40, sha("4"), 3), None)


def test_a_head_json_a_reader_cannot_use_says_why() -> None:
    assert read_head(b'{"format": "datalane.head/v1"', HEAD, None) == (
        None, f"{HEAD} is not valid JSON (29 bytes)")
    assert read_head(b"[1]", HEAD, None) == (None, f"{HEAD} is not a datalane.head/v1 document")
    for doc in ({"format": "datalane.gc-record/v1", "step": 4, "sha256": sha("4"), "seq": 0},
                {"format": "datalane.head/v1", "step": 4, "sha256": sha("4")}):
        assert read_head(json.dumps(doc).encode(), HEAD, None) == (
            None, f"{HEAD} is not a datalane.head/v1 document")
    assert read_head(head_record(None, 40, sha("4"), 3), HEAD, KEY) == (
        None, f"{HEAD} is not signed (written without a ledger key)")
    for field, value, why in (("step", -1, "expected a non-negative integer, got -1"),
                              ("step", True, "expected a non-negative integer, got True"),
                              ("seq", "3", "expected a non-negative integer, got '3'"),
                              ("sha256", "4" * 63, "expected a SHA-256 (64 lowercase hex "
                                                    f"digits), got '{'4' * 63}'"),
                              ("sha256", None, "expected a SHA-256 (64 lowercase hex digits), "
                                               "got None")):
        doc = json.loads(head_record(None, 40, sha("4"), 3))
        doc[field] = value
        assert read_head(json.dumps(doc).encode(), HEAD, None) == (
            None, f"{HEAD} is malformed: {why}")
    doc = json.loads(head_record(None, 40, sha("4"), 3))
    doc["step"] = 0
    assert read_head(json.dumps(doc).encode(), HEAD, None) == (Head(0, sha("4"), 3), None)


def test_a_gc_record_lists_each_removed_step_with_its_link_in_step_order() -> None:
    removed = [(20, sha("2"), manifest(20, 1, (10, sha("1")))),
               (10, sha("1"), manifest(10, 0, None)),
               (15, sha("5"), None)]  # a manifest that does not parse: its hash only
    data = gc_record(None, removed, [40, 30])
    assert json.loads(data) == {
        "format": "datalane.gc-record/v1", "kept": [30, 40],
        "removed": [{"step": 10, "sha256": sha("1"), "seq": 0, "previous": None},
                    {"step": 15, "sha256": sha("5"), "seq": None, "previous": None},
                    {"step": 20, "sha256": sha("2"), "seq": 1,
                     "previous": {"step": 10, "sha256": sha("1")}}]}
    assert data.endswith(b"}\n") and b" " not in data
    assert read_gc_record(data, GC, None) == ([
        Removed(10, sha("1"), 0, None, GC), Removed(15, sha("5"), None, None, GC),
        Removed(20, sha("2"), 1, (10, sha("1")), GC)], None)
    assert read_gc_record(gc_record(KEY, removed, [30]), GC, KEY)[1] is None


def test_a_gc_record_a_reader_cannot_use_says_why() -> None:
    assert read_gc_record(b"\xff", GC, None) == ([], f"{GC} is not valid JSON (1 bytes)")
    assert read_gc_record(b'{"format": "datalane.gc-record/v1", "kept": []}', GC, None) == (
        [], f"{GC} is not a datalane.gc-record/v1 document")
    unsigned = gc_record(None, [(10, sha("1"), None)], [20])
    assert read_gc_record(unsigned, GC, KEY) == (
        [], f"{GC} is not signed (written without a ledger key)")
    doc = json.loads(unsigned)
    del doc["removed"][0]["previous"]
    assert read_gc_record(json.dumps(doc).encode(), GC, None) == (
        [], f"{GC} is malformed: KeyError('previous')")
    doc = json.loads(unsigned)
    doc["removed"][0]["seq"] = -2
    assert read_gc_record(json.dumps(doc).encode(), GC, None) == (
        [], f"{GC} is malformed: ValueError('expected a non-negative integer, got -2')")
    doc["removed"] = 5
    assert read_gc_record(json.dumps(doc).encode(), GC, None) == (
        [], f"{GC} is malformed: TypeError(\"'int' object is not iterable\")")


# ------------------------------------------------------------------------------ the head


def test_the_head_present_as_recorded_is_a_line_naming_later_commits() -> None:
    steps = store((10, 0, None), (20, 1, 10), (30, 2, 20), (40, 3, 30))
    verdict = audit_history(steps, History(HEAD, head=Head(20, sha("2"), 1),
                                           removed={}))
    assert verdict.problems == ()
    assert verdict.lines[0] == (f"head: step 20, as {HEAD} records; steps 30, 40 were committed "
                                f"after it was last written (a commit interrupted before it)")
    verdict = audit_history(steps, History(HEAD, head=Head(40, sha("4"), 3)))
    assert verdict.lines == (f"head: step 40, as {HEAD} records",
                             "history: complete back to the first checkpoint")


def test_a_head_naming_a_step_that_is_gone_or_replaced_is_a_problem() -> None:
    steps = store((10, 0, None), (20, 1, 10))
    verdict = audit_history(steps, History(HEAD, head=Head(30, sha("3"), 2)))
    assert verdict.problems == (
        f"the newest checkpoints were removed: {HEAD} names step 30 (manifest "
        f"{'3' * 16}...), which is not in the store; the newest present is step 20",)
    verdict = audit_history({}, History(HEAD, head=Head(30, sha("3"), 2)))
    assert verdict.problems == (
        f"the newest checkpoints were removed: {HEAD} names step 30 (manifest "
        f"{'3' * 16}...), which is not in the store; no committed checkpoint is left",)
    assert verdict.lines == ()
    verdict = audit_history(steps, History(HEAD, head=Head(20, sha("9"), 1)))
    assert verdict.problems == (
        f"{HEAD} names step 20 with manifest {'9' * 16}..., but that manifest hashes to "
        f"{'2' * 16}... (replaced since)",)
    assert verdict.lines == ("history: complete back to the first checkpoint",)


def test_a_head_json_that_cannot_be_used_or_is_missing() -> None:
    steps = store((10, 0, None), (20, 1, 10))
    verdict = audit_history(steps, History(HEAD, head_problem=f"{HEAD} is not signed"))
    assert verdict.problems == (
        f"the newest checkpoints cannot be proven present: {HEAD} is not signed",)
    assert verdict.lines == ("history: complete back to the first checkpoint",)
    verdict = audit_history(steps, History(HEAD))
    assert verdict.problems == (
        f"{HEAD} is missing, although this store's checkpoints were committed by a datalane "
        f"that writes it: it was deleted, and whether the newest checkpoints were too cannot "
        f"be proven",)
    old = store((10, None, None), (20, None, 10))
    verdict = audit_history(old, History(HEAD))
    assert verdict.problems == ()
    assert verdict.lines[0] == (
        f"head: no {HEAD} (checkpoints of a datalane before it was kept): whether the newest "
        f"checkpoints were removed cannot be proven; compare step 20 with a record kept "
        f"elsewhere")
    # only the newest manifest counts (the first one of a datalane that keeps HEAD.json)
    mixed = store((10, None, None), (20, 0, 10))
    assert audit_history(mixed, History(HEAD)).problems[0].startswith(f"{HEAD} is missing")
    assert audit_history({}, History(HEAD)) == audit_history({}, History(HEAD, removed={}))
    assert audit_history({}, History(HEAD)).lines == ()


# ------------------------------------------------------------------------------ the tail


def test_the_tail_is_followed_back_through_the_gc_records() -> None:
    steps = store((30, 2, 20), (40, 3, 30))
    removed = {10: Removed(10, sha("1"), 0, None, GC),
               20: Removed(20, sha("2"), 1, (10, sha("1")), GC)}
    verdict = audit_history(steps, History(HEAD, head=Head(40, sha("4"), 3), removed=removed))
    assert verdict.problems == ()
    assert verdict.lines[1] == (
        f"history: complete back to the first checkpoint; 2 checkpoints before step 30 were "
        f"garbage-collected (steps 10, 20; {GC})")
    # a gc record that lists a step at the wrong place of the chain
    removed[20] = Removed(20, sha("2"), 5, (10, sha("1")), GC)
    verdict = audit_history(steps, History(HEAD, head=Head(40, sha("4"), 3), removed=removed))
    assert verdict.problems == (
        f"{GC} lists step 20 at place 5 of the hash chain, but the checkpoint after it is at "
        f"place 2",
        f"{GC} lists step 10 at place 0 of the hash chain, but the checkpoint after it is at "
        f"place 5")


def test_a_gc_record_of_another_manifest_does_not_cover_the_link() -> None:
    steps = store((30, 2, 20), (40, 3, 30))
    removed = {20: Removed(20, sha("9"), 1, (10, sha("1")), GC)}  # not the bytes 30 links to
    verdict = audit_history(steps, History(HEAD, head=Head(40, sha("4"), 3), removed=removed))
    assert verdict.problems == (
        "the oldest checkpoints were removed: step 30 links to step 20, which is not in the "
        "store, and no gc record says it was garbage-collected (2 checkpoints came before "
        "step 30)",)


def test_a_cut_below_a_gc_record_names_the_oldest_step_it_lists() -> None:
    steps = store((30, 2, 20), (40, 3, 30))
    removed = {20: Removed(20, sha("2"), 1, (10, sha("1")), GC)}  # step 10 gone unrecorded
    verdict = audit_history(steps, History(HEAD, head=Head(40, sha("4"), 3), removed=removed))
    assert verdict.problems == (
        "the oldest checkpoints were removed: step 20 links to step 10, which is not in the "
        "store, and no gc record says it was garbage-collected (1 checkpoints came before "
        "step 20)",)


def test_a_tail_that_cannot_be_proven_is_a_line_not_a_problem() -> None:
    # the first counted manifest links to an older datalane's step, removed by hand
    steps = store((20, 0, 10), (30, 1, 20))
    verdict = audit_history(steps, History(HEAD, head=Head(30, sha("3"), 1)))
    assert verdict.problems == ()
    assert verdict.lines[1] == (
        "history: step 20 links to step 10, which is not in the store and was removed before "
        "gc records were kept (or by hand): what came before step 20 cannot be proven")
    # an older datalane's manifests collected by this one: their seq is null
    old = store((30, None, 20), (40, None, 30))
    removed = {20: Removed(20, sha("2"), None, (10, sha("1")), GC)}
    verdict = audit_history(old, History(HEAD, head=Head(40, sha("4"), None), removed=removed))
    assert verdict.problems == ()
    assert verdict.lines[1] == (
        "history: step 20 links to step 10, which is not in the store and was removed before "
        "gc records were kept (or by hand): what came before step 20 cannot be proven; 1 "
        f"checkpoints before step 30 were garbage-collected (steps 20; {GC})")
    unreadable = {30: (sha("3"), None), 40: (sha("4"), manifest(40, 3, (30, sha("3"))))}
    verdict = audit_history(unreadable, History(HEAD, head=Head(40, sha("4"), 3)))
    assert verdict.lines[1] == ("history: the oldest manifest, of step 30, cannot be read; what "
                                "came before it cannot be proven")


def test_an_interrupted_collection_is_a_note_and_many_steps_are_abridged() -> None:
    steps = store((80, 7, 70), (90, 8, 80))
    removed = {s: Removed(s, sha(str(s)[0]), s // 10 - 1, None if s == 10 else
                          (s - 10, sha(str(s - 10)[0])), GC) for s in range(10, 90, 10)}
    verdict = audit_history(steps, History(HEAD, head=Head(90, sha("9"), 8), removed=removed,
                                           problems=["gc record x is malformed"]))
    assert verdict.problems == ("gc record x is malformed",)
    assert verdict.lines == (
        f"head: step 90, as {HEAD} records",
        f"history: complete back to the first checkpoint; 7 checkpoints before step 80 were "
        f"garbage-collected (steps 10, 20, 30, ..., 70; {GC})",
        f"note: {GC} lists step 80 as removed, but it is still in the store (a garbage "
        f"collection was interrupted)")
    six = store((70, 6, 60))
    verdict = audit_history(six, History(HEAD, head=Head(70, sha("7"), 6), removed=removed))
    assert verdict.lines[1] == (
        f"history: complete back to the first checkpoint; 6 checkpoints before step 70 were "
        f"garbage-collected (steps 10, 20, 30, 40, 50, 60; {GC})")


def test_a_counted_gc_record_below_uncounted_manifests_makes_a_cut_a_problem() -> None:
    """The oldest manifest present carries no ``seq`` (an older datalane wrote it), but the gc
    record of the step it links to puts that step at place 1 of the chain: one checkpoint came
    before it, and its removal without a record is a problem, not a line."""
    old = store((30, None, 20), (40, None, 30))
    removed = {20: Removed(20, sha("2"), 1, (10, sha("1")), GC)}
    verdict = audit_history(old, History(HEAD, head=Head(40, sha("4"), None), removed=removed))
    assert verdict.problems == (
        "the oldest checkpoints were removed: step 20 links to step 10, which is not in the "
        "store, and no gc record says it was garbage-collected (1 checkpoints came before "
        "step 20)",)
    assert verdict.lines == (f"head: step 40, as {HEAD} records",)
