"""``DocStream.next_run`` on a real stream: where a run stops, and what it accounts.

A run takes its first kept document, then each next one while the tokens taken so far are
fewer than ``need`` and ``allow(taken)`` holds, up to the end of the current map result. The
stream finds the end of a stretch of kept documents by bisecting the result's offsets (and
``allow`` by a binary search), so the edges are the point: a document that would start
exactly at ``need`` tokens is not taken, one that starts one token short of it is, and
``allow`` refusing a later document ends the run there. A record set aside inside a run (an
id outside the vocabulary, under ``skip``) is counted and adds nothing.

The source is a Megatron dataset written here: document ``k`` holds ``LENGTHS[k]`` copies of
the id ``10 + k``, so a run's tokens name its documents. The shuffled order is read back with
``next_doc`` on a second stream; the expected runs follow from the rule above by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from datalane.corpus import tokenizer_path
from datalane.engine.docstream import DocStream
from datalane.engine.formats.megatron import write_dataset
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.spec.state import Counters

LENGTHS = [3, 5, 4, 6, 2, 7, 5, 3, 8, 4]
BAD = 5  # document 5 holds an id outside the 1,024-id vocabulary


@pytest.fixture
def pool() -> Iterator[TaskPool]:
    with TaskPool(2) as p:
        yield p


def streams(tmp_path: Path, pool: TaskPool) -> tuple[DocStream, DocStream]:
    docs = [np.full(n, 10 + k, dtype=np.int64) for k, n in enumerate(LENGTHS)]
    docs[BAD][1] = 5000
    write_dataset(str(tmp_path / "d"), docs, "uint16")
    recipe = load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 16, "seed": 3,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [{"name": "ids", "uris": [str(tmp_path / "d.idx")], "epochs": 1,
                     "tokens": {}}],
        "shuffle": {"block_size": 64}, "bad_records": "skip"})
    plan = Plan.build(recipe)
    stage = plan.map_stages()[0]
    knobs = Knobs(workers=2, prefetch=2, task_docs=64)

    def make() -> DocStream:
        return DocStream(plan.sources[0], 0, stage, pool, knobs, 64, "skip", Counters())

    return make(), make()


def test_runs_stop_exactly_at_need_and_where_allow_refuses(tmp_path: Path, pool) -> None:
    runner, single = streams(tmp_path, pool)
    order = []  # the kept documents in the stream's order, as document numbers
    while (doc := single.next_doc()) is not None:
        order.append(int(doc.columns[0][0]) - 10)
    assert sorted(order) == [k for k in range(len(LENGTHS)) if k != BAD]
    lengths = [LENGTHS[k] for k in order]

    def check(run, first: int, docs: int, what: str) -> None:
        want = order[first:first + docs]
        got = run.columns[0].tolist()
        assert got == [10 + k for k in want for _ in range(LENGTHS[k])], (
            f"{what}: the run must be documents {want} in order, got ids {got}")
        # (a record set aside inside the run repeats an offset: it adds no token)
        assert run.docs == docs and list(dict.fromkeys(run.offsets)) == [
            sum(lengths[first:first + i]) for i in range(docs + 1)], (
            f"{what}: {run.docs} documents with offsets {list(run.offsets)}")

    # the first two documents fill need exactly: the third would start at need tokens
    need = lengths[0] + lengths[1]
    check(runner.next_run(need), 0, 2, f"need {need} = the first two documents")
    # allow refuses once 2 documents are taken (of plenty asked for): a run of 2
    limit = lengths[2] + lengths[3]
    check(runner.next_run(1000, lambda taken: taken < limit), 2, 2,
          f"allow(taken < {limit})")
    assert not runner._counters.skipped
    # the fourth document starts one token short of need: taken, and the run ends after it;
    # (seed 3 shuffles the bad record between the run's third and fourth documents)
    need = sum(lengths[4:7]) + 1
    check(runner.next_run(need), 4, 4, f"need {need} = three documents and a token")
    assert dict(runner._counters.skipped) == {"token_out_of_range": 1}, (
        f"the record set aside inside the run is counted: {dict(runner._counters.skipped)}")
    check(runner.next_run(1000), 8, len(order) - 8, "the rest")
    assert runner.next_run(1000) is None
    counters = runner._counters
    assert (counters.docs, dict(counters.skipped)) == (len(LENGTHS),
                                                        {"token_out_of_range": 1}), (
        f"every record is counted once, the bad one as skipped: {counters.docs} "
        f"{dict(counters.skipped)}")
    assert runner.cursor == single.cursor


def test_allow_is_measured_from_the_runs_own_first_token(tmp_path: Path, pool) -> None:
    """A run that starts inside a map result (an earlier run took the documents before it)
    asks ``allow`` about its own tokens only: with the first document taken alone, a run
    allowed while fewer than ``l1 + l2 + l3 + l4`` tokens are taken is documents 1 to 4, found
    by the binary search over the stretch of kept documents 1 to 6."""
    runner, single = streams(tmp_path, pool)
    order = []
    while (doc := single.next_doc()) is not None:
        order.append(int(doc.columns[0][0]) - 10)
    lengths = [LENGTHS[k] for k in order]
    first = runner.next_run(1)
    assert first is not None and first.docs == 1
    limit = sum(lengths[1:5])
    asked: list[int] = []

    def allow(taken: int) -> bool:
        asked.append(taken)
        return taken < limit

    run = runner.next_run(1000, allow)
    assert run is not None and run.columns[0].tolist() == [
        10 + k for k in order[1:5] for _ in range(LENGTHS[k])], (
        f"allow(taken < {limit}) must take documents {order[1:5]}, got ids "
        f"{run.columns[0].tolist()} (allow asked about {asked})")
