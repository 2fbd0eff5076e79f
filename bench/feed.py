#!/usr/bin/env python3
"""The feed test (issue 19): does one sidecar keep N ranks fed at a GPU's token rate?

    .venv/bin/python bench/feed.py                        # 8 ranks at 60k tokens/s each
    .venv/bin/python bench/feed.py --search               # the highest rate each sustains
    .venv/bin/python bench/feed.py --quick                # the CI size (seconds)

One real ``datalane-sidecar serve`` process on a Unix socket (a fresh one per trial; pinned to
``--sidecar-cpus`` if given) and ``--ranks`` rank processes (pinned to ``--rank-cpus``), each a
``SidecarLoader`` of rank ``r`` of ``N`` reading microbatches of ``--microbatch`` sequences of
2,048 tokens, for each of three recipes of ``bench/node_paths.py`` (8 lanes: ``text`` = Parquet
text, ``chat``, ``pretokenized`` = a Megatron dataset). A rank consumes like a training step on
a GPU at ``--rate`` tokens/s: it asks for the next microbatch, then sleeps to the end of the
step's compute time (the microbatch's tokens / rate) - the asynchronous GPU computes while the
trainer fetches, so a step lasts ``max(compute, wait)``, on a schedule (``rank_child``). The ranks
connect, take a first microbatch, start together, consume ``--warmup`` seconds uncounted, then
``--seconds`` counted. Per step the rank records its wait (asking to holding the microbatch).

The default warm-up (30 s) outlasts the start, when every lane fills its read-ahead
(``--prefetch`` map tasks of up to 256 documents per lane: about 1 M tokens a lane here) at
full speed beside the steps it serves; the counted window is the steady state a training run
lives in. ``--warmup 2`` measures the start instead (docs/benchmarks.md has both).

Reported per recipe, over every rank's counted steps:

* **waited**: steps whose microbatch was not ready when asked (wait > ``--ready-ms``, default
  2 ms; a ready microbatch takes 0.1-0.7 ms through the socket, docs/benchmarks.md): the
  sidecar's queue for that rank had run dry;
* **stalled**: steps that waited longer than their compute (the GPU would have idled), and the
  idle share of the window;
* the p50 and p99 wait, the rate each rank achieved, and the sidecar's CPU (cores) meanwhile.

``--rank-processes N`` runs the sidecar's sessions in N rank worker processes (``auto``: one
per rank; 0, the default: threads of one process); the sidecar's CPU then counts the whole
process tree, and each worker's resident memory (from the Stats call, at the trial's end) is
reported. ``--rate 1e9`` makes the ranks consume flat out: "achieved per rank" is then the
sidecar's throughput (the process-mode comparison of docs/benchmarks.md).

``--search`` finds, per recipe, the highest rate per rank that *holds* - under 1% of steps
waited and the ranks achieved 98% of the rate or more (ranks short of CPU fall behind without
waiting) - doubling or halving from ``--rate`` until it brackets the edge, then bisecting to within
``--precision``. Results: a markdown table on stdout and ``bench/results/feed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import node_paths  # noqa: E402

TOKENS = node_paths.SEQ_LEN + 1
TARGET_WAITED = 0.01  # the search's bound: under 1% of steps waited ...
TARGET_ACHIEVED = 0.98  # ... and the ranks consumed at 98% of the rate or more


def held(res: dict[str, Any]) -> bool:
    """A trial holds its rate when under 1% of its steps waited and the ranks kept their pace:
    a rank that cannot (its own CPU is short: ranks pinned to few cores) falls behind without
    any step waiting, and would otherwise pass at any rate."""
    return bool(res["waited"] < TARGET_WAITED
                and res["achieved_per_rank"] >= TARGET_ACHIEVED * res["rate"])


# -- one rank (a child process) ------------------------------------------------------------------

def rank_child(args: argparse.Namespace) -> None:
    """Connect, say READY, read the start time from stdin, consume paced; one JSON line."""
    from datalane.client.sidecar import SidecarLoader

    compute = args.microbatch * TOKENS / args.rate  # one step's GPU time
    with SidecarLoader(args.socket, rank=args.rank, world_size=args.world,
                       microbatch_size=args.microbatch) as loader:
        it = iter(loader)
        next(it)
        print("READY", flush=True)
        start = float(sys.stdin.readline())
        time.sleep(max(0.0, start - time.time()))
        # the counted window, on this clock, the same for every rank: a rank still waiting
        # when it opens (for a microbatch asked for before) has that wait counted, not skipped
        first = time.perf_counter() + (start + args.warmup - time.time())
        stop = first + args.seconds
        waits: list[float] = []
        tokens = 0
        last = first
        # The steps keep a schedule: step i is due at ``due`` and ends at due + compute, or
        # when its microbatch came if that is later (the GPU waited). Sleeping to the next due
        # time, not for a duration, keeps a timer's overshoot from adding up over thousands
        # of steps; a rank late by more than a step's slack (its own CPU short) falls behind.
        # The ranks' schedules are spread over a step (rank r starts r/N of a step late): in
        # a job they step together, each on cores of its own; here they share a core or two,
        # and asking at one instant would measure their queue for that CPU, not the sidecar.
        due = time.perf_counter() + compute * args.rank / args.world
        while True:
            asked = time.perf_counter()
            if asked >= stop:
                break
            batch = next(it)
            got = time.perf_counter()
            due = max(due + compute, got)
            if got >= first:
                waits.append(got - max(asked, first))
                tokens += batch.input_ids.size
                last = due
            time.sleep(max(0.0, due - time.perf_counter()))
        # the window's real length: a rank the sidecar starved waited for its last microbatch
        # past the window's end, and that time counts
        last = max(last, time.perf_counter())
    print(json.dumps({"rank": args.rank, "waits": waits, "tokens": tokens,
                      "wall": last - first, "compute": compute}), flush=True)


# -- one trial: a sidecar and N ranks at one rate ------------------------------------------------

def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every live process under it (rank workers are children of
    the sidecar's forkserver)."""
    import scaling

    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += scaling.proc_cpu(p)
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
        todo.extend(children.get(p, []))
    return total


def rank_workers(socket: str) -> dict[str, Any]:
    """The sidecar's rank workers (pid, resident bytes) from its Stats call; {} in thread
    mode."""
    import grpc

    from datalane.wire import datalane_pb2 as pb
    from datalane.wire import datalane_pb2_grpc as pbg

    with grpc.insecure_channel(f"unix://{socket}") as channel:
        reply = pbg.DataLaneStub(channel).Stats(pb.StatsRequest(), timeout=30)
    workers: dict[str, Any] = json.loads(reply.json).get("rank_workers", {})
    return workers


def rss_mb(pid: int) -> float:
    """Resident memory of a live process, in MiB."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)

def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def summarize(ranks: list[dict[str, Any]], ready: float) -> dict[str, Any]:
    """The trial's figures from every rank's waits (seconds) and compute time per step."""
    waits = [w for r in ranks for w in r["waits"]]
    stalls = [max(0.0, w - r["compute"]) for r in ranks for w in r["waits"]]
    walls = sum(r["wall"] for r in ranks)
    return {
        "steps": len(waits),
        "waited": sum(w > ready for w in waits) / len(waits) if waits else 1.0,
        "stalled": sum(s > 0 for s in stalls) / len(waits) if waits else 1.0,
        "idle_share": sum(stalls) / walls if walls else 1.0,
        "p50_ms": 1e3 * pct(waits, 0.50), "p99_ms": 1e3 * pct(waits, 0.99),
        "achieved_per_rank": statistics.mean(r["tokens"] / r["wall"] for r in ranks
                                             if r["wall"] > 0) if walls else 0.0,
    }


def trial(args: argparse.Namespace, recipe: Path, rate: float) -> dict[str, Any]:
    import scaling
    import serve

    work = Path(tempfile.mkdtemp(prefix="datalane-feed-"))
    socket = str(work / "dl.sock")
    cmd = [sys.executable, "-m", "datalane_sidecar", "serve", "--socket", socket, "--recipe",
           str(recipe), "--workers", str(args.workers), "--prefetch", str(args.prefetch),
           "--ranks-per-pod", str(args.ranks), "--log-level", "warning",
           "--rank-processes", args.rank_processes, "--map-processes", str(args.map_processes)]
    if args.sidecar_cpus:
        cmd = scaling.pinned(cmd, [int(c) for c in args.sidecar_cpus.split(",")])
    me = [sys.executable, str(Path(__file__).resolve()), "--rank-child", "--socket", socket,
          "--world", str(args.ranks), "--microbatch", str(args.microbatch), "--rate", str(rate),
          "--warmup", str(args.warmup), "--seconds", str(args.seconds)]
    if args.rank_cpus:
        me = scaling.pinned(me, [int(c) for c in args.rank_cpus.split(",")])
    with serve.sidecar_process(cmd, socket, work / "sidecar.log") as sidecar:
        procs = [subprocess.Popen([*me, "--rank", str(r)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(args.ranks)]
        for r, p in enumerate(procs):
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "READY":
                raise SystemExit(f"rank {r} did not start: {line}{p.communicate()[1][-3000:]}")
        start = time.time() + 0.2
        cpu0 = tree_cpu(sidecar.pid)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{start}\n")
            p.stdin.flush()
        time.sleep(args.warmup + args.seconds * 0.9)  # the workers' memory near the end
        workers = {k: round(w["rss_bytes"] / (1 << 20), 1)
                   for k, w in rank_workers(socket).items()}
        server_mb = round(rss_mb(sidecar.pid), 1)
        ranks = []
        for r, p in enumerate(procs):
            out, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"rank {r} failed ({p.returncode}):\n{err[-3000:]}")
            ranks.append(json.loads(out.strip().splitlines()[-1]))
        span = time.time() - start
        sidecar_cores = (tree_cpu(sidecar.pid) - cpu0) / span
    res = {"rate": rate, **summarize(ranks, args.ready_ms / 1e3),
           "sidecar_cores": sidecar_cores, "load1": os.getloadavg()[0],
           "rank_processes": args.rank_processes, "server_rss_mb": server_mb,
           "worker_rss_mb": workers}
    ok = "ok  " if held(res) else "WAIT" if res["waited"] >= TARGET_WAITED else "SLOW"
    print(f"  {ok} {recipe.stem:<13} {rate:>10,.0f} tokens/s/rank: {res['steps']} steps, "
          f"waited {res['waited']:.1%}, stalled {res['stalled']:.1%}, p50 {res['p50_ms']:.2f} "
          f"p99 {res['p99_ms']:.2f} ms, sidecar {sidecar_cores:.2f} cores, load "
          f"{res['load1']:.1f}, achieved {res['achieved_per_rank']:,.0f} tokens/s/rank, "
          f"RSS server {server_mb:.0f} MiB, workers {workers} MiB", file=sys.stderr)
    return res


def search(run: Callable[[float], dict[str, Any]], rate: float, precision: float,
           max_trials: int) -> tuple[float | None, list[dict[str, Any]]]:
    """The highest rate that holds (:func:`held`), found with ``run(rate)`` (one trial):
    doubling from ``rate`` while it holds (halving while it does not), then bisecting
    (geometrically) until the rate that did not is within ``1 + precision`` of the one that
    held, or ``max_trials``. Returns that rate - None when no rate tried held - and the
    trials."""
    trials: list[dict[str, Any]] = []
    good, bad = None, None
    while len(trials) < max_trials:
        res = run(rate)
        trials.append(res)
        if held(res):
            good = max(good or 0.0, rate)
        else:
            bad = rate if bad is None else min(bad, rate)
        if good is None:
            rate /= 2
        elif bad is None:
            rate *= 2
        elif bad / good <= 1 + precision:
            break
        else:
            rate = (good * bad) ** 0.5
    return good, trials


def table(results: dict[str, dict[str, Any]], ranks: int) -> str:
    lines = [f"| recipe | rate per rank (tokens/s) | x {ranks} ranks | steps | waited | stalled "
             "| GPU idle | p50 wait ms | p99 wait ms | achieved per rank | sidecar cores |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        for t in r["trials"]:
            lines.append(f"| {name} | {t['rate']:,.0f} | {t['rate'] * ranks / 1e6:.2f} M | "
                         f"{t['steps']} | {t['waited']:.1%} | {t['stalled']:.1%} | "
                         f"{t['idle_share']:.1%} | {t['p50_ms']:.2f} | {t['p99_ms']:.2f} | "
                         f"{t['achieved_per_rank']:,.0f} | {t['sidecar_cores']:.2f} |")
    return "\n".join(lines)


def header(started: str, load_start: float) -> str:
    """The machine and its load, for a results header."""
    return (f"{started}, {platform.node()}, {os.cpu_count()} CPUs, load average "
            f"{load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end")


def pinning(args: argparse.Namespace) -> str:
    """Where the sidecar and the ranks were pinned, if they were (``--sidecar-cpus``,
    ``--rank-cpus``)."""
    return ((f" on CPUs {args.sidecar_cpus}" if args.sidecar_cpus else "")
            + (f", ranks on CPUs {args.rank_cpus}" if args.rank_cpus else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--recipes", default=",".join(node_paths.FEED_RECIPES),
                    help=f"of {', '.join(node_paths.FEED_RECIPES)}")
    ap.add_argument("--rate", type=float, default=60_000.0,
                    help="tokens/s per rank (the search's first rate)")
    ap.add_argument("--microbatch", type=int, default=2, help="sequences per microbatch")
    ap.add_argument("--seconds", type=float, default=6.0, help="counted window per trial")
    ap.add_argument("--warmup", type=float, default=30.0,
                    help="uncounted seconds first (the read-ahead fills for about 12 s on 2 "
                         "cores, 25 s on 1: a shorter warm-up measures the fill)")
    ap.add_argument("--ready-ms", type=float, default=2.0,
                    help="a wait longer than this means the microbatch was not ready")
    ap.add_argument("--workers", type=int, default=2, help="the sidecar's map workers")
    ap.add_argument("--prefetch", type=int, default=8, help="the sidecar's --prefetch")
    ap.add_argument("--rank-processes", default="0",
                    help="the sidecar's --rank-processes (0: threads; N; auto)")
    ap.add_argument("--map-processes", type=int, default=0,
                    help="the sidecar's --map-processes (0: map stages on threads)")
    ap.add_argument("--sidecar-cpus", default="", help="pin the sidecar, e.g. 0-3 as 0,1,2,3")
    ap.add_argument("--rank-cpus", default="",
                    help="pin the rank processes (as a node gives the trainers cores of their own)")
    ap.add_argument("--search", action="store_true", help="the highest sustained rate")
    ap.add_argument("--precision", type=float, default=0.25, help="the search's bracket")
    ap.add_argument("--max-trials", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="CI size: tiny corpus, short trials")
    ap.add_argument("--corpus", type=Path, help="corpus folder (default ~/.cache/datalane/...)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "feed.json")
    # a rank
    ap.add_argument("--rank-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_child:
        return rank_child(args)
    if args.quick:
        args.seconds, args.warmup, args.max_trials = 1.0, 1.0, min(args.max_trials, 2)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = os.getloadavg()[0]
    recipes = node_paths.make(args.corpus or node_paths.default_root(args.quick), args.quick)
    results: dict[str, dict[str, Any]] = {}
    for name in args.recipes.split(","):
        recipe = recipes[node_paths.FEED_RECIPES[name]]
        if args.search:
            best, trials = search(lambda rate, r=recipe: trial(args, r, rate), args.rate,
                                  args.precision, args.max_trials)
        else:
            trials = [trial(args, recipe, args.rate)]
            best = args.rate if held(trials[0]) else None
        results[name] = {"sustained": best, "trials": trials}
    print(f"\n{header(started, load_start)}; {args.ranks} ranks, microbatch {args.microbatch} "
          f"x {TOKENS} tokens, {args.seconds:g} s counted per trial, sidecar --workers "
          f"{args.workers} --rank-processes {args.rank_processes} --map-processes "
          f"{args.map_processes}{pinning(args)}\n")
    print(table(results, args.ranks))
    print()
    for name, r in results.items():
        best = r["sustained"]
        capped = best and not any(t["rate"] > best for t in r["trials"])  # none above failed
        said = (f"{'at least ' if capped else ''}{best:,.0f} tokens/s per rank "
                f"({best * args.ranks / 1e6:.2f} M for the node)" if best
                else "none of the rates tried")
        print(f"{name}: sustained (under 1% of steps waiting, 98% of the rate): {said}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"started": started, "ranks": args.ranks,
                                    "args": {k: str(v) for k, v in vars(args).items()},
                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
