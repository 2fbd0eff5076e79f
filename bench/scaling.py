#!/usr/bin/env python3
"""The cost model of serving a recipe (issue 19): CPU and GIL seconds per million tokens.

    .venv/bin/python bench/scaling.py                  # 5 paths x 2 modes, 1 and 2 cores
    .venv/bin/python bench/scaling.py --quick          # the CI size: a tiny corpus, seconds
    .venv/bin/python bench/scaling.py --cores 1,2,4,8,14 --client-cpus 14,15   # a 16-core node
    .venv/bin/python bench/scaling.py --cores 1 --client-cpus 1 --modes sidecar   # 2 CPUs: the base
    .venv/bin/python bench/scaling.py --modes inprocess-mp --paths chat   # map processes
    .venv/bin/python bench/scaling.py --calibrate      # the GIL measurement against a known load
    .venv/bin/python bench/scaling.py --publish        # the plot to docs/node-scaling.png

For each path (``bench/node_paths.py``: text JSONL, text Parquet, chat, Megatron and flat token
files; 8 lanes, global batch 64 x 2,048 tokens, sources repeating) and each mode - the engine
in process (``Loader.microbatches(8)``, what an in-process trainer runs) and one real
``datalane-sidecar serve`` process read by a ``SidecarLoader`` over its Unix socket (as
``bench/serve.py`` does) - a fresh child process is pinned to the first ``k`` CPUs of this
process's affinity (what ``taskset -c 0`` / ``taskset -c 0,1`` does; the sidecar it starts
inherits it) and measures, after a warm-up, over ``--seconds``:

* **tokens/s**: sequence tokens delivered (``input_ids.size``: what a GPU step consumes, padding
  included) over wall time;
* **C, CPU-seconds per million tokens**: ``/proc/<pid>/stat`` utime + stime of every process
  serving the tokens (the sidecar and the reading client; in process, the one process);
* **G, GIL-held seconds per million tokens** (a separate, profiled run at 1 core): ``py-spy
  record --gil --nonblocking --threads`` on the serving process (the sidecar, or the in-process
  loader) at ``--rate`` Hz for the window: py-spy keeps a sample only when a thread holds the
  GIL and is running or runnable (not idle), so samples / (rate x seconds) is the share of wall
  time the GIL was held by a thread with work; times wall per million tokens gives G. Beside
  it, the CPU of the threads that ran Python in the window (the thread ids py-spy saw, and
  ``threading.enumerate`` in process) is an upper bound: those threads also run native code
  with the GIL released (hashing, Arrow, the tokenizer's caller waits for rayon's threads).

``--modes`` also takes ``inprocess-mp`` and ``sidecar-mp``: the same with the map stages in
one child process per core (``knobs.map_processes``, ``--map-processes``;
datalane/engine/mapprocs.py). C then counts the map processes' CPU too (the serving process's
tree), and G is still the serving process's: each map process has its own GIL, so only the
parent's is serial.

Each configuration warms up past the read-ahead's fill (at least ``--fill-seconds`` over the
cores of each of its processes: a window opened during the fill counts work banked ahead), and
each round first measures what ``k`` CPUs give together (:func:`machine_efficiency`): the
predictions count effective cores.

The model (Amdahl, the GIL-held part serial, the rest parallel on N cores; workers = cores):
``tokens/s(N) = 1e6 / (G + (C - G) / N)``; ``P`` processes with their own GIL on N cores:
``P x 1e6 / (G + (C - G) x P / N)``. It is validated on this machine: G and C of the 1-core
runs predict the rate of 1 process on 2 cores and of 2 processes (ranks 0 and 1 of 2) on 2
cores, which are then measured (target: within 15%). The projection for a node uses the
sidecar's own C and G (the trainers' clients are the ranks' processes, on their own cores),
for one process and for the sidecar's rank workers (``--rank-processes``: one process per
rank, :data:`RANK_WORKERS` on an 8-GPU node, so ``P = min(8, N)`` with their own GIL each).

``--client-cpus`` gives the sidecar's reading client CPUs of its own: the sidecar is then
pinned to the first ``k`` of the other CPUs (and the in-process loader too), and its rows are
modelled on the sidecar's own CPU. Without it the client shares the sidecar's ``k`` CPUs, and
at 1 core the two wait on each other's turn: not a base for the sidecar's model (a trainer's
client never runs on the sidecar's cores).

Errors of G (``--calibrate`` measures them on this machine): py-spy's sampling (binomial: about
``sqrt(n)`` of ``n`` samples, 3% at 1,000); a GIL holder that is runnable but not running (its
core taken by a native thread or another process) counts as holding, so on a loaded or a
1-core machine G is an upper bound of the GIL-held CPU; py-spy falling behind its rate under
load lowers it (it warns). Medians of ``--rounds`` interleaved rounds are reported.

Results: a markdown table (stdout and ``bench/results/scaling.md``), ``scaling.json`` and the
plot ``scaling.png`` of projected tokens/s against cores (1..192) per path in ``--out``
(default ``bench/results``); ``--publish`` also writes the plot to ``docs/node-scaling.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import node_paths  # noqa: E402

QUICK_PATHS = "text_parquet,chat,megatron"
MICROBATCH = 8  # sequences per microbatch: one lane's rows of a step
MODES = ("inprocess", "sidecar")
#: the same with the map stages in one child process per core (``knobs.map_processes``):
#: ``inprocess-mp``, ``sidecar-mp``
MP = "-mp"
ALL_MODES = (*MODES, *(m + MP for m in MODES))
PROJECT_CORES = (1, 2, 4, 8, 16, 32, 64, 128, 192)
RANK_WORKERS = 8  # the sidecar's rank worker processes on an 8-GPU node: one per rank
NODE_TARGET = 8 * 60_000  # 8 H100s training a 1B model, about 60k tokens/s each (issue 19)
TICK = os.sysconf("SC_CLK_TCK")


# -- the model -----------------------------------------------------------------------------------

def amdahl(cpu: float, gil: float, cores: float, procs: int = 1) -> float:
    """Tokens/s of ``procs`` processes (each with its own GIL) on ``cores`` cores, from the CPU
    seconds ``cpu`` and the GIL-held seconds ``gil`` per million tokens: per process, the
    GIL-held part is serial and the rest shares the process's ``cores / procs`` cores."""
    serial = min(gil, cpu)
    return procs * 1e6 / (serial + (cpu - serial) * procs / cores)


def rank_workers(cpu: float, gil: float, cores: float, ranks: int = RANK_WORKERS) -> float:
    """Tokens/s of the sidecar with one rank worker process per rank (``--rank-processes``)
    on ``cores`` cores: ``min(ranks, cores)`` processes, each with its own GIL (a process
    needs a core of its own for its serial part, so fewer cores than ranks means fewer
    processes busy at once)."""
    return amdahl(cpu, gil, cores, max(1, min(ranks, int(cores))))


# -- measuring in a child process ----------------------------------------------------------------

def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds of ``root`` and of each live process below it (its map processes, its
    rank workers and theirs), by pid."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    out = {}
    for pid, (_, cpu) in stats.items():
        p = pid
        while p != root and p in stats and p > 1:
            p = stats[p][0]
        if p == root:
            out[pid] = cpu
    return out


def cpu_since(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU a process tree used between two :func:`tree_cpu` readings (a process started
    meanwhile counts from 0)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def thread_sched(pid: int) -> dict[int, tuple[float, float]]:
    """Each live thread of ``pid``: (seconds on a CPU, seconds runnable but waiting for one),
    from ``/proc/<pid>/task/<tid>/schedstat``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):  # ended meanwhile, or no schedstat in this kernel
            continue
        out[int(task.name)] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return out


def busiest_thread(pid: int, before: dict[int, tuple[float, float]],
                   after: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """The serving process's thread that ran longest between two :func:`thread_sched`
    readings: one thread cannot use a second core, so its CPU bounds the rate whatever the
    GIL does. Named when it is a Python thread of this process (in process), else its tid."""
    ran = {tid: run - before.get(tid, (0.0, 0.0))[0] for tid, (run, _) in after.items()}
    if not ran:
        return {}
    tid = max(ran, key=lambda t: ran[t])
    names = {t.native_id: t.name for t in threading.enumerate()} if pid == os.getpid() else {}
    return {"busiest_thread": names.get(tid, f"tid {tid}"), "busiest_cpu": ran[tid]}


_PIN = "import os, sys; os.sched_setaffinity(0, map(int, sys.argv[1].split(','))); " \
       "os.execvp(sys.argv[2], sys.argv[2:])"


def pinned(cmd: list[str], cpus: list[int] | set[int]) -> list[str]:
    """``cmd`` run on ``cpus`` only (what ``taskset -c`` does; children inherit it)."""
    return [sys.executable, "-c", _PIN, ",".join(map(str, sorted(cpus))), *cmd]


def pyspy_binary() -> str | None:
    """``$PYSPY``, ``py-spy`` beside this interpreter, or on PATH."""
    for cand in (os.environ.get("PYSPY"), str(Path(sys.executable).parent / "py-spy"),
                 shutil.which("py-spy")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


_THREAD = re.compile(r"^thread \((0x[0-9a-fA-F]+|\d+)\)")


def parse_raw(text: str) -> dict[int, int]:
    """py-spy's ``--format raw --threads`` output: samples per thread id (each line is a
    stack, ``thread (TID): name;frame;...`` then its count; -1: a line naming no thread)."""
    samples: dict[int, int] = {}
    for line in text.splitlines():
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        m = _THREAD.match(head)
        tid = int(m.group(1), 0) if m else -1
        samples[tid] = samples.get(tid, 0) + int(count)
    return samples


class GilProbe:
    """py-spy recording one process's GIL holders for ``seconds`` (started now), with each
    thread's scheduler times at both ends.

    py-spy counts a sample when a thread holds the GIL and is not idle, which includes a
    holder that is runnable but waiting for a CPU (taken by a native thread of the process or
    by another process). Each thread's samples are therefore weighted by the share of its
    runnable time it spent on a CPU over the window (``schedstat``): GIL-held *CPU* time, the
    serial work, and not its wall time, which grows with the load of the machine."""

    def __init__(self, pid: int, seconds: float, rate: int, workdir: Path) -> None:
        self.pid, self.seconds, self.rate = pid, seconds, rate
        self.out = workdir / f"pyspy-{pid}-{time.monotonic_ns()}.raw"
        binary = pyspy_binary()
        if binary is None:
            raise SystemExit("py-spy not found (pip install py-spy, or set $PYSPY)")
        all_cpus = set(range(os.cpu_count() or 1))  # py-spy: not pinned with its target
        self.threads0 = thread_sched(pid)
        self.proc = subprocess.Popen(pinned(  # off the measured cores where there are others
            [binary, "record", "--pid", str(pid), "--gil", "--nonblocking", "--threads",
             "--rate", str(rate), "--duration", str(max(1, round(seconds))), "--format", "raw",
             "-o", str(self.out)], all_cpus), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def running(self) -> bool:
        return self.proc.poll() is None

    def result(self) -> dict[str, Any]:
        log = self.proc.communicate()[0].decode(errors="replace")
        if self.proc.returncode != 0 or not self.out.exists():
            raise SystemExit(f"py-spy failed ({self.proc.returncode}): {log[-2000:]}")
        threads1 = thread_sched(self.pid)
        samples = parse_raw(self.out.read_text())
        instants = self.rate * max(1, round(self.seconds))
        held = oncpu = py_cpu = 0.0
        for tid, n in samples.items():
            run0, wait0 = self.threads0.get(tid, (0.0, 0.0))
            run1, wait1 = threads1.get(tid, (run0, wait0))
            run, wait = run1 - run0, wait1 - wait0
            held += n / instants
            oncpu += n / instants * (run / (run + wait) if run + wait > 0 else 1.0)
            py_cpu += run
        return {"gil_share": oncpu, "gil_share_uncorrected": held,
                "gil_samples": sum(samples.values()), "python_tids": sorted(samples),
                "python_thread_cpu": py_cpu, "pyspy_behind": "behind in sampling" in log}


@dataclass
class Window:
    tokens: int = 0
    wall: float = 0.0
    cpu: float = 0.0  # every serving process
    server_cpu: float = 0.0  # the sidecar alone (in process: the process)


def _batches(args: argparse.Namespace, recipe_path: str, work: Path) -> Iterator[Any]:
    """Microbatches of the path; yields the serving process's pid first."""
    from datalane.engine.loader import Loader
    from datalane.spec.knobs import Knobs
    from datalane.spec.recipe import load_recipe

    if args.mode.removesuffix(MP) == "inprocess":
        with Loader(load_recipe(recipe_path), args.rank, args.world,
                    Knobs(workers=args.workers, map_processes=args.map_processes)) as loader:
            yield os.getpid()
            yield from loader.microbatches(MICROBATCH)
        return
    import serve

    from datalane.client.sidecar import SidecarLoader

    socket = str(work / "dl.sock")
    cmd = [sys.executable, "-m", "datalane_sidecar", "serve", "--socket", socket, "--recipe",
           recipe_path, "--workers", str(args.workers), "--prefetch", "8", "--log-level",
           "warning", "--map-processes", str(args.map_processes)]
    if args.sidecar_cpus:  # apart from this client's CPUs
        cmd = pinned(cmd, [int(c) for c in args.sidecar_cpus.split(",")])
    with serve.sidecar_process(cmd, socket, work / "sidecar.log") as proc, \
            SidecarLoader(socket, rank=args.rank, world_size=args.world,
                          microbatch_size=MICROBATCH) as loader:
        yield proc.pid
        yield from loader


def child(args: argparse.Namespace) -> None:
    """One measurement: warm up until ``--start-at``, then the window; one JSON line."""
    work = Path(tempfile.mkdtemp(prefix="datalane-scaling-"))
    try:
        it = _batches(args, args.recipe, work)
        server = next(it)
        me = os.getpid()
        warm_until = max(time.time() + args.warmup, args.start_at)
        while time.time() < warm_until:
            next(it)
        probe = GilProbe(server, args.seconds, args.rate, work) if args.gil_probe else None
        w = Window()
        th0 = thread_sched(server)
        c0, s0, t0 = proc_cpu(me), tree_cpu(server), time.perf_counter()
        while (probe.running() if probe else time.perf_counter() - t0 < args.seconds):
            w.tokens += next(it).input_ids.size
        w.wall = time.perf_counter() - t0
        w.server_cpu = cpu_since(s0, tree_cpu(server))  # with its map processes, if any
        w.cpu = w.server_cpu + (proc_cpu(me) - c0 if server != me else 0.0)
        rec: dict[str, Any] = {**asdict(w), "load1": os.getloadavg()[0],
                               **busiest_thread(server, th0, thread_sched(server))}
        if probe:
            rec.update(probe.result())
        it.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(rec), flush=True)


# -- calibration: a load of known GIL-held CPU ---------------------------------------------------

def calibrate_child(args: argparse.Namespace) -> None:
    """A Python thread spinning ``--duty`` of its time (GIL held; its ``thread_time`` is the
    truth) beside a thread hashing 16 MiB buffers (GIL released), profiled like a real run."""
    import hashlib

    buf = bytes(1 << 24)
    stop = threading.Event()

    def hasher() -> None:
        while not stop.is_set():
            hashlib.sha256(buf).digest()

    def spinner() -> None:
        while not stop.is_set():
            a = time.thread_time()
            while time.thread_time() - a < args.duty * 0.01:
                pass
            time.sleep((1 - args.duty) * 0.01)

    threads = [threading.Thread(target=hasher), threading.Thread(target=spinner)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    spinner = threads[1].native_id
    assert spinner is not None
    probe = GilProbe(os.getpid(), args.seconds, args.rate, Path(tempfile.mkdtemp()))
    t0 = time.perf_counter()
    while probe.running():
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    spun = thread_sched(os.getpid())[spinner][0] - probe.threads0[spinner][0]
    res = probe.result()
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({"duty": args.duty, "wall": wall, "measured_share": res["gil_share"],
                      "uncorrected_share": res["gil_share_uncorrected"],
                      "true_share": spun / wall, "samples": res["gil_samples"],
                      "load1": os.getloadavg()[0]}), flush=True)


# -- the parent: rounds, the model, the table, the plot ------------------------------------------

def client_cpus(spec: str, cpus: list[int]) -> list[int]:
    """The CPUs of ``--client-cpus`` (a comma list), each one this process may run on, and
    at least one left to measure on."""
    if not spec:
        return []
    try:
        chosen = sorted({int(c) for c in spec.split(",")})
    except ValueError:
        raise SystemExit(f"--client-cpus {spec!r}: not a comma list of CPU numbers") from None
    missing = [c for c in chosen if c not in cpus]
    if missing:
        raise SystemExit(f"--client-cpus {spec!r}: CPU(s) {missing} not among this process's "
                         f"CPUs {cpus}")
    if len(chosen) >= len(cpus):
        raise SystemExit(f"--client-cpus {spec!r} leaves none of the CPUs {cpus} to measure on")
    return chosen


def warm_up(args: argparse.Namespace, cores: int, procs: int = 1) -> float:
    """The warm-up of a configuration: past the read-ahead's fill, which takes about
    ``--fill-seconds`` on one core and shrinks with the cores each process has (a window that
    opens during the fill counts the work banked ahead against the tokens delivered: chat on
    one core measured 0.86 CPU s/Mtok 8 s after the start and 0.46 after 30 s)."""
    return max(args.warmup, args.fill_seconds * procs / cores)


MACHINE = "machine"  # the key prefix of the machine's parallel efficiency in the runs

_MACHINE_WORK = """
import hashlib, json, sys, time
buf = bytes(range(256)) * 256
until = time.perf_counter() + float(sys.argv[1])
n = 0
while time.perf_counter() < until:  # interpreted work and native work, as a pipeline does
    sum(i * i for i in range(2000))
    hashlib.sha256(buf).digest()
    n += 1
print(json.dumps({"work": n / float(sys.argv[1])}))
"""


def machine_efficiency(cpus: list[int], seconds: float, repeats: int = 3) -> dict[str, Any]:
    """What ``len(cpus)`` CPUs give together: a single-threaded loop (interpreted and native
    work) alone on the first CPU, then one on each CPU side by side; the efficiency is their
    total rate over ``len(cpus)`` times the lone one (the median of ``repeats`` interleaved
    pairs, at most 1). A VM's vCPUs that are hyperthreads of fewer cores make every
    CPU-second of the pipeline do less, which the model would otherwise read as a serial
    part."""
    def run(on: list[int]) -> float:
        procs = [subprocess.Popen(pinned([sys.executable, "-c", _MACHINE_WORK, str(seconds)],
                                         [c]), stdout=subprocess.PIPE, text=True) for c in on]
        return sum(json.loads(p.communicate()[0])["work"] for p in procs)

    ratios = []
    for _ in range(repeats):  # interleaved: the machine's own noise is seconds long
        one = run(cpus[:1])
        together = run(cpus)
        ratios.append(together / (len(cpus) * one))
    measured = statistics.median(ratios)
    efficiency = min(1.0, measured)  # a CPU gives no more than one alone: above is noise
    return {"cpus": len(cpus), "one": one, "together": together, "ratios": ratios,
            "measured": measured, "efficiency": efficiency,
            "effective": efficiency * len(cpus)}


def run_child(argv: list[str], cpus: list[int]) -> list[dict[str, Any]]:
    cmd = pinned([sys.executable, str(Path(__file__).resolve()), *argv], cpus)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} on CPUs {cpus} failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def run_procs(argvs: list[list[str]], cpus: list[int]) -> list[dict[str, Any]]:
    """Children side by side on the same CPUs (their windows aligned by ``--start-at``)."""
    procs = [subprocess.Popen(pinned([sys.executable, str(Path(__file__).resolve()), *argv], cpus),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    out = []
    for argv, p in zip(argvs, procs, strict=True):
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}):\n{stderr[-3000:]}")
        out += [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return out


def per_mtok(rec: dict[str, Any], key: str) -> float:
    return 1e6 * rec[key] / rec["tokens"]


def measure(args: argparse.Namespace, recipes: dict[str, Path], cpus: list[int],
            clients: list[int] | None = None) -> dict:
    """Every (path, mode, configuration) for ``--rounds`` interleaved rounds: the raw records.
    ``cpus`` are the measured ones; ``clients``, if any, the sidecar's reading client's own."""
    runs: dict[str, list[dict[str, Any]]] = {}
    core_counts = [int(c) for c in args.cores.split(",")]
    for r in range(args.rounds):
        for cores in core_counts:
            if 1 < cores <= len(cpus) and args.machine_seconds > 0:
                rec = machine_efficiency(cpus[:cores], args.machine_seconds)
                runs.setdefault(f"{MACHINE}|{cores}", []).append(rec)
                print(f"  round {r + 1} the machine on {cores} CPUs: {rec['efficiency']:.2f} "
                      f"of {cores} x one ({rec['effective']:.2f} effective cores)",
                      file=sys.stderr)
        for path in args.paths.split(","):
            for mode in args.modes.split(","):
                base = ["--child", "--recipe", str(recipes[path]), "--mode", mode,
                        "--seconds", str(args.seconds)]
                for cores in core_counts:
                    if cores > len(cpus):
                        print(f"  skipping {cores} cores: {len(cpus)} available",
                              file=sys.stderr)
                        continue
                    workers = args.workers or max(2, cores)
                    argv = [*base, "--workers", str(workers), "--warmup",
                            str(warm_up(args, cores)),
                            "--map-processes", str(cores if mode.endswith(MP) else 0)]
                    on = cpus[:cores]  # the child's CPUs; the sidecar's apart from a client's
                    if clients and mode.removesuffix(MP) == "sidecar":
                        argv += ["--sidecar-cpus", ",".join(map(str, on))]
                        on = clients
                    key = f"{path}|{mode}|{cores}|1"
                    runs.setdefault(key, []).extend(run_child(argv, on))
                    _say(r, key, runs[key][-1])
                    if cores == core_counts[0] and args.profile:
                        pkey = f"{path}|{mode}|{cores}|profile"
                        runs.setdefault(pkey, []).extend(
                            run_child([*argv, "--gil-probe", "--rate", str(args.rate)], on))
                        _say(r, pkey, runs[pkey][-1])
                # (P loader processes side by side: the threads' mode only; map processes
                # are checked against the model on more cores)
                if mode == "inprocess" and args.procs > 1 and args.procs <= len(cpus):
                    cores = min(len(cpus), max(core_counts))
                    # (their windows open together, past the fill)
                    start = time.time() + args.start_delay + warm_up(args, cores, args.procs)
                    argvs = [[*base, "--workers", str(args.workers or 2), "--warmup",
                              str(args.warmup), "--rank", str(k),
                              "--world", str(args.procs), "--start-at", str(start)]
                             for k in range(args.procs)]
                    recs = run_procs(argvs, cpus[:cores])
                    agg = {"tokens": sum(x["tokens"] for x in recs),
                           "wall": max(x["wall"] for x in recs),
                           "cpu": sum(x["cpu"] for x in recs),
                           "server_cpu": sum(x["server_cpu"] for x in recs),
                           "load1": max(x["load1"] for x in recs),
                           "rate_sum": sum(x["tokens"] / x["wall"] for x in recs)}
                    key = f"{path}|{mode}|{cores}|{args.procs}"
                    runs.setdefault(key, []).append(agg)
                    _say(r, key, agg)
    return runs


def _say(r: int, key: str, rec: dict[str, Any]) -> None:
    rate = rec.get("rate_sum", rec["tokens"] / rec["wall"])
    extra = f" GIL {rec['gil_share']:.0%} of wall" if "gil_share" in rec else ""
    if "busiest_cpu" in rec:
        extra += (f"  busiest thread {rec['busiest_thread']} "
                  f"{per_mtok(rec, 'busiest_cpu'):.3f} s/Mtok")
    print(f"  round {r + 1} {key:<32} {rate:>12,.0f} tokens/s  CPU "
          f"{per_mtok(rec, 'cpu'):6.3f} s/Mtok{extra}  load {rec['load1']:.1f}",
          file=sys.stderr)


def model(runs: dict[str, list[dict[str, Any]]], first_cores: int,
          client_apart: bool = False) -> dict[str, Any]:
    """Per (path, mode): medians of C and G from the first core count's runs, the predicted
    and measured rate of every other configuration, and the projections (one process, and
    the rank workers). ``client_apart``: the sidecar's client ran on CPUs of its own, so the
    sidecar's rows are predicted from its own CPU."""
    med = statistics.median
    out: dict[str, Any] = {}

    def effective(cores: int) -> float:
        """Cores as the machine gives them (its measured parallel efficiency, if any)."""
        recs = runs.get(f"{MACHINE}|{cores}")
        return cores * min(1.0, med(x["efficiency"] for x in recs)) if recs else float(cores)

    keys = sorted({tuple(k.split("|")[:2]) for k in runs if not k.startswith(MACHINE + "|")})
    for path, mode in keys:
        base = runs.get(f"{path}|{mode}|{first_cores}|1")
        if not base:
            continue
        cpu = med(per_mtok(x, "cpu") for x in base)
        server_cpu = med(per_mtok(x, "server_cpu") for x in base)
        rate1 = med(x["tokens"] / x["wall"] for x in base)
        prof = runs.get(f"{path}|{mode}|{first_cores}|profile", [])
        gil = med(x["gil_share"] * x["wall"] / x["tokens"] * 1e6 for x in prof) if prof else 0.0
        py_cpu = (med(per_mtok(x, "python_thread_cpu") for x in prof) if prof else None)
        # the CPU that shares the measured cores: the sidecar's alone when its client is apart
        sidecar = mode.removesuffix(MP) == "sidecar"
        own_cpu = server_cpu if sidecar and client_apart else cpu
        rows = []
        for key, recs in sorted(runs.items()):
            if key.startswith(MACHINE + "|"):
                continue
            p, m, cores_s, procs_s = key.split("|")
            if (p, m) != (path, mode) or procs_s == "profile":
                continue
            cores, procs = int(cores_s), int(procs_s)
            measured = med(x.get("rate_sum", x["tokens"] / x["wall"]) for x in recs)
            # scaled from the first configuration: the model's ratio times the measured base
            predicted = rate1 * (amdahl(own_cpu, gil, effective(cores), procs)
                                 / amdahl(own_cpu, gil, effective(first_cores), 1))
            rows.append({"cores": cores, "procs": procs, "predicted": predicted,
                         "effective_cores": effective(cores),
                         "measured": measured, "error": measured / predicted - 1,
                         "load1": max(x["load1"] for x in recs)})
        # the node projection: the sidecar's own CPU (the clients are the ranks' processes)
        proj_cpu = server_cpu if sidecar else cpu
        out[f"{path}|{mode}"] = {
            "path": path, "mode": mode, "rate_1": rate1, "cpu_s_per_Mtok": cpu,
            "server_cpu_s_per_Mtok": server_cpu, "gil_s_per_Mtok": gil,
            "python_thread_cpu_s_per_Mtok": py_cpu,
            "serial_fraction": min(gil, proj_cpu) / proj_cpu if proj_cpu else None,
            "rows": rows, "client_apart": client_apart and sidecar,
            "projection": {n: amdahl(proj_cpu, gil, n) for n in PROJECT_CORES},
            "projection_workers": {n: rank_workers(proj_cpu, gil, n) for n in PROJECT_CORES},
        }
    return out


def table(result: dict[str, Any]) -> str:
    lines = ["| path | mode | C: CPU s/Mtok (sidecar alone) | G: GIL-held s/Mtok | serial "
             "fraction G/C | Python threads' CPU s/Mtok | config | predicted tokens/s | "
             "measured tokens/s | measured/predicted |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for m in result.values():
        server = (f" ({m['server_cpu_s_per_Mtok']:.3f})" if m["mode"].startswith("sidecar") else "")
        py_cpu = m["python_thread_cpu_s_per_Mtok"]
        mode = m["mode"] + (" (client apart)" if m.get("client_apart") else "")
        head = (f"| {m['path']} | {mode} | {m['cpu_s_per_Mtok']:.3f}{server} | "
                f"{m['gil_s_per_Mtok']:.3f} | {m['serial_fraction']:.1%} | "
                f"{'-' if py_cpu is None else f'{py_cpu:.3f}'} |")
        for i, row in enumerate(m["rows"]):
            config = f"{row['procs']} proc, {row['cores']} core{'s' if row['cores'] > 1 else ''}"
            eff = row.get("effective_cores", row["cores"])
            if eff != row["cores"]:
                config += f" ({eff:.2f} effective)"
            cells = (f" {config} | {row['predicted']:,.0f} | {row['measured']:,.0f} | "
                     f"{row['measured'] / row['predicted']:.2f} |")
            lines.append((head if i == 0 else "| | | | | | |") + cells)
    return "\n".join(lines)


def projection_table(result: dict[str, Any]) -> str:
    cols = PROJECT_CORES
    lines = ["| path | mode | processes | " + " | ".join(f"{n} cores" for n in cols)
             + " | 16 cores / (16 x 1 core) |",
             "|---|---|---|" + "---:|" * (len(cols) + 1)]
    for m in result.values():
        for key, procs in (("projection", "1"),
                           ("projection_workers", f"{RANK_WORKERS} rank workers")):
            p = m[key]
            lines.append(f"| {m['path']} | {m['mode']} | {procs} | "
                         + " | ".join(f"{p[n] / 1e6:.2f}" for n in cols)
                         + f" | {p[16] / (16 * p[1]):.2f} |")
    return "\n".join(lines) + (
        "\n\n(M tokens/s, the Amdahl projection; rank workers: min(8, N) processes with a "
        "GIL each; the last column is the issue's target, 0.8 or more)")


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    """Projected tokens/s against cores: one sidecar process (left) and its rank workers
    (right); the measured configurations as dots (one process left, several right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    colors = dict(zip(node_paths.PATHS, ("C0", "C1", "C2", "C3", "C4"), strict=True))
    panels = (("projection", "one process (its map stages on threads, or -mp: in a map "
               "process per core)", lambda procs: procs == 1),
              ("projection_workers", f"{RANK_WORKERS} rank worker processes "
               f"(min({RANK_WORKERS}, N) busy)", lambda procs: procs > 1))
    xs = list(PROJECT_CORES)
    for ax, (key, name, measured_here) in zip(axes, panels, strict=True):
        for m in result.values():
            style = {"sidecar": "-", "inprocess": ":", "sidecar" + MP: "--",
                     "inprocess" + MP: "-."}.get(m["mode"], "-")
            ax.plot(xs, [m[key][n] for n in xs], style, color=colors.get(m["path"], "k"),
                    label=f"{m['path']} ({m['mode']}, serial {m['serial_fraction']:.1%})")
            for row in m["rows"]:
                if measured_here(row["procs"]):
                    ax.plot([row["cores"]], [row["measured"]], "o",
                            color=colors.get(m["path"]), markersize=4)
        ax.axhline(NODE_TARGET, color="gray", lw=0.8, ls="--")
        ax.text(180, NODE_TARGET * 1.08, "8 H100s, 1B model (8 x 60k tokens/s)", fontsize=8,
                color="gray", ha="right")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlim(1, 192)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(n) for n in xs])
        ax.set_xlabel("cores")
        ax.set_title(name, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("tokens/s (projected; dots: measured)")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def calibrate(args: argparse.Namespace, cpus: list[int]) -> None:
    print("| CPUs | spinner duty | load | GIL-held share: py-spy, weighted by on-CPU share | "
          "py-spy alone | spinner's CPU share (truth) | error | error, py-spy alone |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for cores in sorted({1, min(2, len(cpus))}):
        for duty in (0.2, 0.5, 0.8):
            rec = run_child(["--calibrate-child", "--duty", str(duty), "--seconds",
                             str(args.seconds), "--rate", str(args.rate)], cpus[:cores])[0]
            truth = rec["true_share"]  # the spinner holds the GIL whenever it is on a CPU
            print(f"| {cores} | {duty:.0%} | {rec['load1']:.1f} | {rec['measured_share']:.1%} | "
                  f"{rec['uncorrected_share']:.1%} | {truth:.1%} | "
                  f"{rec['measured_share'] / truth - 1:+.0%} | "
                  f"{rec['uncorrected_share'] / truth - 1:+.0%} |", flush=True)


def load_model(path: Path) -> tuple[dict[str, Any], str]:
    """The model of a saved run (``scaling.json``: its raw records, modelled by today's code)
    and when it started."""
    saved = json.loads(path.read_text())
    args = saved.get("args", {})
    first = int(str(args.get("cores", "1")).split(",")[0])
    return (model(saved["runs"], first, client_apart=bool(args.get("client_cpus"))),
            saved["started"])


def replot(args: argparse.Namespace) -> None:
    """The tables and the plot of saved runs, merged."""
    result: dict[str, Any] = {}
    starts = []
    for path in args.replot:
        model_of, started = load_model(path)
        result.update(model_of)
        starts.append(started)
    print(f"{table(result)}\n\n{projection_table(result)}")
    title = (f"datalane: projected tokens/s per path (Amdahl, GIL-held = serial), from "
             f"1-core measurements; {', '.join(starts)}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / "scaling.png", title)
    if args.publish:
        plot(result, ROOT / "docs" / "node-scaling.png", title)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", help=f"of {', '.join(node_paths.PATHS)} (default: all; "
                                     f"--quick: {QUICK_PATHS})")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--cores", default="1,2", help="core counts; the first is the model's base")
    ap.add_argument("--procs", type=int, default=2,
                    help="in process: also P processes side by side on the most cores")
    ap.add_argument("--workers", type=int, default=0, help="map workers (0: max(2, cores))")
    ap.add_argument("--client-cpus", default="",
                    help="the sidecar's reading client on these CPUs (e.g. 14,15); the "
                         "sidecar and the in-process loader on the first cores of the others")
    # A window must span many of the pipeline's read-ahead cycles: the 8 lanes drain their
    # shuffle blocks together and refill them together, so the tokens delivered per 2 s swing
    # 0.2-1.8 M on one core (text JSONL) while the work done stays level, and as the pipeline is
    # deterministic the swing's phase is the same in every run: 4 s windows measured a
    # consistent 0.37-0.42 M where 28 s measured 0.8-0.95 M. (--calibrate has no pipeline:
    # its windows stay 4 s unless told.)
    ap.add_argument("--seconds", type=float, help="window (default 30; --calibrate 4)")
    ap.add_argument("--warmup", type=float, default=8.0, help="the least warm-up (seconds)")
    ap.add_argument("--fill-seconds", type=float, default=30.0,
                    help="the read-ahead's fill on one core: a configuration warms up at least "
                         "this over its cores per process")
    ap.add_argument("--machine-seconds", type=float, default=2.0,
                    help="the machine's parallel efficiency: each of its 6 runs' length (0: "
                         "take the cores at face value)")
    ap.add_argument("--start-delay", type=float, default=8.0,
                    help="side-by-side processes start their warm-up this long after launch")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="no GIL measurement (G = 0: the model is then pure CPU)")
    ap.add_argument("--quick", action="store_true", help="CI size: tiny corpus, short windows")
    ap.add_argument("--corpus", type=Path, help="corpus folder (default ~/.cache/datalane/...)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--publish", action="store_true", help="also docs/node-scaling.png")
    ap.add_argument("--calibrate", action="store_true", help="py-spy against a known GIL load")
    ap.add_argument("--replot", type=Path, nargs="+", metavar="JSON",
                    help="no measurement: the tables and the plot of earlier runs' "
                         "scaling.json files, merged (a later file's path and mode win)")
    # the children
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--calibrate-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=ALL_MODES, help=argparse.SUPPRESS)
    ap.add_argument("--map-processes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sidecar-cpus", default="", help=argparse.SUPPRESS)
    ap.add_argument("--gil-probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--duty", type=float, default=0.5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.calibrate_child:
        return calibrate_child(args)
    if args.replot:
        return replot(args)
    cpus = sorted(os.sched_getaffinity(0))
    if args.calibrate:
        args.seconds = args.seconds or 4.0
        return calibrate(args, cpus)
    args.seconds = args.seconds or 30.0
    if args.quick:
        args.seconds, args.warmup, args.start_delay = 1.0, 0.3, 4.0
        args.fill_seconds, args.machine_seconds = 0.0, min(args.machine_seconds, 0.5)
    args.paths = args.paths or (QUICK_PATHS if args.quick else ",".join(node_paths.PATHS))
    if pyspy_binary() is None and args.profile:
        print("py-spy not found: no GIL measurement (G = 0)", file=sys.stderr)
        args.profile = False
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = os.getloadavg()
    recipes = node_paths.make(args.corpus or node_paths.default_root(args.quick), args.quick)
    clients = client_cpus(args.client_cpus, cpus)
    measured = [c for c in cpus if c not in clients]
    runs = measure(args, recipes, measured, clients)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = {"started": started, "cpus": len(cpus), "load_start": load_start,
             "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}
    (args.out / "scaling.json").write_text(json.dumps(saved, indent=1))  # (before the model)
    first = int(args.cores.split(",")[0])
    result = model(runs, first, client_apart=bool(clients))
    header = (f"{started}, {platform.node()}, {len(cpus)} CPUs, python "
              f"{platform.python_version()}, load average {load_start[0]:.2f} at start, "
              f"{os.getloadavg()[0]:.2f} at end; {args.seconds:g} s windows, median of "
              f"{args.rounds} round(s); "
              + (f"G by py-spy at {args.rate} Hz" if args.profile else "no GIL measurement")
              + (f"; the sidecar's client on CPUs {args.client_cpus}, the measured cores "
                 f"from CPUs {','.join(map(str, measured))}" if clients else
                 "; the sidecar's client on the sidecar's cores"))
    md = f"{header}\n\n{table(result)}\n\n{projection_table(result)}\n"
    print("\n" + md)
    (args.out / "scaling.md").write_text(md)
    (args.out / "scaling.json").write_text(json.dumps({**saved, "model": result}, indent=1))
    title = (f"datalane: projected tokens/s per path (Amdahl, GIL-held = serial), from "
             f"{first}-core measurements; {started}")
    plot(result, args.out / "scaling.png", title)
    if args.publish:
        plot(result, ROOT / "docs" / "node-scaling.png", title)
    print(f"written to {args.out}/scaling.{{md,json,png}}", file=sys.stderr)


if __name__ == "__main__":
    main()
