#!/usr/bin/env python3
"""The pre-tokenized ordered thread alone: how close to the contract limit can it get?

    .venv/bin/python bench/ordered_path.py            # ~1 min, on bench/pretokenized.py's corpus
    .venv/bin/python bench/ordered_path.py --batch 32
    .venv/bin/python bench/ordered_path.py --threads  # each thread's CPU in a real run (~20 s)

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
4. **The real run without its hash**, with 1 and 2 map workers: every window digest a
   constant instead of its SHA-256. The difference is what the hash costs a run, as opposed
   to what it costs the ordered thread alone: the threads share one interpreter lock, so a
   run's wall time is about the lock-holding CPU of all its threads, and the hash (which
   gives the lock up) overlaps with the readers' and the map workers' work.

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


def real_run(corpus: Path, batch: int,
             ) -> tuple[list[dict[int, bytes]], list[list[Any]], float, float]:
    """The step digests, each lane's runs in order, the CPU seconds of the runs' calls and
    the run's wall seconds from the loader's start to its last step."""
    from datalane import Knobs, Loader

    digests = []
    runs: list[list[Any]] = []
    cpu = [0.0]
    t0 = time.perf_counter()
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
        wall = time.perf_counter() - t0
    return digests, runs, cpu[0], wall


def plain_run(corpus: Path, batch: int, workers: int = 1, hashed: bool = True) -> float:
    """Wall seconds per step of the same run with nothing recorded (the recording holds every
    map result of the corpus, which slows the real run down); ``hashed=False``: every window
    digest a constant instead of its SHA-256 (not a datalane run: what the hash costs it)."""
    from datalane import Knobs, Loader
    from datalane.engine import lane

    digest = lane.window_digest
    if not hashed:
        lane.window_digest = lambda *args: bytes(32)
    try:
        t0 = time.perf_counter()
        steps = 0
        with Loader(pt._recipe(corpus, "megatron", batch), 0, 1,
                    Knobs(workers=workers)) as loader:
            while True:
                steps += 1
                if loader.next_step().ended:
                    break
        return (time.perf_counter() - t0) / steps
    finally:
        lane.window_digest = digest


def thread_cpu(corpus: Path, batch: int, workers: int = 1) -> tuple[dict[str, float], float]:
    """The same run's CPU seconds per step of each of its threads (``/proc/self/task``, from
    its first step to its last; the loader's threads by name, the reading ones summed) and its
    wall seconds per step. Their sum against the wall says what bounds the run: about one
    core's worth is the interpreter lock (every thread but the hashing waits for it)."""
    import os
    import threading

    from datalane import Knobs, Loader

    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> dict[int, float]:
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # (a thread that ended meanwhile)
                continue
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        return out

    with Loader(pt._recipe(corpus, "megatron", batch), 0, 1, Knobs(workers=workers)) as loader:
        loader.next_step()  # (opened: the lanes' first blocks read)
        before = cpu()
        t0 = time.perf_counter()
        steps = 0
        while not loader.next_step().ended:
            steps += 1
        wall = (time.perf_counter() - t0) / steps
        after = cpu()
        names = {t.native_id: t.name for t in threading.enumerate()}
    per: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, "other")
        name = "the ordered thread (this one)" if name == threading.current_thread().name else \
            name.rstrip("0123456789").rstrip("_")
        per[name] = per.get(name, 0.0) + (seconds - before.get(tid, 0.0)) / steps
    return per, wall


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
    ap.add_argument("--plot", help="draw the breakdown here (a PNG; matplotlib, the dev extra)")
    ap.add_argument("--threads", action="store_true",
                    help="only the real run's CPU per step of each thread, 1 and 2 map workers")
    args = ap.parse_args()
    corpus = pt.corpus_dir(args.tokens)
    if not (corpus / "MANIFEST.json").exists():
        pt.make_corpus(corpus, args.tokens)
    import fsspec  # noqa: F401  (imports out of every clock, as bench/pretokenized.py does)
    if args.threads:
        for workers in (1, 2):
            for _ in range(args.rounds):
                per, wall = thread_cpu(corpus, args.batch, workers)
                parts = ", ".join(f"{name} {seconds * 1e6:.0f}"
                                  for name, seconds in sorted(per.items(), key=lambda x: -x[1])
                                  if seconds > 0)
                print(f"{workers} map worker{'s' if workers > 1 else ''}: wall {wall * 1e6:.0f} "
                      f"us per step, CPU {sum(per.values()) * 1e6:.0f} ({parts})")
        return

    replays, hashes, limits, reals, mixtures = [], [], [], [], []
    others: dict[tuple[int, bool], list[float]] = {}
    for _ in range(args.rounds):
        reals.append(plain_run(corpus, args.batch))
        for workers, hashed in ((1, False), (2, True), (2, False)):
            others.setdefault((workers, hashed), []).append(
                plain_run(corpus, args.batch, workers, hashed))
        digests, runs, run_cpu, _ = real_run(corpus, args.batch)
        steps = len(digests)
        mixtures.append(run_cpu / steps)
        wall, hashing = replay(corpus, args.batch, runs, digests)
        replays.append(wall / steps)
        hashes.append(hashing / steps)
        limits.append(contract_limit(corpus, args.batch))
        del runs  # (every map result of the corpus, held for the replay)
    us = 1e6
    mixture = min(mixtures)
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
    real = min(reals)
    print(f"  the real run (1 map worker), wall            {real * us:7.1f} "
          f"({statistics.median(reals) * us:.1f})  = {tokens / real / 1e6:.1f} M tokens/s, "
          f"{limit / real:.0%} of the limit")
    print("  the real run's wall, with the hash and with every digest a constant instead:")
    for workers in (1, 2):
        with_hash = real if workers == 1 else min(others[(2, True)])
        without = min(others[(workers, False)])
        name = f"{workers} map worker{'s' if workers > 1 else ' '}"
        print(f"    {name}   {with_hash * us:7.1f} hashed, "
              f"{without * us:7.1f} not: the hash costs the run "
              f"{(with_hash - without) * us:.1f}")
    if args.plot:
        plot(args.plot, args.batch, limit, min(hashes), min(replays), mixture, real)


def plot(path: str, batch: int, limit: float, hashing: float, replay: float, mixture: float,
         real: float) -> None:
    """Three stacked bars, microseconds per step: the contract limit, the ordered thread's
    floor and the real run, each split into its parts (the limit hashes the same bytes as
    the windows: its hash is drawn as long as theirs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    us = 1e6
    bars = [("contract limit\n(one thread)", [(hashing, "SHA-256 of the windows"),
                                             (limit - hashing, "copy and positions")]),
            ("datalane's ordered\nthread alone", [
                (hashing, "SHA-256 of the windows"),
                (replay - hashing, "fill the windows, assemble the step"),
                (mixture, "mixture and document streams")]),
            ("datalane, real run\n(1 map worker)", [
                (hashing, "SHA-256 of the windows"),
                (replay - hashing, "fill the windows, assemble the step"),
                (mixture, "mixture and document streams"),
                (real - replay - mixture, "waiting: the lock, the map worker, the readers")])]
    colours = {"SHA-256 of the windows": "#6a51a3", "copy and positions": "#9e9ac8",
               "fill the windows, assemble the step": "#1f77b4",
               "mixture and document streams": "#6baed6",
               "waiting: the lock, the map worker, the readers": "#d9d9d9"}
    fig, ax = plt.subplots(figsize=(8, 3.6))
    seen = set()
    for i, (_, parts) in enumerate(bars):
        left = 0.0
        for value, label in parts:
            ax.barh(i, value * us, left=left * us, color=colours[label],
                    label=None if label in seen else label)
            seen.add(label)
            left += value
        ax.text(left * us + 3, i, f"{left * us:.0f} us", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"microseconds per step ({batch} x 2,049 tokens, 2 lanes)")
    ax.set_xlim(right=real * us * 1.25)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.45, -0.22), ncol=3,
              frameon=False)
    ax.set_title("Where a pre-tokenized step's time goes (bench/ordered_path.py)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
