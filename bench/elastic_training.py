#!/usr/bin/env python3
"""The elastic loss-curve experiment (issue 8 item 5): train, resize twice, compare.

A tiny causal transformer (bench/elastic_model.py) trains with DDP over gloo on CPU on the
corpus of ``datalane.corpus.make_corpus`` under five schedules, all from the same seed, model
init and AdamW (fixed learning rate), for the same number of steps and global batch size:

* ``a_datalane``: 4 ranks, uninterrupted, data from datalane;
* ``b_datalane``: 4 ranks to step k, a ``torch.distributed.checkpoint`` (model, optimizer,
  ``DataLaneDataset``), 2 ranks to step k2, a checkpoint, 8 ranks to the end;
* ``d_datalane``: the same resume points through world sizes that do not all divide the 8
  lanes (``--uneven-worlds``, default 8 -> 7 -> 3: on 7 ranks one rank owns 2 lanes and six
  own 1, on 3 ranks they own 2, 3 and 3; a rank with fewer lanes ends each step with fully
  padded microbatches and the loss is normalized by the global trained-token count);
* ``a_usual``: 4 ranks, uninterrupted, data from the ordinary loader (bench/elastic_usual.py:
  packed sequences, ``DistributedSampler(shuffle=True)``, ``DataLoader``);
* ``c_usual``: the schedule of ``b`` with the ordinary loader, resumed as usual (``set_epoch``
  and skip the microbatches each rank had consumed in the epoch);
* ``control_datalane``: uninterrupted on the second world size (2 ranks): the same data as
  ``a_datalane``, summed in another order - the yardstick for ``b``'s loss difference, since
  float rounding differences grow as training goes on.

Each phase starts its ranks as processes (bench/elastic_rank.py) with ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE``. ``b``, ``d`` and the control are compared with
``a_datalane`` and ``c`` with ``a_usual``: per-step global-batch hash equality, the reference
step that trained on the same sequences, the loss difference. Results go to ``--out`` (JSON)
and the figure to ``--plot`` (docs/elastic-loss.png; ``--tiny`` leaves that committed figure
alone and draws bench/results/elastic-loss-tiny.png)::

    .venv/bin/python bench/elastic_training.py            # ~9 min on 2 shared cores
    .venv/bin/python bench/elastic_training.py --tiny     # the CI smoke size: 2 ranks -> 1,
                                                          # and 3 -> 1 (uneven)

Called by tests/trainers/test_elastic_bench.py (``--tiny``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from elastic_report import compare, plot
from elastic_usual import pack_corpus

from datalane.spec.recipe import load_recipe
from datalane.testing import make_corpus

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
Phase = tuple[int, int, int]  # (world size, first step, stop step)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_phase(world: int, start: int, stop: int, common: list[str], log: str,
               resume: str | None, save: str | None) -> None:
    port = _free_port()
    cmd = [sys.executable, str(HERE / "elastic_rank.py"), *common, "--start", str(start),
           "--stop", str(stop), "--log", log]
    if resume:
        cmd += ["--resume", resume]
    if save:
        cmd += ["--save", save]
    procs = []
    for rank in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
               "RAYON_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
                   [str(ROOT), os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate()[1] for p in procs]
    codes = [p.returncode for p in procs]
    if any(codes):
        worst = next(e for c, e in zip(codes, errors, strict=True) if c)
        raise SystemExit(f"steps {start}-{stop} on {world} ranks failed (exit codes {codes}):"
                         f"\n{worst[-3000:]}")


def _schedule(name: str, loader: str, phases: list[Phase], common: list[str],
              work: Path) -> tuple[list[dict[str, Any]], float]:
    log = work / f"{name}.jsonl"
    log.unlink(missing_ok=True)
    t0 = time.perf_counter()
    resume = None
    for i, (world, start, stop) in enumerate(phases):
        save = str(work / f"{name}-step{stop}") if i + 1 < len(phases) else None
        print(f"  {name}: steps {start}-{stop - 1} on {world} ranks", file=sys.stderr)
        _run_phase(world, start, stop, [*common, "--loader", loader], str(log), resume, save)
        resume = save
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return records, time.perf_counter() - t0


def options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with ``--tiny``'s sizes applied. ``--tiny`` writes its figure to
    bench/results/ unless told: docs/elastic-loss.png is the full run's, committed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--resume-at", default="80,160", help="the resize steps (k,k2)")
    ap.add_argument("--worlds", default="4,2,8",
                    help="world sizes of the phases: one more than --resume-at")
    ap.add_argument("--uneven-worlds", default="8,7,3",
                    help="world sizes of the d_datalane schedule (any from 1 to the lanes; "
                         "empty: no such run), one more than --resume-at")
    ap.add_argument("--microbatch", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clip (0: none)")
    ap.add_argument("--web-docs", type=int, default=2000, help="make_corpus size")
    ap.add_argument("--tiny", action="store_true",
                    help="CI smoke size: 8 steps on 2 ranks, 1 rank from step 4 (and 3 ranks, "
                         "1 from step 4), d_model 16, lr 3e-3")
    ap.add_argument("--workdir", help="corpus and checkpoints (default: a temporary dir)")
    ap.add_argument("--out", default=None,
                    help="results JSON (default: bench/results/elastic_training[_tiny].json)")
    ap.add_argument("--plot", default=None,
                    help="the figure (default: docs/elastic-loss.png; with --tiny "
                         "bench/results/elastic-loss-tiny.png)")
    args = ap.parse_args(argv)
    tiny = "_tiny" if args.tiny else ""
    if args.out is None:
        args.out = str(HERE / "results" / f"elastic_training{tiny}.json")
    if args.plot is None:
        args.plot = str(HERE / "results" / "elastic-loss-tiny.png" if args.tiny
                        else ROOT / "docs" / "elastic-loss.png")
    if args.tiny:
        args.steps, args.resume_at, args.worlds, args.uneven_worlds = 8, "4", "2,1", "3,1"
        args.d_model, args.layers, args.lr = 16, 1, 3e-3
    return args


def main() -> None:
    args = options()
    k = [int(v) for v in args.resume_at.split(",")]
    worlds = [int(v) for v in args.worlds.split(",")]
    uneven = [int(v) for v in args.uneven_worlds.split(",") if v.strip()]
    bounds = [0, *k, args.steps]
    if len(worlds) != len(k) + 1 or any(a >= b for a, b in pairwise(bounds)):
        raise SystemExit(f"--resume-at {args.resume_at!r} must be increasing steps between 0 "
                         f"and --steps {args.steps}, and --worlds {args.worlds!r} one world "
                         f"size more")
    if uneven and len(uneven) != len(k) + 1:
        raise SystemExit(f"--uneven-worlds {args.uneven_worlds!r} needs one world size more "
                         f"than --resume-at {args.resume_at!r}")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="datalane-elastic-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(str(work / "corpus"), web_docs=args.web_docs)
    recipe = load_recipe(corpus.recipe)
    packed = str(work / "packed.npy")
    rows = pack_corpus(corpus, recipe.seq_len, packed)
    common = ["--recipe", corpus.recipe, "--packed", packed, "--microbatch",
              str(args.microbatch), "--d-model", str(args.d_model), "--layers",
              str(args.layers), "--lr", str(args.lr), "--clip", str(args.clip)]
    straight: list[Phase] = [(worlds[0], 0, args.steps)]
    elastic: list[Phase] = [(w, a, b) for w, (a, b) in zip(worlds, pairwise(bounds), strict=True)]
    control: list[Phase] = [(worlds[1], 0, args.steps)]
    runs = {"a_datalane": ("datalane", straight), "b_datalane": ("datalane", elastic),
            "control_datalane": ("datalane", control),
            "a_usual": ("usual", straight), "c_usual": ("usual", elastic)}
    if uneven:
        runs["d_datalane"] = ("datalane", [(w, a, b) for w, (a, b) in zip(
            uneven, pairwise(bounds), strict=True)])
    curves: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    for name, (loader, phases) in runs.items():
        curves[name], seconds[name] = _schedule(name, loader, phases, common, work)

    result = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "config": {"steps": args.steps, "resume_at": k, "worlds": worlds,
                   "uneven_worlds": uneven,
                   "global_batch": recipe.global_batch_size, "seq_len": recipe.seq_len,
                   "microbatch": args.microbatch, "d_model": args.d_model,
                   "layers": args.layers, "lr": args.lr, "clip": args.clip,
                   "web_docs": args.web_docs,
                   "usual_rows": rows},
        "seconds": seconds,
        "b_vs_a": compare(curves["a_datalane"], curves["b_datalane"], "global_hash", k),
        "b_vs_a_tokens": compare(curves["a_datalane"], curves["b_datalane"], "tokens_sha256",
                                 k),
        "c_vs_a": compare(curves["a_usual"], curves["c_usual"], "tokens_sha256", k),
        "control_vs_a": compare(curves["a_datalane"], curves["control_datalane"],
                                "global_hash", k),
        "curves": curves,
    }
    if uneven:
        result["d_vs_a"] = compare(curves["a_datalane"], curves["d_datalane"], "global_hash", k)
        result["d_vs_a_tokens"] = compare(curves["a_datalane"], curves["d_datalane"],
                                          "tokens_sha256", k)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    pairs = [("a_datalane", "b_datalane"), ("a_usual", "c_usual")]
    labels = [f"{a}->{b}" for a, b in pairwise(worlds)]
    resized = "->".join(map(str, worlds))
    if uneven:
        pairs.insert(1, ("a_datalane", "d_datalane"))
        labels = [f"{x}, {a}->{b}" for x, (a, b) in zip(labels, pairwise(uneven), strict=True)]
        resized += f" (b, c) and {'->'.join(map(str, uneven))} (d)"
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    plot(curves, pairs, ("a_datalane", "control_datalane"),
         [(s, f"{x} ranks") for s, x in zip(k, labels, strict=True)], args.plot,
         f"TinyLM, {args.steps} steps, global batch {recipe.global_batch_size} x "
         f"{recipe.seq_len} tokens; resized {resized} ranks")
    for name in ("b_vs_a", *(["d_vs_a"] if uneven else []), "control_vs_a", "c_vs_a"):
        r = result[name]
        print(f"{name}: {r['steps_hash_equal']}/{r['steps']} steps with the same global batch "
              f"(first differing step: {r['first_step_hash_differs']}), max |loss diff| "
              f"{r['max_abs_loss_diff']:.3g}, mean from step {k[0]} on "
              f"{r['mean_abs_loss_diff_after_resume']:.3g}")
        for seg in r["same_sequences_segments"]:
            ref = seg["ref_first"]
            what = ("sequences the reference never trained on" if ref is None else
                    f"the sequences of reference steps {ref}-{ref + seg['last'] - seg['first']}")
            print(f"  steps {seg['first']}-{seg['last']}: {what}")
    print(f"results in {args.out}, figure in {args.plot}")


if __name__ == "__main__":
    main()
