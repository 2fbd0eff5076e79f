"""A shuffled block of token-file documents held as arrays, not as one object per record.

A lane reads a pre-tokenized source (:mod:`datalane.engine.formats.megatron`) a block of
``K`` documents at a time, permutes the block and cuts it into map tasks
(:mod:`datalane.engine.docstream`). Record by record, that is a tuple and a numpy view per
document made on a reader thread, and every map task walks hundreds of them to join their ids:
Python work per document on threads that share the ordered thread's interpreter lock, and long
stretches of it. :class:`TokenRecords` is the same records as arrays: the block's ids laid out
in shuffled order in one buffer, each record's file, position and offset in it. A map task
over a slice of them is one contiguous run of ids (:meth:`TokenRecords.tokens`); the records
one at a time are still there, made on demand, for everything that looks at a record (a
cursor, a reference, a bad record's message, the map stage's record-by-record path).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from datalane.engine.rng import permutation

__all__ = ["TokenRecords", "shuffled"]

Record = tuple[int, int, Any]  # (file index, position, raw value): datalane.engine.mapstage's


class TokenRecords(Sequence[Record]):
    """Records ``(file, position, ids)``: record ``i``'s ids are ``buf[offs[i]:offs[i+1]]``
    (a view, as a token file's reader gives them). Slicing (step 1) shares the buffer."""

    __slots__ = ("_bounds", "buf", "files", "offs", "pos")

    def __init__(self, files: list[int], pos: list[int], buf: np.ndarray, offs: np.ndarray,
                 bounds: list[int] | None = None) -> None:
        if not (len(files) == len(pos) == len(offs) - 1):
            raise ValueError(f"{len(files)} files, {len(pos)} positions and {len(offs)} "
                             f"offsets do not describe one set of records")
        self.files = files
        self.pos = pos
        self.buf = buf
        self.offs = offs
        self._bounds = offs.tolist() if bounds is None else bounds  # (indexed as ints)

    def __len__(self) -> int:
        return len(self.pos)

    @overload
    def __getitem__(self, i: int) -> Record: ...

    @overload
    def __getitem__(self, i: slice) -> TokenRecords: ...

    def __getitem__(self, i: int | slice) -> Record | TokenRecords:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self.pos))
            if step != 1:
                raise ValueError(f"token records are sliced in order, not by step {step}")
            stop = max(start, stop)
            return TokenRecords(self.files[start:stop], self.pos[start:stop], self.buf,
                                self.offs[start:stop + 1], self._bounds[start:stop + 1])
        n = len(self.pos)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(f"record {i} of {n}")
        bounds = self._bounds
        return self.files[k], self.pos[k], self.buf[bounds[k]:bounds[k + 1]]

    def __iter__(self) -> Iterator[Record]:
        buf, bounds = self.buf, self._bounds
        for k, (file, pos) in enumerate(zip(self.files, self.pos, strict=True)):
            yield file, pos, buf[bounds[k]:bounds[k + 1]]

    def tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """The records' ids end to end (a view of the buffer) and each record's length."""
        return self.buf[self._bounds[0]:self._bounds[-1]], np.diff(self.offs)

    def __reduce__(self) -> tuple[Any, ...]:
        # to a map process: the records one by one (the buffer holds the whole block)
        return list, (list(self),)


def shuffled(spans: Sequence[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
             *key: object) -> TokenRecords:
    """The records of ``spans`` in file order - each ``(file, positions, ids, offsets)``: its
    documents' positions, their ids end to end, where each starts in them (one more offset
    than positions, from 0) - permuted by ``key`` as :func:`~datalane.engine.rng.permutation`
    permutes a list of them. The spans' ids must be of one dtype."""
    files = np.concatenate([np.full(len(p), f, dtype=np.int64) for f, p, _, _ in spans])
    pos = np.concatenate([p for _, p, _, _ in spans])
    base = 0
    starts = []
    for _, _, ids, offs in spans:
        starts.append(offs[:-1] + base)
        base += len(ids)
    lens = np.concatenate([np.diff(offs) for _, _, _, offs in spans])
    ids = np.concatenate([ids for _, _, ids, _ in spans]) if len(spans) > 1 else spans[0][2]
    order = np.array(permutation(len(pos), *key), dtype=np.intp)
    size = ids.dtype.itemsize
    first = np.concatenate(starts)[order]
    lens = lens[order]
    data = memoryview(ids.data).cast("B")
    # one copy in the shuffled order, keeping the interpreter lock (np.concatenate would give
    # it up and take it back for every document of 500 ids or more)
    out = np.frombuffer(bytearray().join(
        [data[a:b] for a, b in zip((first * size).tolist(), ((first + lens) * size).tolist(),
                                   strict=True)]), dtype=ids.dtype)
    offs = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    return TokenRecords(files[order].tolist(), pos[order].tolist(), out, offs)
