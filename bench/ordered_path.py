#!/usr/bin/env python3
"""The pre-tokenized ordered thread alone: how close to the contract limit can it get?

    .venv/bin/python bench/ordered_path.py            # ~1 min, on bench/pretokenized.py's corpus
    .venv/bin/python bench/ordered_path.py --batch 32

``bench/pretokenized.py`` measures datalane end to end against ``memmap_limit_contract`` (a
memmap copied into the batch, the positions from the index, the SHA-256 of both columns, on
one thread). Every step of datalane also runs on one thread, the lane's ordered thread; the
rest (reading, the map stage) runs beside it on other threads, sharing one interpreter lock.
This script measures the ordered thread's work with nothing beside it, so the distance to the
limit that the design itself leaves is known apart from what contention adds:

1. **A real run** (``Loader``, 1 map worker, the same recipe as ``bench/pretokenized.py``):
   the step digests, and every run of documents each lane's packer took from its mixture
   (recorded), with the thread CPU time of those calls (the mixture and the document
   stream's consumer: which documents, cursors, counters).
2. **A replay** of the same steps on the ordered thread alone: a fresh ``Loader`` whose lanes'
   packers take the recorded runs (no reading, no map work, no other thread), timed per step:
   filling the windows, hashing them, assembling the step. Its digests must equal the real
   run's (the replay is the same work, not an approximation of it).
3. **The contract limit** (``memmap_limit_contract``) per step, in this process.

The floor of the ordered thread is the replay plus the mixture's CPU of the real run; the
most any datalane run can reach is the limit's time over that floor. Best of ``--rounds``
for the replay and the limit (the least disturbed), medians printed too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import pretokenized as pt  # noqa: E402  (the corpus, its recipe and the limit)


def real_run(corpus: Path, batch: int) -> tuple[list[dict[int, bytes]], list[list[Any]], float]:
    """The step digests, each lane's runs in order, and the CPU seconds of the runs' calls."""
    from datalane import Knobs, Loader

    digests = []
    runs: list[list[Any]] = []
    cpu = [0.0]
    with Loader(pt._recipe(corpus, "megatron", batch), 0, 1, Knobs(workers=1)) as loader:
        streams = loader._open()
        for stream in streams:
            got: list[Any] = []
            runs.append(got)
            take = stream._ctx.next_run
            assert take is not None

            def record(need: int, take: Any = take, got: list[Any] = got) -> Any:
                t = time.thread_time()
                run = take(need)
                cpu[0] += time.thread_time() - t
                got.append(run)
                return run

            stream._ctx.next_run = record
        while True:
            step = loader.next_step()
            digests.append(dict(step.lane_digests))
            if step.ended:
                break
    return digests, runs, cpu[0]


def replay(corpus: Path, batch: int, runs: list[list[Any]],
           digests: list[dict[int, bytes]]) -> tuple[float, float]:
    """Seconds (wall, and of which hashing) to make every step again from the recorded runs
    on this thread alone; AssertionError if any digest differs from the real run's."""
    from datalane import Knobs, Loader
    from datalane.engine import docstream, lane

    hashing = [0.0]
    digest = lane.window_digest

    def timed_digest(*args: Any) -> bytes:
        t = time.perf_counter()
        out = digest(*args)
        hashing[0] += time.perf_counter() - t
        return out

    prime = docstream.DocStream.prime
    docstream.DocStream.prime = lambda self: None  # type: ignore[method-assign]  # no reading
    lane.window_digest = timed_digest
    try:
        with Loader(pt._recipe(corpus, "megatron", batch), 0, 1, Knobs(workers=1)) as loader:
            for stream, recorded in zip(loader._open(), runs, strict=True):
                taken = iter(recorded)
                stream._ctx.next_run = lambda need, taken=taken: next(taken)
            t0 = time.perf_counter()
            got = []
            for _ in digests:
                got.append(loader.next_step().lane_digests)
            wall = time.perf_counter() - t0
    finally:
        docstream.DocStream.prime = prime  # type: ignore[method-assign]
        lane.window_digest = digest
    assert got == digests, "the replay made other steps than the real run"
    return wall, hashing[0]


def contract_limit(corpus: Path, batch: int) -> float:
    """Seconds per step of ``memmap_limit_contract`` at this batch (best of a 2 s loop)."""
    pt.B = batch
    t0 = time.perf_counter()
    tokens = 0
    while time.perf_counter() - t0 < 2.0:
        tokens += pt.run_memmap(corpus, True)
    return (time.perf_counter() - t0) / (tokens / (batch * (pt.SEQ + 1)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=pt.B, help="sequences per step (2 lanes)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=50_000_000)
    args = ap.parse_args()
    corpus = pt.corpus_dir(args.tokens)
    if not (corpus / "MANIFEST.json").exists():
        pt.make_corpus(corpus, args.tokens)
    import fsspec  # noqa: F401  (imports out of every clock, as bench/pretokenized.py does)

    digests, runs, run_cpu = real_run(corpus, args.batch)
    steps = len(digests)
    replays, hashes, limits = [], [], []
    for _ in range(args.rounds):
        wall, hashing = replay(corpus, args.batch, runs, digests)
        replays.append(wall / steps)
        hashes.append(hashing / steps)
        limits.append(contract_limit(corpus, args.batch))
    us = 1e6
    mixture = run_cpu / steps
    floor = min(replays) + mixture
    limit = min(limits)
    tokens = args.batch * (pt.SEQ + 1)
    print(f"batch {args.batch} x {pt.SEQ + 1} tokens, 2 lanes, {steps} steps; best (median) of "
          f"{args.rounds} rounds, us per step:")
    print(f"  contract limit (memmap, positions, SHA-256)   {limit * us:7.1f} "
          f"({statistics.median(limits) * us:.1f})  = {tokens / limit / 1e6:.1f} M tokens/s")
    print(f"  ordered thread alone: windows, hash, step    {min(replays) * us:7.1f} "
          f"({statistics.median(replays) * us:.1f})")
    print(f"    of which hashing the windows               {min(hashes) * us:7.1f} "
          f"({statistics.median(hashes) * us:.1f})")
    print(f"  + the mixture's runs (CPU in the real run)   {mixture * us:7.1f}")
    print(f"  = the ordered thread's floor                 {floor * us:7.1f}"
          f"  = {tokens / floor / 1e6:.1f} M tokens/s, {limit / floor:.0%} of the limit")


if __name__ == "__main__":
    main()
