"""``datalane demo``: the elastic demo, one OS process per rank, no cluster.

1. Write a small two-source corpus (:mod:`datalane.testing`) and an 8-lane recipe.
2. Compute the uninterrupted reference in-process (one rank, every lane).
3. Run 4 rank processes for ``k`` steps; each prints its lanes' window digests and saves its
   resume point. Merge the four states, resume on 2 processes for ``k`` steps, merge again,
   resume on 8 processes for ``k`` steps.
4. Compose each step's global hash from the lane digests of all ranks and print it beside the
   reference. ``MATCH`` (exit 0) only if all ``3k`` steps agree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.state import Checkpoint, merge_checkpoints

__all__ = ["Progress", "gather", "lane_digests", "print_comparison", "rank_main", "run_demo"]

_PHASES = (4, 2, 8)
_SIGNALS = {int(s) for s in signal.Signals}


def rank_main(args: argparse.Namespace) -> int:
    """One rank process: ``--steps`` steps, a digest line per step, then its state file.
    A fatal signal (SIGABRT, SIGSEGV, ...) prints every thread's stack on stderr first."""
    import faulthandler

    from datalane.engine.loader import Loader

    faulthandler.enable()
    from datalane.spec.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    with Loader(recipe, args.rank, args.world, Knobs(workers=args.workers)) as loader:
        if args.resume:
            loader.load_state_dict(Checkpoint.load(args.resume))
        for _ in range(args.steps):
            step = loader.next_step()
            digests = {str(k): v.hex() for k, v in step.lane_digests.items()}
            print(json.dumps({"step": step.step, "lanes": digests}), flush=True)
        state = loader.state_dict()
    tmp = args.state_out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, separators=(",", ":"))
    os.replace(tmp, args.state_out)
    return 0


class Progress:
    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.lock = threading.Lock()
        self.tty = sys.stderr.isatty()

    def advance(self, label: str) -> None:
        with self.lock:
            self.done += 1
            width = 30
            fill = width * self.done // self.total
            bar = "#" * fill + "." * (width - fill)
            end = "\r" if self.tty and self.done < self.total else "\n"
            if self.tty or self.done == self.total or self.done % 8 == 0:
                print(f"  [{bar}] {self.done}/{self.total} rank-steps  {label:<24}", end=end,
                      file=sys.stderr, flush=True)


def _phase(recipe: str, world: int, steps: int, resume: str | None, state_dir: str,
           progress: Progress) -> tuple[dict[int, dict[int, bytes]], str]:
    procs = []
    for rank in range(world):
        cmd = [sys.executable, "-m", "datalane.cli", "_rank", "--recipe", recipe,
               "--rank", str(rank), "--world", str(world), "--steps", str(steps),
               "--state-out", os.path.join(state_dir, f"rank-{rank}.json")]
        if resume:
            cmd += ["--resume", resume]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))

    digests = lane_digests(gather(procs, progress, f"phase on {world} ranks"))
    merged = merge_checkpoints(Checkpoint.load(os.path.join(state_dir, f"rank-{r}.json"))
                               for r in range(world))
    path = os.path.join(state_dir, f"step-{merged.step}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(merged.dumps())
    return digests, path


def gather(procs: list[subprocess.Popen[str]], progress: Progress, label: str,
           counts: Callable[[str], bool] = lambda line: True) -> list[list[str]]:
    """Every process's stdout lines (read concurrently); exits if any process failed."""
    outputs: list[list[str]] = [[] for _ in procs]

    def pump(i: int) -> None:
        out = procs[i].stdout
        assert out is not None
        for line in out:
            outputs[i].append(line)
            if counts(line):
                progress.advance(label)

    threads = [threading.Thread(target=pump, args=(i,)) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = [p.wait() for p in procs]
    if any(codes):
        named = [f"{c} ({signal.Signals(-c).name})" if c < 0 and -c in _SIGNALS else str(c)
                 for c in codes]
        raise SystemExit(f"a process of the {label} failed (exit codes {', '.join(named)}; "
                         f"a process killed by a signal printed its threads' stacks above)")
    return outputs


def lane_digests(outputs: list[list[str]]) -> dict[int, dict[int, bytes]]:
    """``step -> lane -> window digest`` from the JSON lines the rank processes print."""
    digests: dict[int, dict[int, bytes]] = {}
    for lines in outputs:
        for line in lines:
            rec = json.loads(line)
            if "lanes" in rec:
                digests.setdefault(rec["step"], {}).update(
                    {int(k): bytes.fromhex(v) for k, v in rec["lanes"].items()})
    return digests


def print_comparison(reference: dict[int, str], elastic: dict[int, tuple[int, str]],
                     total: int) -> int:
    """Print the per-step hashes side by side; returns how many steps differ."""
    print(f"\n{'step':>4}  {'uninterrupted (1 rank)':<24}  {'elastic':<24}  ranks")
    bad = 0
    for step in range(total):
        world, h = elastic.get(step, (0, "-"))
        ok = reference.get(step) == h
        bad += not ok
        print(f"{step:>4}  {reference.get(step, '-')[:22]:<24}  {h[:22]:<24}  {world:>5}  "
              f"{'=' if ok else 'X'}")
    return bad


def run_demo(folder: str | None, steps: int, keep: bool = False) -> int:
    from datalane.runner import run_world
    from datalane.spec.recipe import load_recipe
    from datalane.testing import make_corpus

    if steps < 1:
        raise SystemExit("--steps must be at least 1")
    root = folder or tempfile.mkdtemp(prefix="datalane-demo-")
    try:
        corpus = make_corpus(os.path.join(root, "corpus"))
        recipe = load_recipe(corpus.recipe)
        total = steps * len(_PHASES)
        print(f"datalane demo: {recipe.lanes} lanes, global batch {recipe.global_batch_size} x "
              f"{recipe.sequence_tokens} tokens, {total} steps; corpus in {corpus.root}")
        print("reference: 1 rank holding all lanes, uninterrupted ...", flush=True)
        reference = run_world(recipe, 1, Knobs(workers=2), total).hashes
        progress = Progress(sum(w * steps for w in _PHASES))
        elastic: dict[int, tuple[int, str]] = {}
        resume = None
        for world in _PHASES:
            state_dir = os.path.join(root, f"state-w{world}")
            os.makedirs(state_dir, exist_ok=True)
            print(f"phase: {world} rank processes"
                  f"{' from ' + os.path.basename(resume) if resume else ''} ...", flush=True)
            digests, resume = _phase(corpus.recipe, world, steps, resume, state_dir, progress)
            for step, lanes in digests.items():
                if sorted(lanes) != list(range(recipe.lanes)):
                    raise SystemExit(f"step {step}: lanes {sorted(lanes)} reported")
                elastic[step] = (world, global_hash(lanes[k] for k in range(recipe.lanes)))
        bad = print_comparison(reference, elastic, total)
        print("MATCH" if bad == 0 else f"MISMATCH ({bad} of {total} steps differ)")
        return 0 if bad == 0 else 1
    finally:
        if folder is None and not keep:
            shutil.rmtree(root, ignore_errors=True)
