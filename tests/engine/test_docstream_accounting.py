"""A document stream accounts every record the same way in runs and one at a time.

``DocStream.next_run`` takes the kept records of a stretch in bulk (a count and one cursor for
them), but a block's last record moves the cursor to the next block (or epoch) and must be
accounted one by one; a run also stops at the end of its map task and takes the records set
aside on its way. A slip there (the bulk stretch reaching the block's last record, a run
crossing its task) gives the same documents and a wrong cursor or counter: a restore from it
repeats or loses a block.

The source is a Megatron dataset written here whose documents name themselves: document
``k`` holds ``length(k)`` copies of the id ``10 + k``; those of one token are set aside by
``min_tokens: 2`` and a few hold an id outside the vocabulary (set aside under ``skip``).
The expected record order is derived by hand from the documented rule (docs/architecture.md,
One lane): chunks of 7 documents dealt in the epoch's chunk order, blocks of 10 records each
permuted by its ``(seed, source, lane, epoch, block)`` key, map tasks of 4 records from each
block's start. Every record's cursor and counters after it follow; a run's extent follows from
its rule. A stream consumed by ``next_run`` (various ``need`` and ``allow``) and a fresh one
consumed by ``next_doc`` are each checked against that after every call, and so against each
other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from datalane.corpus import tokenizer_path
from datalane.engine.docstream import DocStream
from datalane.engine.formats.megatron import write_dataset
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.engine.rng import permutation
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.spec.state import Counters, SourceCursor

DOCS = 43  # chunks of 7 documents: 6 full and one of 1; an epoch's last block holds 3 records
ROWS, BLOCK, EPOCHS, SEED = 7, 10, 2, 5
TASK = 4  # records per map task (task_docs below 16: every task has that many)
BAD = {6, 19, 20, 33}  # hold the id 5000 (the vocabulary has 1,024): token_out_of_range


def length(k: int) -> int:
    return 1 + (k * 5) % 7  # 1 .. 7 tokens; every 7th document (k % 7 == 0) has 1


def reason(k: int) -> str | None:
    if k in BAD:
        return "token_out_of_range"
    return "min_tokens" if length(k) < 2 else None


@dataclass(frozen=True)
class Step:
    """One record in the stream's order, and the stream's state once it is consumed."""

    doc: int  # the document number (its position in the file)
    reason: str | None  # None: kept
    cursor: SourceCursor
    docs: int  # counters.docs
    skipped: dict[str, int]
    task_end: bool  # the last record of its map task


def model(plan: Plan, task: int = TASK) -> list[Step]:
    """Every record of the lane's two epochs in order, by the documented rule alone (map
    tasks of ``task`` records from each block's start)."""
    source = plan.sources[0]
    steps: list[Step] = []
    skipped: dict[str, int] = {}
    for epoch in range(EPOCHS):
        records = [(ordinal, pos) for ordinal, chunk in enumerate(source.lane_chunks(0, epoch))
                   for pos in range(chunk.start, chunk.stop)]
        assert len(records) == DOCS
        blocks = [records[i:i + BLOCK] for i in range(0, DOCS, BLOCK)]
        for b, block in enumerate(blocks):
            after = (SourceCursor(epoch, b + 1, *blocks[b + 1][0], 0) if b + 1 < len(blocks)
                     else SourceCursor(epoch + 1, 0, 0, -1, 0))
            for offset, i in enumerate(permutation(len(block), SEED, "block", "ids", 0, epoch,
                                                   b)):
                doc = block[i][1]
                why = reason(doc)
                if why is not None:
                    skipped = {**skipped, why: skipped.get(why, 0) + 1}
                last = offset + 1 == len(block)
                steps.append(Step(doc, why, after if last else SourceCursor(
                    epoch, b, *block[0], offset + 1), len(steps) + 1, skipped,
                    last or (offset + 1) % task == 0))
    return steps


def expected_run(steps: list[Step], at: int, need: int,
                 allow: Callable[[int], bool] | None) -> tuple[list[int], int]:
    """The steps of the documents a run from step ``at`` takes, and the step after the last
    record it accounts (the rule of ``next_run``'s docstring, record by record)."""
    while steps[at].reason is not None:  # records set aside before the first document
        at += 1
    taken, took = length(steps[at].doc), [at]
    at += 1
    while taken < need and (allow is None or allow(taken)) and not steps[at - 1].task_end:
        if steps[at].reason is not None:  # set aside on the way: accounted, nothing taken
            at += 1
            continue
        taken += length(steps[at].doc)
        took.append(at)
        at += 1
    return took, at


def tokens(doc: int) -> list[int]:
    return [10 + doc] * length(doc)


@pytest.fixture
def pool() -> Iterator[TaskPool]:
    with TaskPool(2) as p:
        yield p


def make_plan(tmp_path: Path) -> Plan:
    docs = [np.array(tokens(k), dtype=np.int64) for k in range(DOCS)]
    for k in BAD:
        docs[k][-1] = 5000
    write_dataset(str(tmp_path / "d"), docs, "uint16")
    return Plan.build(load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 16, "seed": SEED,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [{"name": "ids", "uris": [str(tmp_path / "d.idx")], "epochs": EPOCHS,
                     "chunk_rows": ROWS, "tokens": {}}],
        "filters": {"min_tokens": 2}, "shuffle": {"block_size": BLOCK},
        "bad_records": "skip"}))


def state(stream: DocStream) -> tuple[SourceCursor, int, dict[str, int]]:
    return stream.cursor, stream._counters.docs, dict(stream._counters.skipped)


def test_the_model_is_the_documented_order(tmp_path: Path) -> None:
    """The hand-built order holds what the data says: every record once per epoch, a task
    end every 4 records and at each block's end (10, 10, 10, 10, 3 records), the epoch's
    last cursor the next epoch's start."""
    steps = model(make_plan(tmp_path))
    assert len(steps) == EPOCHS * DOCS
    for e in range(EPOCHS):
        assert sorted(s.doc for s in steps[e * DOCS:(e + 1) * DOCS]) == list(range(DOCS))
    assert [i % DOCS for i, s in enumerate(steps[:DOCS]) if s.task_end] == [
        3, 7, 9, 13, 17, 19, 23, 27, 29, 33, 37, 39, 42]
    assert steps[DOCS - 1].cursor == SourceCursor(1, 0, 0, -1, 0)
    assert steps[-1].cursor == SourceCursor(2, 0, 0, -1, 0)
    assert steps[-1].skipped == {"min_tokens": 14, "token_out_of_range": 8}


def test_next_doc_accounts_each_record_as_the_model_says(tmp_path: Path, pool) -> None:
    plan = make_plan(tmp_path)
    steps = model(plan)
    stream = DocStream(plan.sources[0], 0, plan.map_stages()[0], pool,
                       Knobs(workers=2, prefetch=2, task_docs=TASK), BLOCK, "skip", Counters())
    kept = [i for i, s in enumerate(steps) if s.reason is None]
    for n, i in enumerate(kept):
        doc = stream.next_doc()
        assert doc is not None and doc.columns[0].tolist() == tokens(steps[i].doc), (
            f"kept document {n} must be document {steps[i].doc}")
        assert doc.ref == (0, steps[i].doc)
        s = steps[i]
        assert state(stream) == (s.cursor, s.docs, s.skipped), (
            f"after document {steps[i].doc} (record {i} of the stream)")
    assert stream.next_doc() is None
    assert state(stream) == (SourceCursor(2, 0, 0, -1, 0), EPOCHS * DOCS, steps[-1].skipped)
    stream.close()


# (need, allow limit) in words: "two" is the tokens of the next two kept documents, "all" more
# than the source holds. A run of one document, one that fills need exactly (the next
# document would start at need), one a token short and one a token over, one up to its task's
# end, and runs that allow cuts before need, after one document or several
NEEDS: list[tuple[str, str | None]] = [
    ("1", None), ("all", "four+1"), ("two", None), ("all", "three+1"), ("two+1", None),
    ("all", "five"), ("two-1", None), ("all", None), ("all", "1"), ("1", None),
    ("all", "two"), ("three", None), ("four-1", None), ("all", "two+1"), ("five+1", None)]


@pytest.mark.parametrize("task", [TASK, BLOCK])
def test_runs_account_each_record_as_next_doc_does(tmp_path: Path, pool, task: int) -> None:
    """Tasks of 4 records end runs often and inside blocks; tasks of a whole block give
    long stretches of kept documents (where ``allow`` is searched)."""
    plan = make_plan(tmp_path)
    steps = model(plan, task)
    knobs = Knobs(workers=2, prefetch=2, task_docs=task)

    def make(cursor: SourceCursor | None = None, counters: Counters | None = None) -> DocStream:
        return DocStream(plan.sources[0], 0, plan.map_stages()[0], pool, knobs, BLOCK, "skip",
                         counters or Counters(), cursor)

    runner, single = make(), make()
    kept = [i for i, s in enumerate(steps) if s.reason is None]

    def ahead(at: int, n: int) -> int:
        """Tokens of the next ``n`` kept documents from step ``at`` (tasks aside)."""
        return sum(length(steps[i].doc) for i in [i for i in kept if i >= at][:n])

    def amount(what: str, at: int) -> int:
        words = {"1": 1, "two": ahead(at, 2), "three": ahead(at, 3), "four": ahead(at, 4),
                 "five": ahead(at, 5), "all": 10 ** 6}
        base, _, delta = what.replace("-", "+-").partition("+")
        return words[base] + int(delta or 0)

    at, calls, ends = 0, 0, 0
    while True:
        spec_need, spec_allow = NEEDS[calls % len(NEEDS)]
        need = amount(spec_need, at)
        limit = None if spec_allow is None else amount(spec_allow, at)
        allow = None if limit is None else (lambda taken, limit=limit: taken < limit)
        run = runner.next_run(need, allow)
        what = f"call {calls}: next_run({need}, allow={limit}) from record {at}"
        if all(s.reason is not None for s in steps[at:]):
            assert run is None, f"{what}: the stream holds no kept document any more"
            break
        took, at = expected_run(steps, at, need, allow)
        assert run is not None, f"{what}: the stream ended early"
        docs = [steps[i].doc for i in took]
        assert run.columns[0].tolist() == [t for d in docs for t in tokens(d)], (
            f"{what}: documents {docs}, got ids {run.columns[0].tolist()}")
        assert run.docs == len(took) and run.last_ref == (0, docs[-1]), (
            f"{what}: {len(took)} documents ending with {docs[-1]}, got {run.docs} "
            f"ending with {run.last_ref}")
        assert list(dict.fromkeys(run.offsets)) == [
            sum(length(d) for d in docs[:k]) for k in range(len(docs) + 1)], what
        s = steps[at - 1]
        assert state(runner) == (s.cursor, s.docs, s.skipped), (
            f"{what}: after the run, the stream is past record {at - 1} (document {s.doc})")
        ends += steps[took[-1]].cursor.offset == 0  # a run ending at its block's last record
        # the same documents one at a time from a fresh stream: the same documents, and the
        # same state once the records set aside at the run's end are accounted there too
        for d in docs:
            doc = single.next_doc()
            assert doc is not None and doc.columns[0].tolist() == tokens(d), what
        last = steps[took[-1]]
        assert state(single) == (last.cursor, last.docs, last.skipped), what
        if at - 1 == took[-1]:
            assert state(single) == state(runner), what
        # restored from the state after the run, a stream goes on with the next document
        cursor, n, skipped = state(runner)
        restored = make(cursor, Counters(docs=n, skipped=skipped))
        nxt = next((i for i in kept if i >= at), None)
        doc = restored.next_doc()
        if nxt is None:
            assert doc is None, f"{what}: restored at {cursor}, the stream must be at its end"
        else:
            assert doc is not None and doc.ref == (0, steps[nxt].doc), (
                f"{what}: restored at {cursor}, the next document must be {steps[nxt].doc}, "
                f"got {doc and doc.ref}")
            s = steps[nxt]
            assert state(restored) == (s.cursor, s.docs, s.skipped), what
        restored.close()
        calls += 1
    assert single.next_doc() is None
    assert state(runner) == state(single) == (SourceCursor(2, 0, 0, -1, 0), EPOCHS * DOCS,
                                              steps[-1].skipped)
    # the point of the test: runs ended at a block's last record, in several blocks
    assert calls > 20 and ends >= 3, f"{calls} runs, {ends} ending at a block's end"
    runner.close()
    single.close()
