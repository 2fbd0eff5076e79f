#!/usr/bin/env python3
"""Delivery through the sidecar's Unix socket against the in-process mode, in one run.

What is measured (issue 4, item 7):

* **transport** - microbatches/s, MB/s, the latency of a *ready* microbatch (p50/p99) and the
  trainer's CPU seconds per GB, for 64 KiB and 1 MiB microbatches, for ``shm`` with
  ``copy=True`` and ``copy=False`` and for ``inline`` (both copy modes), against the
  in-process mode over the same microbatches.
* **producer** - end-to-end document tokens/s of the real engine: ``InProcessLoader`` and a
  real ``datalane-sidecar serve`` process over the same recipe.

Tokenization is far slower than the transport, so the transport figures take data production
out: this script starts a second process (itself, with ``--replay-server``) that runs the
shipped sidecar (``datalane_sidecar.server.serve``: the same gRPC server, options, socket and
``DataLaneService`` with its ``Stream`` servicer and shared-memory ring) with one substitution:
``Session`` is a replaying stub that yields a fixed set of real microbatches - produced once by
the real ``Session`` over the engine, ``state_json`` and lane digests included - in a loop,
renumbering steps. The trainer side is the shipped ``SidecarLoader``. The in-process
comparison is the shipped ``InProcessLoader`` whose engine is replaced by the same kind of
replay of real steps.

Payload = the text recipe's columns (``input_ids`` + ``positions``, int32), ``seq_len + 1 =
2048`` tokens per sequence: 4 sequences = 2 x 4 x 2048 x 4 B = 64 KiB, 16 = 256 KiB, 64 = 1 MiB
(``Batch.nbytes``, every column; a chat recipe's uint8 ``loss_mask`` would add 1/8).
MB = 10^6 bytes.

Per configuration and round:

1. warm-up (``--warmup`` s) so the sidecar's ring / stream window is full;
2. throughput: ``next()`` back to back for ``--seconds`` s; wall time, ``time.process_time()``
   of this (the trainer) process, which covers every thread of it, gRPC's included;
3. ready latency: ``--latency-n`` calls, each after the "trainer" slept ``--pace-ms`` (a
   training step's compute), so the sidecar is ahead and the microbatch is ready; the time
   from asking for the next microbatch until holding it. The CPU of this phase, less the CPU
   of the sleeps themselves (calibrated before), is the "paced" CPU per MB: what delivery
   costs a trainer that is slower than its sidecar, as real ones are.

Rounds are interleaved (every configuration once per round) and medians are reported, with the
1-minute load average of the machine. Results also go to ``bench/results/serve.json``.

    .venv/bin/python bench/serve.py                 # defaults: 3 rounds
    .venv/bin/python bench/serve.py --rounds 5 --seconds 3
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SEQ_LEN = 2047  # seq_len + 1 = 2048 tokens per sequence
SIZES = {"64KiB": 4, "256KiB": 16, "1MiB": 64}  # label -> sequences per microbatch
GLOBAL_BATCH = 256
LANES = 8
TARGETS = {"mb_per_s_64KiB": 5000.0, "MB_per_s_1MiB": 1000.0, "cpu_ms_per_MB": 1.0,
           "p99_ms": 2.0}
VARIANTS = [  # name, transport, copy
    ("shm copy", "shm", True),
    ("shm view", "shm", False),
    ("inline copy", "inline", True),
    ("inline view", "inline", False),
]


def recipe_dict(corpus: Any) -> dict[str, Any]:
    """Two repeating sources over the demo corpus: the data never ends."""
    return {
        "lanes": LANES, "global_batch_size": GLOBAL_BATCH, "seq_len": SEQ_LEN, "seed": 5,
        "tokenizer": {"uri": corpus.tokenizer},
        "sources": [
            {"name": "web", "uris": [corpus.web], "weight": 0.7, "epochs": None,
             "chunk_rows": 50},
            {"name": "code", "uris": [corpus.code], "weight": 0.3, "epochs": None,
             "chunk_bytes": 8192},
        ],
        "shuffle": {"block_size": 16},
    }


def load1() -> float:
    return os.getloadavg()[0]


# -- the replay sidecar (a child process) ------------------------------------------------------
def replay_server(args: argparse.Namespace) -> int:
    """The shipped sidecar with ``Session`` replaced by a replay of real microbatches."""
    from datalane_sidecar import service
    from datalane_sidecar.server import SidecarConfig, serve
    from datalane_sidecar.session import Prepared, Session

    cache: dict[tuple[int, int, int], tuple[list[Prepared], str, range, int, Any]] = {}
    lock = threading.Lock()
    steps = args.replay_steps

    class _Counters:
        def encode(self) -> dict[str, Any]:
            return {}

    class _Engine:  # what Stats reads of a session's loader
        step = 0

        def counters(self) -> _Counters:
            return _Counters()

    class ReplaySession:
        """Same constructor and surface as ``Session``; the queue is always full."""

        def __init__(self, session_id: str, plan: Any, pool: Any, knobs: Any, rank: int,
                     world_size: int, microbatch_size: int, start: Any,
                     skip_microbatches: int, prefetch: int, readers: int = 1,
                     texts: Any = None) -> None:
            key = (rank, world_size, microbatch_size)
            with lock:
                if key not in cache:  # produce once with the real Session over the engine
                    real = Session(session_id, plan, pool, knobs, rank, world_size,
                                   microbatch_size, None, 0, prefetch)
                    try:
                        items: list[Prepared] = []
                        generation = real.claim(0)
                        while len(items) < steps * real.per_step:
                            item = real.next(0, generation, timeout=1.0)
                            if item is not None:
                                items.append(item)
                        cache[key] = (items, real.state_at(real.first_step), real.lanes,
                                      real.per_step, real.layout)
                    finally:
                        real.close()
            self._items, self._state, self.lanes, self.per_step, self.layout = cache[key]
            self.id = session_id
            self.rank = rank
            self.world_size = world_size
            self.microbatch_size = microbatch_size
            self.readers = readers
            self.first_step = 0
            self.sent: tuple[int, int] | None = None
            self.acked: tuple[int, int] | None = None
            self.first_skip = 0
            self.waited_seconds = 0.0
            self.loader = _Engine()
            self._prefetch = prefetch
            self._i = 0
            self._closed = False

        def claim(self, reader: int) -> int:
            return 1

        def attached(self) -> list[int]:
            return [0]

        def reader_positions(self) -> list[dict[str, Any]]:
            return []

        def sent_to(self, reader: int, generation: int, position: tuple[int, int]) -> None:
            self.sent = position

        def acked_by(self, reader: int, generation: int, position: tuple[int, int]) -> None:
            self.acked = position

        def detach(self, reader: int, generation: int) -> None:
            pass

        def next(self, reader: int, generation: int, timeout: float) -> Prepared | None:
            if self._closed:  # like Session: nothing more once closed
                return None
            k, r = divmod(self._i, len(self._items))
            self._i += 1
            item = self._items[r]
            return dataclasses.replace(item, step=item.step + k * steps) if k else item

        def queue_depth(self, reader: int | None = None) -> int:
            return self._prefetch

        def state_at(self, step: int, timeout: float = 60.0) -> str:
            return self._state

        def digests_between(self, start: int, stop: int) -> dict[int, dict[int, bytes]]:
            return {}

        def forget_before(self, step: int) -> None:
            pass

        def close(self) -> None:
            self._closed = True

    service.Session = ReplaySession  # type: ignore[misc,assignment]
    cfg = SidecarConfig(args.socket, args.recipe, None, {}, "bench", 1, args.workers,
                        args.prefetch, 0o600, 0, "127.0.0.1")
    return serve(cfg)


@contextlib.contextmanager
def sidecar_process(cmd: list[str], socket: str, log: Path,
                    timeout: float = 120.0) -> Iterator[subprocess.Popen[bytes]]:
    import grpc

    from datalane.wire import datalane_pb2 as pb
    from datalane.wire import datalane_pb2_grpc as pbg

    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"sidecar exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            if os.path.exists(socket):
                try:
                    with grpc.insecure_channel(f"unix://{socket}") as ch:
                        if pbg.DataLaneStub(ch).Health(pb.HealthRequest(), timeout=1).serving:
                            break
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                raise SystemExit(f"sidecar not serving after {timeout} s:\n"
                                 f"{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- measuring a stream of microbatches --------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def sleep_cpu(pace: float, n: int = 300) -> float:
    """CPU seconds one ``time.sleep(pace)`` costs this process (timer, wakeup)."""
    c = time.process_time()
    for _ in range(n):
        time.sleep(pace)
    return (time.process_time() - c) / n


def back_to_back(it: Iterator[Any], warmup: float, seconds: float,
                 on_batch: Callable[[Any], None]) -> tuple[float, float]:
    """``next()`` for ``warmup`` s, then for ``seconds`` s calling ``on_batch`` on each
    microbatch: ``(wall seconds, CPU seconds of this process)`` of the timed part."""
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        next(it)
    c0 = time.process_time()
    t0 = t = time.perf_counter()
    while t - t0 < seconds:
        b = next(it)
        t = time.perf_counter()
        on_batch(b)
    return t - t0, time.process_time() - c0


def measure(make: Callable[[], Any], warmup: float, seconds: float, latency_n: int,
            pace: float) -> dict[str, float]:
    slept = sleep_cpu(pace)  # taken off the paced phase's CPU: the trainer's, not delivery's
    loader = make()
    try:
        it = iter(loader)
        sizes: list[int] = []  # throughput: back to back
        wall, cpu = back_to_back(it, warmup, seconds,
                                 lambda b: sizes.append(b.nbytes))
        n, nbytes = len(sizes), sum(sizes)
        # ready latency: the trainer computes (sleeps) between asks; the sidecar is ahead
        lat = []
        paced_bytes = 0
        c1 = time.process_time()
        for _ in range(latency_n):
            time.sleep(pace)
            a = time.perf_counter()
            b = next(it)
            lat.append(time.perf_counter() - a)
            paced_bytes += b.nbytes
        paced_cpu = time.process_time() - c1 - latency_n * slept
        it.close()
    finally:
        loader.close()
    mb = nbytes / 1e6
    return {"mb_per_s": n / wall, "MB_per_s": mb / wall, "cpu_ms_per_MB": 1e3 * cpu / mb,
            "cpu_s_per_GB": cpu / (nbytes / 1e9),
            "paced_cpu_ms_per_MB": 1e3 * paced_cpu / (paced_bytes / 1e6),
            "p50_ms": 1e3 * pct(lat, 0.50), "p99_ms": 1e3 * pct(lat, 0.99),
            "microbatches": n, "load1": load1()}


class ReplayEngine:
    """Stands in for ``InProcessLoader``'s engine: real steps (and their state) in a loop."""

    def __init__(self, steps: list[Any], states: list[dict[str, Any]], plan: Any) -> None:
        self.steps, self.states, self.plan = steps, states, plan
        self._i = 0
        self._state = states[0]

    @property
    def step(self) -> int:  # the next step (InProcessLoader compares it with its position)
        return self._i

    @property
    def schema(self) -> Any:  # the recipe's sample schema (InProcessLoader's Batch.schema)
        return self.plan.schema

    def next_step(self) -> Any:
        k, r = divmod(self._i, len(self.steps))
        self._i += 1
        self._state = self.states[r]
        step = self.steps[r]
        return dataclasses.replace(step, step=step.step + k * len(self.steps)) if k else step

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state: Any) -> None:
        pass

    def close(self) -> None:
        pass


def producer_rate(make: Callable[[], Any], warmup: float, seconds: float) -> dict[str, float]:
    """End-to-end document tokens/s (positions >= 0) and payload tokens/s of a real stream."""
    loader = make()
    docs: list[int] = []
    payloads: list[int] = []
    nbytes: list[int] = []

    def count(b: Any) -> None:
        docs.append(int((b.positions >= 0).sum()))
        payloads.append(b.positions.size)
        nbytes.append(b.nbytes)

    try:
        wall, cpu = back_to_back(iter(loader), warmup, seconds, count)
    finally:
        loader.close()
    doc, payload = sum(docs), sum(payloads)
    return {"doc_tokens_per_s": doc / wall, "payload_tokens_per_s": payload / wall,
            "MB_per_s": sum(nbytes) / 1e6 / wall, "trainer_cpu_cores": cpu / wall,
            "load1": load1()}


# -- the run -----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="throughput window per config")
    ap.add_argument("--warmup", type=float, default=0.3)
    ap.add_argument("--latency-n", type=int, default=1000)
    ap.add_argument("--pace-ms", type=float, default=2.0,
                    help="trainer compute between asks in the latency phase")
    ap.add_argument("--producer-seconds", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=8)
    ap.add_argument("--replay-steps", type=int, default=2,
                    help="distinct real steps the replay cycles through")
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"of {', '.join(SIZES)}")
    ap.add_argument("--only", default="", help="comma-separated variant names (debugging)")
    ap.add_argument("--no-producer", action="store_true", help="skip the end-to-end part")
    ap.add_argument("--out", default=str(HERE / "results" / "serve.json"))
    # the replay sidecar child
    ap.add_argument("--replay-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay_server:
        sys.exit(replay_server(args))

    import yaml

    from datalane.client import InProcessLoader, SidecarLoader
    from datalane.corpus import make_corpus
    from datalane.engine.loader import Loader
    from datalane.spec.recipe import load_recipe

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="datalane-serve-"))
    try:
        corpus = make_corpus(str(work / "corpus"), web_docs=2000)
        rdict = recipe_dict(corpus)
        recipe_path = work / "recipe.yaml"
        recipe_path.write_text(yaml.safe_dump(rdict))
        recipe = load_recipe(rdict)

        # real steps for the in-process replay (the sidecar replay produces its own, alike)
        steps, states = [], []
        with Loader(recipe, 0, 1) as eng:
            plan = eng.plan
            for _ in range(args.replay_steps):
                steps.append(eng.next_step())
                states.append(eng.state_dict())

        def inprocess(mb: int) -> Callable[[], Any]:
            def make() -> Any:
                il = InProcessLoader(recipe, 0, 1, mb)
                il._loader.close()
                il._loader = ReplayEngine(steps, states, plan)  # type: ignore[assignment]
                return il
            return make

        sizes = {k: SIZES[k] for k in args.sizes.split(",")}
        only = {v.strip() for v in args.only.split(",") if v.strip()}
        variants = [v for v in VARIANTS if not only or v[0] in only]
        socket = str(work / "replay" / "dl.sock")
        (work / "replay").mkdir()
        rows: dict[tuple[str, str], list[dict[str, float]]] = {}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--replay-server", "--socket",
               socket, "--recipe", str(recipe_path), "--workers", str(args.workers),
               "--prefetch", str(args.prefetch), "--replay-steps", str(args.replay_steps)]
        with sidecar_process(cmd, socket, work / "replay.log"):
            def sidecar(mb: int, transport: str, copy: bool) -> Callable[[], Any]:
                return lambda: SidecarLoader(socket, rank=0, world_size=1, microbatch_size=mb,
                                             transport=transport, copy=copy)

            for mb in sizes.values():  # the replay produces its microbatches on first open
                with SidecarLoader(socket, rank=0, world_size=1, microbatch_size=mb) as sl:
                    next(iter(sl))
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}  load {load1():.2f}", file=sys.stderr)
                for label, mb in sizes.items():
                    configs: list[tuple[str, Callable[[], Any]]] = [
                        (name, sidecar(mb, transport, copy)) for name, transport, copy in variants]
                    configs.append(("in-process", inprocess(mb)))
                    for name, make in configs:
                        res = measure(make, args.warmup, args.seconds, args.latency_n,
                                      args.pace_ms / 1e3)
                        rows.setdefault((label, name), []).append(res)
                        print(f"  {label:>6} {name:<12} {res['mb_per_s']:9.0f} mb/s "
                              f"{res['MB_per_s']:8.0f} MB/s {res['cpu_ms_per_MB']:6.3f} ms/MB "
                              f"p50 {res['p50_ms']:.3f} p99 {res['p99_ms']:.3f} ms  "
                              f"load {res['load1']:.2f}", file=sys.stderr)

        producer: dict[str, dict[str, float]] = {}
        if not args.no_producer:
            print("producer (real engine, end to end)", file=sys.stderr)
            mb = SIZES["1MiB"]
            producer["in-process"] = producer_rate(
                lambda: InProcessLoader(recipe, 0, 1, mb, None), 1.0, args.producer_seconds)
            real_socket = str(work / "real" / "dl.sock")
            (work / "real").mkdir()
            cmd = [sys.executable, "-m", "datalane_sidecar", "serve", "--socket", real_socket,
                   "--recipe", str(recipe_path), "--workers", str(args.workers),
                   "--prefetch", str(args.prefetch), "--log-level", "warning"]
            with sidecar_process(cmd, real_socket, work / "real.log"):
                producer["sidecar shm"] = producer_rate(
                    lambda: SidecarLoader(real_socket, rank=0, world_size=1,
                                          microbatch_size=mb, transport="shm"),
                    1.0, args.producer_seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in rows.items()}
    load_end = os.getloadavg()
    loads = [x["load1"] for v in rows.values() for x in v]
    print(f"\n{started}, {platform.node()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}; median of {args.rounds} interleaved rounds; "
          f"load average (1 min) {load_start[0]:.2f} at start, {min(loads):.2f}-{max(loads):.2f} "
          f"while measuring, {load_end[0]:.2f} at end")
    print("\n| size | mode | microbatches/s | MB/s | trainer CPU ms/MB, full speed | "
          "trainer CPU ms/MB, paced | ready p50 ms | ready p99 ms | load |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (label, name), m in med.items():
        print(f"| {label} | {name} | {m['mb_per_s']:,.0f} | {m['MB_per_s']:,.0f} | "
              f"{m['cpu_ms_per_MB']:.3f} | {m['paced_cpu_ms_per_MB']:.3f} | "
              f"{m['p50_ms']:.3f} | {m['p99_ms']:.3f} | {m['load1']:.2f} |")
    verdict: dict[str, dict[str, bool]] = {}
    for name, _, _ in variants:
        v: dict[str, bool] = {}
        if ("64KiB", name) in med:
            v[">= 5,000 microbatches/s at 64 KiB"] = \
                med["64KiB", name]["mb_per_s"] >= TARGETS["mb_per_s_64KiB"]
        if ("1MiB", name) in med:
            v[">= 1 GB/s at 1 MiB"] = med["1MiB", name]["MB_per_s"] >= TARGETS["MB_per_s_1MiB"]
        for label in sizes:
            m = med[label, name]
            v[f"<= 1 ms CPU/MB at {label} (full speed, paced)"] = \
                max(m["cpu_ms_per_MB"], m["paced_cpu_ms_per_MB"]) <= TARGETS["cpu_ms_per_MB"]
        v["p99 <= 2 ms"] = max(med[label, name]["p99_ms"] for label in sizes) <= TARGETS["p99_ms"]
        verdict[name] = v
    print("\ntargets (through the socket):")
    for name, v in verdict.items():
        print(f"  {name}:")
        for k, ok in v.items():
            print(f"    {'MET   ' if ok else 'missed'}  {k}")
    if producer:
        print("\nproducer, real engine end to end (microbatch 64 x 2048):")
        for name, p in producer.items():
            print(f"  {name:<12} {p['doc_tokens_per_s']:>12,.0f} document tokens/s  "
                  f"{p['payload_tokens_per_s']:>12,.0f} payload tokens/s  "
                  f"{p['MB_per_s']:6.1f} MB/s  load {p['load1']:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "started": started, "cores": os.cpu_count(), "rounds": args.rounds,
        "load_start": load_start, "load_end": load_end,
        "transport": [{"size": k[0], "mode": k[1], **m, "rounds": rows[k]}
                      for k, m in med.items()],
        "targets": verdict, "producer": producer}, indent=1))
    print(f"\nwritten to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
