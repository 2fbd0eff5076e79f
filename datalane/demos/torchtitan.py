"""The TorchTitan demo: resize a TorchTitan job between DP degrees, same global batch every step.

``python -m datalane.demos.torchtitan`` (``make demo-torchtitan``) trains TorchTitan's debug
llama3 on CPU with gloo (see :mod:`datalane.demos.torchtitan_rank`) on a generated corpus of 8
lanes, in legs of ``torchrun`` jobs (``--legs``, default ``2,2>1,1>2``):

* ``DP2``: 2 ranks, uninterrupted, ``--steps`` steps;
* ``DP2>DP1``: 2 ranks to ``--resume-at``, saved by TorchTitan's checkpointer and stopped
  there (a preemption: the job keeps its ``training.steps`` and so its LR schedule), then 1
  rank resumes from that checkpoint to the end;
* ``DP1>DP2``: the other way round.

Any DP degree from 1 to 8 works, including those that do not divide the lanes
(``--legs 1,3,4,4>3``: 3 ranks own 2, 3 and 3 lanes): every job reads microbatches of 2
sequences and runs with ``--training.global_batch_size`` set to the padded global batch
(:func:`~datalane.client.torchtitan.titan_global_batch_size`: 16 on 1, 2, 4 or 8 ranks, 18 on
3), so one TorchTitan step is one datalane step on every rank.

Every rank logs the SHA-256 of each of its lane windows per step (the dataloader's
``digest_log``); the step's global batch hash is ``global_hash`` over all lanes in lane order.
The demo prints one row per step next to datalane's own stream (no TorchTitan) and exits 1 if
any leg's hash differs from it or a step is missing. The loss columns show that the training
itself resumed and that the DP degree does not change it: the same to float rounding (the order
of the gradient sums changes with the DP degree); the last line gives each leg's largest
difference to the first leg.
``--short`` is the CI size (a few steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from datalane.client.torchtitan import titan_global_batch_size
from datalane.spec.errors import ConfigError
from datalane.spec.hashing import global_hash
from datalane.testing import make_corpus

__all__ = ["Leg", "in_workdir", "main", "mismatches", "parse_legs", "print_mismatch",
           "print_steps", "step_hashes", "steps_of"]

LANES = 8
GLOBAL_BATCH = 16  # sequences per step (the recipe's)
LOCAL_BATCH = 2  # sequences per microbatch: it divides every local batch of DP 1 to 8


@dataclass
class Leg:
    """A run of one or two torchrun jobs sharing one dump folder (and checkpoint folder)."""

    name: str
    dps: tuple[int, ...]  # the DP degree of each job; the first stops at resume_at
    dump: Path
    seconds: list[float] = field(default_factory=list)


def write_recipe(root: Path) -> Path:
    """The demo corpus and its recipe at TorchTitan's debug size: 8 lanes, 16 x 64 tokens."""
    corpus = make_corpus(str(root / "corpus"))
    with open(corpus.recipe, encoding="utf-8") as f:
        recipe = yaml.safe_load(f)
    recipe.update(lanes=LANES, global_batch_size=GLOBAL_BATCH, seq_len=64)
    path = root / "corpus" / "titan.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return path


def torchrun(dp: int, steps: int, recipe: Path, dump: Path, part: int, log: Path,
             preempt_after: int | None = None) -> float:
    """One TorchTitan job of ``dp`` ranks to step ``steps`` (or preempted after a checkpoint at
    ``preempt_after``); its wall time in seconds."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={dp}", "-m", "datalane.demos.torchtitan_rank",
           "--module", "datalane.demos.torchtitan_rank", "--config", "llama3_debugmodel_datalane",
           "--dump_folder", str(dump), "--hf_assets_path", str(recipe.parent),
           "--training.steps", str(steps), "--dataloader.recipe", str(recipe),
           "--training.local_batch_size", str(LOCAL_BATCH), "--training.global_batch_size",
           str(titan_global_batch_size(LANES, GLOBAL_BATCH, dp, LOCAL_BATCH)),
           "--dataloader.digest_log", str(dump / f"digests-{part}-dp{dp}")]
    if preempt_after is not None:
        cmd += ["--checkpoint.interval", str(preempt_after), "--preempt-after",
                str(preempt_after)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        rc = subprocess.run(cmd, check=False, env=env, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    if rc:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        raise SystemExit(f"torchrun (DP {dp}, {steps} steps) failed with exit code {rc}; "
                         f"the end of {log}:\n" + "\n".join(tail))
    return time.monotonic() - start


def step_hashes(dump: Path) -> dict[int, str]:
    """Global hash of every TorchTitan step (1-based) from the digest logs under ``dump``."""
    lanes: dict[int, dict[int, str]] = {}
    for path in sorted(dump.glob("digests-*/dp*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            seen = lanes.setdefault(rec["step"] + 1, {})
            for lane, digest in rec["lanes"].items():
                if seen.setdefault(int(lane), digest) != digest:
                    raise SystemExit(f"{path}: lane {lane} of step {rec['step']} was logged "
                                     f"twice with different digests")
    return {step: global_hash(bytes.fromhex(d[lane]) for lane in range(LANES))
            for step, d in sorted(lanes.items()) if sorted(d) == list(range(LANES))}


def losses(dump: Path) -> dict[int, float]:
    path = dump / "loss.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return {rec["step"]: rec["loss"] for rec in map(json.loads, lines)}


def dataloader_entries(dump: Path, step: int) -> list[str]:
    """The ``dataloader.*`` keys of TorchTitan's DCP checkpoint of ``step``."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    meta = FileSystemReader(str(dump / "checkpoint" / f"step-{step}")).read_metadata()
    return sorted(k for k in meta.state_dict_metadata if k.startswith("dataloader."))


def reference_hashes(recipe: Path, steps: int) -> dict[int, str]:
    """The global hashes of datalane's own stream (one process, no TorchTitan)."""
    from datalane import Loader, load_recipe

    with Loader(load_recipe(str(recipe)), rank=0, world_size=1) as loader:
        return {step: loader.next_step().global_hash() for step in range(1, steps + 1)}


def mismatches(reference: dict[int, str], legs: Sequence[dict[int, str]],
               steps: int) -> list[tuple[int, int]]:
    """``(step, leg)`` for every step 1..steps a leg has not logged or logged another hash."""
    return [(step, i) for step in range(1, steps + 1) for i, got in enumerate(legs)
            if got.get(step) != reference[step]]


def print_steps(names: Sequence[str], reference: dict[int, str], hashes: Sequence[dict[int, str]],
                bad: Sequence[tuple[int, int]], loss: Sequence[dict[int, float]],
                resume_at: int) -> None:
    """One row per step: datalane's own hash, each leg's (``=`` or ``X``), each leg's loss."""
    print(f"\n{'step':>4}  {'datalane sha256':<17}" + "".join(f"{n:<19}" for n in names)
          + "".join(f"{'loss ' + n:>14}" for n in names))
    for step in sorted(reference):
        cells = "".join(f"{(h.get(step) or 'missing')[:16]} {'X' if (step, i) in bad else '='} "
                        for i, h in enumerate(hashes))
        print(f"{step:>4}  {reference[step][:16]} {cells}"
              + "".join(f"{lo.get(step, float('nan')):>14.6f}" for lo in loss)
              + (" <- resumed" if step == resume_at + 1 else ""))


def print_mismatch(names: Sequence[str], bad: Sequence[tuple[int, int]]) -> None:
    print(f"MISMATCH: {len(bad)} step hash(es) missing or different from datalane's "
          f"stream: " + ", ".join(f"{names[i]} step {s}" for s, i in bad))


def steps_of(p: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[int, int]:
    """``(steps, resume_at)`` of the command line (4 and 2 with ``--short``), checked."""
    steps, resume_at = (4, 2) if args.short else (args.steps, args.resume_at)
    if not 0 < resume_at < steps:
        p.error(f"--resume-at must be between 1 and --steps - 1 ({steps - 1}), got {resume_at}")
    return steps, resume_at


def in_workdir(workdir: str | None, prefix: str, fn: Callable[[Path], int]) -> int:
    """``fn`` in ``workdir`` (kept) or in a temporary folder (removed after)."""
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        return fn(Path(workdir))
    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        return fn(Path(work))


def parse_legs(text: str) -> list[tuple[int, ...]]:
    """``"2,2>1,1>2"`` -> ``[(2,), (2, 1), (1, 2)]``: comma-separated legs, each one DP degree
    or two joined by ``>`` (resized at ``--resume-at``), each from 1 to the lanes."""
    legs: list[tuple[int, ...]] = []
    for part in text.split(","):
        words = part.strip().split(">")
        if not 1 <= len(words) <= 2 or not all(w.strip().isdigit() for w in words):
            raise ConfigError(f"leg {part!r} of --legs {text!r} is not a DP degree or two "
                              f"joined by '>' (e.g. 4>3)")
        dps = tuple(int(w) for w in words)
        if not all(1 <= dp <= LANES for dp in dps):
            raise ConfigError(f"leg {part!r} of --legs {text!r}: a DP degree is 1 to {LANES} "
                              f"(the lanes)")
        legs.append(dps)
    return legs


def run(work: Path, steps: int, resume_at: int, leg_dps: Sequence[tuple[int, ...]]) -> int:
    recipe = write_recipe(work)
    legs = [Leg(">".join(f"DP{dp}" for dp in dps), tuple(dps),
                work / "-".join(f"dp{dp}" for dp in dps)) for dps in leg_dps]
    started = time.monotonic()
    for leg in legs:
        for part, dp in enumerate(leg.dps):
            stop = resume_at if part + 1 < len(leg.dps) else None
            print(f"{leg.name}: torchrun DP {dp}, steps {resume_at + 1 if part else 1}.."
                  f"{stop or steps}" + (" (checkpoint, preempted)" if stop else ""), flush=True)
            log = work / f"{leg.dump.name}-{part}.log"
            leg.seconds.append(torchrun(dp, steps, recipe, leg.dump, part, log, stop))
    total = time.monotonic() - started

    for leg in legs:
        if len(leg.dps) == 1:
            continue
        keys = dataloader_entries(leg.dump, resume_at)
        print(f"{leg.name}: checkpoint step-{resume_at} (written at DP {leg.dps[0]}) holds "
              f"{len(keys)} dataloader entries: {keys[0]} ... {keys[-1]}")
    reference = reference_hashes(recipe, steps)
    hashes = [step_hashes(leg.dump) for leg in legs]
    bad = mismatches(reference, hashes, steps)
    loss = [losses(leg.dump) for leg in legs]
    print_steps([leg.name for leg in legs], reference, hashes, bad, loss, resume_at)
    drifts = [max((abs(lo[s] - loss[0][s]) for s in lo if s in loss[0]), default=0.0)
              for lo in loss[1:]]
    drift = max(drifts, default=0.0)
    times = ", ".join(f"{leg.name} " + " + ".join(f"{s:.0f}s" for s in leg.seconds)
                      for leg in legs)
    each = ", ".join(f"{leg.name} {d:.2e}" for leg, d in zip(legs[1:], drifts, strict=True))
    print(f"\n{sum(len(leg.dps) for leg in legs)} torchrun jobs in {total:.0f}s ({times}); "
          f"largest loss difference to {legs[0].name} {drift:.2e} ({each})")
    names = [leg.name for leg in legs]
    if bad:
        print_mismatch(names, bad)
        return 1
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    resized = (f" (resized at step {resume_at + 1})" if any(len(leg.dps) > 1 for leg in legs)
               else "")
    print(f"MATCH: all {steps} global batches identical in {listed}{resized} and in "
          f"datalane's own stream")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m datalane.demos.torchtitan",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=12, help="TorchTitan steps per leg")
    p.add_argument("--resume-at", type=int, default=5,
                   help="the step the resized legs checkpoint at")
    p.add_argument("--legs", default="2,2>1,1>2",
                   help="comma-separated legs: a DP degree, or two joined by '>' (resized at "
                        "--resume-at); any degree from 1 to 8, e.g. 1,3,4,4>3")
    p.add_argument("--short", action="store_true", help="CI size: 4 steps, resize after 2")
    p.add_argument("--workdir", help="keep the corpus, checkpoints and logs here")
    args = p.parse_args(argv)
    steps, resume_at = steps_of(p, args)
    try:
        legs = parse_legs(args.legs)
    except ConfigError as e:
        p.error(str(e))
    return in_workdir(args.workdir, "datalane-titan-",
                      lambda work: run(work, steps, resume_at, legs))


if __name__ == "__main__":
    sys.exit(main())
