"""One lane's documents from one source: read, block shuffle, map tasks, ordered results.

The lane's records of a source, epoch by epoch, are cut into blocks of ``K`` records; each block
is permuted by a key of ``(seed, source, lane, epoch, block)`` (docs/architecture.md, One lane)
and cut into map tasks that run on the shared worker pool. Results are consumed strictly in
submission order, so counters and the ``fail`` policy see records in the logical order.

The stream's resume point is a :class:`~datalane.spec.state.SourceCursor`: the epoch and block,
where the block starts (chunk ordinal and record position), and how many of its shuffled
records were consumed. Restoring reads that one block again and maps only the records after
the offset, so restore cost is bounded by a block, whatever the position in the stream.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from datalane.engine.chunks import Chunk, RecordReader
from datalane.engine.documents.base import Doc, Run
from datalane.engine.formats import format_for
from datalane.engine.mapstage import ALWAYS_FAIL, MapResult, MapStage, Record
from datalane.engine.plan import SourcePlan
from datalane.engine.pool import TaskPool
from datalane.engine.priority import lower_this_thread
from datalane.engine.rng import permutation
from datalane.engine.tokenrecords import shuffled
from datalane.spec.errors import DataError
from datalane.spec.knobs import Knobs
from datalane.spec.state import Counters, SourceCursor

__all__ = ["DocStream"]

_FIRST_TASK_DOCS = 16
_READ_THREADS = 8  # block reads in flight at once, over every stream of the process
_MIN_FOR_FRACTION = 1000  # records a lane reads before bad_records_max_fraction applies
_PROBE = 100  # a fresh lane whose first records of a source are all malformed stops at once


@functools.cache
def _reads() -> ThreadPoolExecutor:
    """The process's reader threads (block reads are I/O and decompression: few threads serve
    every lane; created on first use), below the threads handing data over
    (:mod:`datalane.engine.priority`)."""
    return ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="datalane-read",
                              initializer=lower_this_thread)


# a forked child (a DataLoader worker) has none of the parent's threads: it makes its own pool
os.register_at_fork(after_in_child=_reads.cache_clear)


@dataclass
class _Block:
    epoch: int
    index: int
    chunk: int  # ordinal, in the lane's chunk list of the epoch, of the first record's chunk
    pos: int  # position of the first record (-1: the start of the chunk)
    records: Sequence[Record]  # in shuffled order
    after: SourceCursor  # where the next block starts
    submitted: int = 0


@dataclass
class _Task:
    block: _Block
    start: int  # offset of the slice in the shuffled block
    docs: int
    future: Future[MapResult]


class DocStream:
    """Documents of one (lane, source) in final order, with a resumable cursor."""

    def __init__(self, source: SourcePlan, lane: int, stage: MapStage, pool: TaskPool,
                 knobs: Knobs, block_size: int, policy: str, counters: Counters,
                 cursor: SourceCursor | None = None, max_bad: float | None = None) -> None:
        self.source = source
        self.lane = lane
        self._stage = stage
        self._pool = pool
        self._knobs = knobs
        self._block_size = block_size
        self._policy = policy
        self._max_bad = max_bad
        self._counters = counters
        self._reader = RecordReader(source.files, source.source.field, source.source)
        self._formats = [format_for(f.format, source.source) for f in source.files]
        cur = cursor or SourceCursor(0, 0, 0, -1, 0)
        # a fresh lane's first records tell at once whether the source holds documents at all
        # (a misnamed field would otherwise give 0 tokens under `skip` without a word)
        self._probe: list[str] | None = [] if cur == SourceCursor(0, 0, 0, -1, 0) else None
        # reader side (ahead of the consumer)
        self._r_epoch = cur.epoch
        self._r_block = cur.block
        self._r_chunk = cur.chunk
        self._r_iter: Iterator[tuple[int, Any]] | None = None
        self._r_start: int | None = cur.pos if cur.pos >= 0 else None
        self._r_peek: tuple[int, Record] | None = None
        self._r_chunks: list[Chunk] = []
        self._r_chunks_epoch = -1
        self._skip_first = cur.offset  # records of the first block already consumed
        self._block: _Block | None = None
        self._tasks: deque[_Task] = deque()
        self._ahead: Future[_Block | None] | None = None  # the next block's read, in flight
        # consumer side
        self._cur: MapResult | None = None
        self._cur_task: _Task | None = None
        self._i = 0
        self._cursor: SourceCursor | None = cur  # None: ``_cursor_at`` holds it
        self._cursor_at: tuple[_Block, int] | None = None
        self._depth = 1  # tasks allowed in flight; grows to knobs.prefetch (slow start)
        self._queued_docs = 0  # documents of the tasks in flight
        # a kind that attaches images: the most bytes one document's hold, and the knob
        # bounding what the stream's map results and tasks in flight hold (None: not weighed)
        self._doc_bytes = stage.most_attached_bytes
        self._image_bytes = knobs.image_bytes
        # A repeated source stops with an error only when no document can ever come: the lane
        # read every chunk of the source without a record (or without a kept document). A
        # count of epochs alone would also stop a lane that merely drew barren chunks many
        # epochs in a row while other chunks hold documents. An epoch entered mid-way by a
        # restore may have kept documents before the restore: it never counts as dry.
        self._kept_this_epoch = cur.block > 0 or cur.offset > 0
        self._dry_epochs = 0
        self._dry_chunks: set[Chunk] = set()  # chunks read, none kept, since the last kept
        self._no_records: set[Chunk] = set()  # chunks found to hold no record at all

    # -- reading -----------------------------------------------------------------------------
    def _exhausted_epoch(self, epoch: int) -> bool:
        epochs = self.source.source.epochs
        return epochs is not None and epoch >= epochs

    def _epoch_chunks(self) -> list[Chunk]:
        """The chunks the lane reads in the reader's epoch, in reading order."""
        if self._r_chunks_epoch != self._r_epoch:
            self._r_chunks = self.source.lane_chunks(self.lane, self._r_epoch)
            self._r_chunks_epoch = self._r_epoch
        return self._r_chunks

    def _next_record(self) -> tuple[int, Record] | None:
        """``(chunk ordinal, record)`` of the next record of the reader's epoch, or None."""
        if self._r_peek is not None:
            rec, self._r_peek = self._r_peek, None
            return rec
        chunks = self._epoch_chunks()
        while self._r_chunk < len(chunks):
            if self._r_iter is None:
                self._r_iter = self._reader.records(chunks[self._r_chunk], self._r_start)
                self._r_start = None
            got = next(self._r_iter, None)
            if got is not None:
                return self._r_chunk, (chunks[self._r_chunk].file, got[0], got[1])
            self._r_iter = None
            self._r_chunk += 1
        return None

    def _start_epoch(self, epoch: int) -> None:
        self._r_epoch, self._r_block, self._r_chunk = epoch, 0, 0
        self._r_iter, self._r_start, self._r_peek = None, None, None

    def _read_block(self) -> _Block | None:
        """Read the next block (the reader runs ahead of the consumer), or None at the end."""
        block = self._read_span_block()
        if block is not None:
            return block
        empty_epochs = 0
        while not self._exhausted_epoch(self._r_epoch):
            first = self._next_record()
            if first is None:  # the epoch ended on a block boundary
                empty_epochs = empty_epochs + 1 if self._r_block == 0 else 0
                if self._r_block == 0:
                    self._no_records.update(self._r_chunks)
                if empty_epochs > max(16, len(self.source.chunks)) and len(
                        self._no_records) == len(self.source.chunks):
                    raise DataError(
                        f"source {self.source.source.name!r}: lane {self.lane} read no record in "
                        f"{empty_epochs} epochs in a row (up to epoch {self._r_epoch}); its "
                        f"files hold no documents")
                self._start_epoch(self._r_epoch + 1)
                continue
            records = [first[1]]
            while len(records) < self._block_size:
                if self._r_iter is not None and self._r_peek is None:  # the chunk, in bulk
                    file = self._r_chunks[self._r_chunk].file
                    records.extend([(file, pos, raw) for pos, raw in itertools.islice(
                        self._r_iter, self._block_size - len(records))])
                    if len(records) == self._block_size:
                        break
                nxt = self._next_record()
                if nxt is None:
                    break
                records.append(nxt[1])
            epoch, index, after = self._block_read(len(records) == self._block_size)
            order = permutation(len(records), *self._block_key(epoch, index))
            return _Block(epoch, index, first[0], first[1][1], [records[i] for i in order],
                          after)
        return None

    def _block_key(self, epoch: int, index: int) -> tuple[object, ...]:
        """The key that permutes block ``index`` of ``epoch``."""
        return self.source.seed, "block", self.source.source.name, self.lane, epoch, index

    def _block_read(self, full: bool) -> tuple[int, int, SourceCursor]:
        """The block just read ends: its epoch and index and where the next one starts (the
        next record, looked at now if the block is ``full``: it starts the next block)."""
        peek = self._next_record() if full else None
        epoch, index = self._r_epoch, self._r_block
        if peek is None:
            after = SourceCursor(epoch + 1, 0, 0, -1, 0)
            self._start_epoch(epoch + 1)
        else:
            after = SourceCursor(epoch, index + 1, peek[0], peek[1][1], 0)
            self._r_peek = peek
            self._r_block += 1
        return epoch, index, after

    def _read_span_block(self) -> _Block | None:
        """The next block read a span of documents at a time and held as arrays
        (:mod:`datalane.engine.tokenrecords`), when the source's token files are read so; or
        None, the reader where it was: read it record by record. The same block as record by
        record: its records in the same order, where it starts, where the next one does."""
        if self._exhausted_epoch(self._r_epoch):
            return None
        chunks = self._epoch_chunks()
        c, start = self._r_chunk, self._r_start
        if self._r_peek is not None:  # the record a full block looked at: read again
            c, start = self._r_peek[0], self._r_peek[1][1]
        elif self._r_iter is not None:  # (a chunk being read record by record)
            return None
        spans: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        at: tuple[int, int] | None = None  # the first record's chunk ordinal and position
        n = 0
        while n < self._block_size and c < len(chunks):
            got = self._reader.span(chunks[c], start, self._block_size - n)
            if got is None:
                return None
            first, stop, ids, offs = got
            if stop > first:
                if spans and ids.dtype != spans[0][2].dtype:
                    return None
                spans.append((chunks[c].file, np.arange(first, stop, dtype=np.int64), ids,
                              offs))
                at = at or (c, first)
                n += stop - first
            if n < self._block_size:  # the chunk is read to its end
                c, start = c + 1, None
            else:
                start = stop
        if at is None:  # no record left in the epoch: told record by record
            return None
        self._r_chunk, self._r_iter, self._r_start, self._r_peek = c, None, start, None
        epoch, index, after = self._block_read(n == self._block_size)
        records = shuffled(spans, *self._block_key(epoch, index))
        return _Block(epoch, index, at[0], at[1], records, after)

    def _fill(self) -> None:
        """Submit map tasks until ``prefetch`` are in flight (the backpressure bound)."""
        while len(self._tasks) < self._depth:
            block = self._block
            if block is None or block.submitted >= len(block.records):
                reading = self._read_ahead()
                if (self._tasks or self._cur is not None) and not reading.done():
                    return  # the next block is being read; what is in hand comes first
                self._ahead = None
                block = reading.result()
                if block is None:
                    return
                block.submitted = min(self._skip_first, len(block.records))
                self._skip_first = 0
                self._block = block
                if block.submitted >= len(block.records):
                    self._cursor = block.after
                    continue
            start = block.submitted
            # A task the consumer will wait for next is small (the first batch after a start,
            # a restore or a stall waits only for the documents it needs); each task queued
            # behind others doubles, up to task_docs (big batches tokenize faster). The pool
            # runs the task with the fewest documents queued ahead of it first, whichever
            # lane or session it serves.
            ahead = len(self._tasks)
            size = min(self._knobs.task_docs, _FIRST_TASK_DOCS << min(ahead, 16))
            if self._doc_bytes is not None:  # images: as many documents as their bytes allow
                fits = (self._image_bytes - self._images_held()) // max(self._doc_bytes, 1)
                if fits < 1 and (self._tasks or self._cur is not None):
                    return  # the images in hand come first
                size = min(size, max(fits, 1))
            piece = block.records[start:start + size]
            block.submitted += len(piece)
            future = self._pool.submit_map(self._queued_docs, self._stage, piece,
                                           self._formats, self.lane)
            self._queued_docs += len(piece)
            self._tasks.append(_Task(block, start, len(piece), future))
            if block.submitted >= len(block.records):
                self._read_ahead()  # the block is all submitted: read the next one meanwhile

    def _images_held(self) -> int:
        """The image bytes the stream holds or may hold: the documents not consumed yet of the
        map result in hand, each finished task's, and each unfinished task's worst case (its
        documents times the most one holds). A task's result holds no more than its worst
        case and consumed documents leave the count, so the count only falls between two
        submissions: whatever the timing, it never passes ``image_bytes`` (or one document's
        worst case, when that is more)."""
        assert self._doc_bytes is not None
        held = 0
        cur = self._cur
        if cur is not None and cur.attached_bytes is not None:
            held += cur.attached_bytes[-1] - cur.attached_bytes[min(self._i, len(cur.status))]
        for task in self._tasks:
            future = task.future
            done = future.done() and not future.cancelled() and future.exception() is None
            result = future.result() if done else None
            if result is not None and result.attached_bytes is not None:
                held += result.attached_bytes[-1]
            else:
                held += task.docs * self._doc_bytes
        return held

    def _read_ahead(self) -> Future[_Block | None]:
        """The read of the next block, started on a reader thread if it is not yet: the
        reader side runs one block ahead of the map tasks, so a read (storage latency,
        decompression) overlaps the tasks in flight instead of stopping the ordered thread.
        One read at a time per stream, in order: the blocks are those read in line."""
        if self._ahead is None:
            self._ahead = _reads().submit(self._read_block)
        return self._ahead

    def _settle(self) -> None:
        """Wait for a read in flight (the reader is then free to use here)."""
        if self._ahead is not None:
            futures.wait([self._ahead])

    def prime(self) -> None:
        """Submit the first map task now, so every lane's first task runs in parallel."""
        self._fill()

    # -- consuming ---------------------------------------------------------------------------
    def next_doc(self) -> Doc | None:
        """The next kept document, or None at the end."""
        i = self._next_kept()
        if i is None:
            return None
        assert self._cur is not None
        file, pos, _ = self._record(i)
        doc = self._doc(self._cur, i, file, pos)
        if self._doc_bytes is not None:
            self._cur.attached[i] = None  # type: ignore[index]  # the packer holds them now
            self._fill()  # the room this document's images leave: a task more, maybe
        return doc

    def _next_kept(self) -> int | None:
        """Consume records up to the next kept document; its index in ``self._cur``, or
        None at the end of the stream."""
        while True:
            if not self._current():
                return None
            i = self._i
            self._i = i + 1
            if self._consume(i):
                return i

    def next_run(self, need: int, allow: Callable[[int], bool] | None = None) -> Run | None:
        """Kept documents in order as one run of a map result, or None at the end.

        The first kept document is always taken; each next one while the tokens taken so
        far are fewer than ``need`` and ``allow(taken)`` holds, up to the end of the current
        map task's results (a caller that wants more asks again). Every record is accounted
        exactly as :meth:`next_doc` accounts it, in the same order, so taking documents one
        at a time or in runs gives the same documents, counters, errors and cursor."""
        i = self._next_kept()
        if i is None:
            return None
        res = self._cur
        assert res is not None
        # runs carry no attachments: packers of attaching kinds take documents one at a time
        assert res.attached is None, "next_run over documents that carry attachments"
        first = last = i
        offsets = res.bounds
        taken = offsets[i + 1] - offsets[i]
        docs = 1
        status = res.status
        n = len(status)
        task = self._cur_task
        assert task is not None
        block = task.block
        # a kept record that is not its block's last needs no more than a count; the cursor
        # is set once after them (no probe is left to feed: the first kept document ended it)
        quick = min(n, len(block.records) - task.start - 1)
        counters = self._counters
        set_aside = res.set_aside
        base = offsets[first]
        quick_last = False
        while taken < need and (allow is None or allow(taken)):
            j = self._i
            if j < quick and status[j] is None:
                # records j .. stop - 1 are kept documents; document k is taken while the
                # tokens before it, offsets[k] - base, are fewer than need and allowed
                # (allow is monotone: once false it stays false as more tokens are taken)
                k = bisect.bisect_left(set_aside, j)
                stop = min(quick, set_aside[k]) if k < len(set_aside) else quick
                end = bisect.bisect_left(offsets, base + need, j, stop)
                if allow is not None:  # the first document allow refuses (j is allowed)
                    lo, hi = j + 1, end
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if allow(offsets[mid] - base):
                            lo = mid + 1
                        else:
                            hi = mid
                    end = lo
                self._i = end
                counters.docs += end - j
                taken = offsets[end] - base
                last = end - 1
                docs += end - j
                quick_last = True
                continue
            if quick_last:  # the stretch ends here: the cursor after it, before any more
                self._consumed(block, task.start + j)
                quick_last = False
            while j < n and status[j] is not None:  # set aside: accounted on the way
                self._i = j + 1
                self._consume(j)
                j += 1
            if j >= n:
                break
            self._i = j + 1
            self._consume(j)
            taken += offsets[j + 1] - offsets[j]
            last = j
            docs += 1
        if quick_last:
            self._consumed(block, task.start + self._i)
        lo, hi = offsets[first], offsets[last + 1]
        file, pos, _ = self._record(last)
        return Run(self.source.index, tuple(res.columns[c.name][lo:hi] for c in
                                            self._stage.columns),
                   [b - lo for b in offsets[first:last + 2]], docs,
                   self._formats[file].ref(file, pos))

    def _current(self) -> bool:
        """Make ``self._cur`` a map result with a record left to consume; False at the end."""
        while True:
            if self._cur is None:
                self._fill()
                if not self._tasks:
                    self._cursor = SourceCursor(self._r_epoch, 0, 0, -1, 0)
                    return False
                task = self._tasks.popleft()
                self._queued_docs -= task.docs
                self._cur, self._cur_task, self._i = task.future.result(), task, 0
                # slow start: a fresh or restored stream asks for one task, then deepens its
                # prefetch as it is consumed, so the first batch never queues behind read-ahead
                self._depth = min(self._knobs.prefetch, self._depth + 1)
                self._fill()
            if self._i < len(self._cur.status):
                return True
            self._cur = None

    def _record(self, i: int) -> Record:
        task = self._cur_task
        assert task is not None
        return task.block.records[task.start + i]

    def _consume(self, i: int) -> bool:
        """Account record ``i`` of the current map result (cursor, counters, policies);
        True if it is a kept document."""
        res, task = self._cur, self._cur_task
        assert res is not None and task is not None
        block = task.block
        offset = task.start + i + 1
        end_of_epoch = False
        if offset >= len(block.records):
            self._cursor = block.after
            end_of_epoch = block.after.epoch != block.epoch
        else:
            self._consumed(block, offset)
        file, pos, _ = block.records[task.start + i]
        self._counters.docs += 1
        reason = res.status[i]
        if self._probe is not None:
            self._first_records(reason, file, end_of_epoch)
        if reason is None:
            self._kept_this_epoch = True
            if end_of_epoch:
                self._end_of_epoch(block.epoch)
            return True
        if reason in ALWAYS_FAIL or (reason in self._stage.bad_reasons
                                     and self._policy == "fail"):
            raise DataError(f"source {self.source.source.name!r}: {res.detail[i]} in "
                            f"{self._where(file, pos)} (bad_records is 'fail')")
        self._counters.skip(reason)
        if self._max_bad is not None and reason in self._stage.bad_reasons:
            self._check_fraction(file, pos)
        if end_of_epoch:
            self._end_of_epoch(block.epoch)
        return False

    def _consumed(self, block: _Block, offset: int) -> None:
        """The cursor is ``offset`` records into ``block`` (built when it is read: a run
        moves it once per document it accounts one by one)."""
        self._cursor = None
        self._cursor_at = (block, offset)

    def _first_records(self, reason: str | None, file: int, end_of_epoch: bool) -> None:
        """Fail at once when the lane's first records of the source (its first ``_PROBE``, or
        its whole first epoch if shorter) are all malformed: the source's field is not in
        its records, or they are all broken. A kept or a filtered record ends the probe."""
        probe = self._probe
        assert probe is not None
        if reason is None or reason not in self._stage.bad_reasons:
            self._probe = None
            return
        probe.append(reason)
        if len(probe) < _PROBE and not end_of_epoch:
            return
        self._probe = None
        self._settle()
        fields = self._reader.fields(file)
        reasons = ", ".join(f"{r}={probe.count(r)}" for r in sorted(set(probe)))
        there = (f"its records have the fields {', '.join(repr(f) for f in fields[:20])}"
                 if fields else "no record could be read as a record with fields")
        raise DataError(
            f"source {self.source.source.name!r}: none of the first {len(probe)} records of lane "
            f"{self.lane} holds a document ({reasons}); the source reads the field "
            f"{self._stage.field!r}, but {there} (in {self.source.files[file].uri})")

    def _check_fraction(self, file: int, pos: int) -> None:
        n = self._counters
        if n.docs < _MIN_FOR_FRACTION:
            return
        bad = sum(v for k, v in n.skipped.items() if k in self._stage.bad_reasons)
        assert self._max_bad is not None
        if bad > self._max_bad * n.docs:
            reasons = ", ".join(f"{k}={v}" for k, v in sorted(n.skipped.items())
                                if k in self._stage.bad_reasons)
            raise DataError(
                f"lane {self.lane}: {bad} of its {n.docs} records are malformed ({reasons}), "
                f"more than bad_records_max_fraction {self._max_bad}; the last was in source "
                f"{self.source.source.name!r} at {self._where(file, pos)}")

    def _end_of_epoch(self, epoch: int) -> None:
        """A repeated source whose records are all dropped would spin forever: stop it."""
        if self._kept_this_epoch:
            self._dry_epochs = 0
            self._dry_chunks.clear()
        else:
            self._dry_epochs += 1
            self._dry_chunks.update(self.source.lane_chunks(self.lane, epoch))
        self._kept_this_epoch = False
        if self.source.source.epochs is None and self._dry_epochs > max(16, len(
                self.source.chunks)) and len(self._dry_chunks | self._no_records) == len(
                self.source.chunks):
            skipped = ", ".join(f"{k}={v}" for k, v in sorted(self._counters.skipped.items()))
            raise DataError(f"source {self.source.source.name!r}: lane {self.lane} kept no "
                            f"document in {self._dry_epochs} epochs in a row; every record is "
                            f"bad or filtered (skipped so far: {skipped or 'none'})")

    def _doc(self, res: MapResult, i: int, file: int, pos: int) -> Doc:
        lo, hi = res.offsets[i], res.offsets[i + 1]
        attached = res.attached[i] if res.attached is not None else None
        return Doc(self.source.index, self._formats[file].ref(file, pos),
                   tuple(res.columns[c.name][lo:hi] for c in self._stage.columns),
                   attached or ())

    def _where(self, file: int, pos: int) -> str:
        return f"{self.source.files[file].uri} at {self._formats[file].unit} {pos}"

    def position(self, ref: tuple[int, ...]) -> int | None:
        """The record position of a document reference of this source (its format's), or
        None when it names no document the source can hold (checked before :meth:`fetch`)."""
        if not ref or not 0 <= ref[0] < len(self._formats):
            return None
        return self._formats[ref[0]].position(ref)

    def fetch(self, ref: tuple[int, ...]) -> Doc:
        """Re-read and map one document by reference (restoring a packer's carry-over)."""
        file, pos = ref[0], self.position(ref)
        assert pos is not None, f"fetch of a reference {ref} that position() refuses"
        raw = self._reader.read_one(ref)
        res = self._stage.run([(file, pos, raw)], self._formats, self.lane)
        if res.status[0] is not None:
            raise DataError(f"source {self.source.source.name!r}: the carried document at "
                            f"{self._where(file, pos)} no longer maps to tokens "
                            f"({res.status[0]}); did the file change?")
        return self._doc(res, 0, file, pos)

    @property
    def cursor(self) -> SourceCursor:
        """Resume point: where the next document not yet consumed comes from."""
        if self._cursor is None:
            assert self._cursor_at is not None
            block, offset = self._cursor_at
            self._cursor = SourceCursor(block.epoch, block.index, block.chunk, block.pos, offset)
        return self._cursor

    def close(self) -> None:
        for task in self._tasks:
            task.future.cancel()
        self._tasks.clear()
        self._queued_docs = 0
        ahead, self._ahead = self._ahead, None
        if ahead is not None and not ahead.cancel():
            # a read in flight closes the reader when it ends (a slow remote read does not
            # hold the close up)
            reader = self._reader
            ahead.add_done_callback(lambda _: reader.close())
            return
        self._reader.close()
