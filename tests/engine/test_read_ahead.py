"""A document stream reads its next shuffle block while the tasks in flight are consumed.

Reading a block (storage latency, decompression) used to happen on the lane's ordered thread
as soon as the block before it was all submitted to the map workers: the thread stopped
packing until the read returned, although the map tasks in flight still held documents. Now
the read runs on a reader thread, started when the block before it is all submitted, and the
ordered thread waits for it only when it has nothing else to consume. The blocks, and so the
documents, are the same.

Here the read of the second block is held (an Event) while the stream's consumer takes the
whole first block: it must get every one of its documents, in the order a stream whose reads
are not held gives, and only then wait; let go, the stream goes on to the end identically.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

BLOCK = 64


@pytest.fixture
def pool() -> Iterator[TaskPool]:
    with TaskPool(2) as p:
        yield p


def make_streams(tmp_path: Path, pool: TaskPool) -> Any:
    rng = np.random.default_rng(2)
    docs = [rng.integers(3, 1024, size=int(rng.integers(5, 60))) for _ in range(3 * BLOCK)]
    write_dataset(str(tmp_path / "d"), docs, "uint16")
    plan = Plan.build(load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 16, "seed": 3,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [{"name": "ids", "uris": [str(tmp_path / "d.idx")], "epochs": 1,
                     "tokens": {}}],
        "shuffle": {"block_size": BLOCK}}))
    stage = plan.map_stages()[0]
    knobs = Knobs(workers=2, prefetch=4, task_docs=16)

    def make() -> DocStream:
        return DocStream(plan.sources[0], 0, stage, pool, knobs, BLOCK, "skip", Counters())

    return make


def ids(stream: DocStream, n: int | None = None) -> list[bytes]:
    out = []
    while n is None or len(out) < n:
        doc = stream.next_doc()
        if doc is None:
            break
        out.append(doc.columns[0].tobytes())
    return out


def test_a_block_is_consumed_while_the_next_one_is_read(tmp_path: Path, pool) -> None:
    make = make_streams(tmp_path, pool)
    want = ids(make())
    assert len(want) == 3 * BLOCK

    stream = make()
    gate = threading.Event()
    second = threading.Event()  # set when the second block's read has started
    readers: list[str] = []
    read = stream._read_block

    def held() -> Any:
        readers.append(threading.current_thread().name)
        if len(readers) == 2:  # the second block's read waits for the gate
            second.set()
            gate.wait()
        return read()

    stream._read_block = held  # type: ignore[method-assign]
    got: list[bytes] = []
    consumer = threading.Thread(target=lambda: got.extend(ids(stream, BLOCK)), daemon=True)
    try:
        consumer.start()
        consumer.join(timeout=20)
        assert not consumer.is_alive() and got == want[:BLOCK], (
            f"with the next block's read held, the consumer got {len(got)} of the first "
            f"block's {BLOCK} documents: it must not wait for a read while documents of the "
            f"tasks in flight are left")
        # The next read starts on a reader thread when the first block is all submitted, not
        # when the consumer asks: under load that thread may not have run yet when the
        # consumer is done, so wait for it (it must start without the consumer asking).
        assert second.wait(timeout=20), f"the second block was never read: {readers}"
        assert len(readers) == 2 and all(r.startswith("datalane-read") for r in readers), (
            f"blocks are read on the reader threads, the next while the tasks in flight are "
            f"consumed: {readers}")
    finally:
        gate.set()
    assert got + ids(stream) == want
    stream.close()


# forks on purpose; Lance (imported by other tests of the run) warns at every fork
@pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning")
def test_a_forked_child_reads_with_threads_of_its_own(tmp_path: Path, pool) -> None:
    import multiprocessing

    make = make_streams(tmp_path, pool)
    want = ids(make())  # the parent's reader threads exist now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child() -> None:
        with TaskPool(2) as own:  # (the parent's map workers are not in the child either)
            queue.put(ids(make_streams(tmp_path, own)()))

    proc = ctx.Process(target=child)
    proc.start()
    try:
        got = queue.get(timeout=60)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    assert got == want, "a forked child must read the same documents with its own threads"
