#!/usr/bin/env python3
"""TorchTitan with datalane on the device: train, resume from the checkpoint, compare hashes.

    python bench/device/titan.py --device cuda --work DIR    # torchtitan.train on the GPU
    python bench/device/titan.py --device cpu --work DIR     # the CPU demo trainer (CI)

Caller: ``bench/device/run.sh``. On ``cuda`` it runs TorchTitan's own training entry,
``torchrun --nproc-per-node 1 -m torchtitan.train --module datalane.demos.torchtitan_rank
--config llama3_debugmodel_datalane`` (TorchTitan 0.3.0's debug llama3 with
``DataLaneDataLoader`` as its dataloader, on the demo corpus at the debug size: 8 lanes, 16
sequences of 64 tokens per step; see :mod:`datalane.demos.torchtitan_rank`); on ``cpu``, where
TorchTitan's ``Trainer`` cannot run, the same command line under ``-m
datalane.demos.torchtitan_rank`` (TorchTitan's ``train_step`` on CPU, gloo). Each device:

1. trains ``--steps`` steps, its checkpointer saving every ``--interval`` steps;
2. removes the checkpoints after step ``--interval`` and runs the same command again:
   TorchTitan loads the step-``interval`` checkpoint (model, optimizer, dataloader state) and
   trains the remaining steps;
3. compares the global batch hash of every step of both runs (from the dataloader's
   ``digest_log``) with datalane's own stream of the recipe computed here on CPU (``Loader``,
   no TorchTitan), and prints the losses.

With ``--devices cuda,cpu`` both run and the losses of the GPU and the CPU run are compared too.
Exit status 1 when a step is missing or its hash differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from datalane.client.torchtitan import titan_global_batch_size
from datalane.demos.torchtitan import (
    GLOBAL_BATCH,
    LANES,
    LOCAL_BATCH,
    reference_hashes,
    step_hashes,
    write_recipe,
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([-0-9.eE+naninf]+)")


def job(device: str, dump: Path, recipe: Path, steps: int, interval: int, tag: str,
        timeout: float) -> tuple[float, str]:
    """One torchrun job (1 process) to ``steps``; its seconds and its log."""
    entry = "torchtitan.train" if device == "cuda" else "datalane.demos.torchtitan_rank"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
           "-m", entry, "--module", "datalane.demos.torchtitan_rank",
           "--config", "llama3_debugmodel_datalane", "--dump_folder", str(dump),
           "--hf_assets_path", str(recipe.parent), "--dataloader.recipe", str(recipe),
           "--training.steps", str(steps), "--checkpoint.interval", str(interval),
           "--training.local_batch_size", str(LOCAL_BATCH), "--training.global_batch_size",
           str(titan_global_batch_size(LANES, GLOBAL_BATCH, 1, LOCAL_BATCH)),
           "--dataloader.digest_log", str(dump / tag / "digests-0")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False,
                          timeout=timeout)
    log = proc.stdout + proc.stderr
    (dump / f"{tag}.log").write_text(log)
    if proc.returncode:
        tail = "\n".join(log.splitlines()[-30:])
        raise SystemExit(f"{device} {tag}: {' '.join(cmd)}\nexited {proc.returncode}:\n{tail}")
    return time.monotonic() - start, log


def losses(device: str, dump: Path, log: str, skip: int = 0) -> dict[int, float]:
    """The run's loss per step: TorchTitan's metrics log lines (GPU) or the CPU trainer's
    ``loss.jsonl`` past its first ``skip`` lines (the resumed run appends to the first's)."""
    if device == "cuda":
        return {int(s): float(v) for s, v in _LOSS.findall(_ANSI.sub("", log))}
    lines = (dump / "loss.jsonl").read_text().splitlines()[skip:]
    return {rec["step"]: rec["loss"] for rec in map(json.loads, lines)}


def run_device(device: str, work: Path, recipe: Path, steps: int, interval: int,
               timeout: float) -> dict[str, dict[int, Any]]:
    dump = work / device
    shutil.rmtree(dump, ignore_errors=True)
    dump.mkdir(parents=True)
    seconds, log = job(device, dump, recipe, steps, interval, "first", timeout)
    first_loss = losses(device, dump, log)
    print(f"{device}: {steps} steps in {seconds:.0f} s", flush=True)
    ckpt = dump / "checkpoint"
    saved = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("step-*"))
    if interval not in saved:
        raise SystemExit(f"{device}: no checkpoint of step {interval} in {ckpt} ({saved})")
    for step in saved:
        if step > interval:
            shutil.rmtree(ckpt / f"step-{step}")
    seconds, log = job(device, dump, recipe, steps, interval, "resumed", timeout)
    print(f"{device}: resumed from step {interval}, steps {interval + 1}..{steps} in "
          f"{seconds:.0f} s", flush=True)
    return {"first": dict(step_hashes(dump / "first")),
            "resumed": dict(step_hashes(dump / "resumed")),
            "first_loss": dict(first_loss),
            "resumed_loss": dict(losses(device, dump, log, len(first_loss)))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="cuda", help="cuda, cpu or cuda,cpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--interval", type=int, default=4, help="checkpoint interval = resume step")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per torchrun job")
    args = ap.parse_args()
    if not 0 < args.interval < args.steps:
        ap.error("--interval must be between 1 and --steps - 1")
    args.work.mkdir(parents=True, exist_ok=True)
    recipe = write_recipe(args.work)
    reference = reference_hashes(recipe, args.steps)
    runs = {d: run_device(d, args.work, recipe, args.steps, args.interval, args.timeout)
            for d in args.devices.split(",")}
    bad = []
    cols = [(d, part) for d in runs for part in ("first", "resumed")]
    print("\n| step | datalane's stream (CPU, no TorchTitan) | "
          + " | ".join(f"{d} {part}" for d, part in cols) + " | "
          + " | ".join(f"loss {d} {part}" for d, part in cols) + " |")
    print("|---:|---|" + "---|" * len(cols) + "---:|" * len(cols))
    for step in range(1, args.steps + 1):
        cells, loss_cells = [], []
        for d, part in cols:
            want = part == "first" or step > args.interval
            got = runs[d][part].get(step)
            if want and got != reference[step]:
                bad.append(f"{d} {part} step {step}")
            mark = "=" if got == reference[step] else "X"
            cells.append(f"{(got or 'missing')[:16]} {mark}" if want else "")
            loss = runs[d][f"{part}_loss"].get(step)
            loss_cells.append("" if loss is None else f"{loss:.6f}")
        print(f"| {step} | {reference[step][:16]} | " + " | ".join(cells) + " | "
              + " | ".join(loss_cells) + " |")
    if "cuda" in runs and "cpu" in runs:
        gpu, cpu = runs["cuda"]["first_loss"], runs["cpu"]["first_loss"]
        diffs = [abs(float(gpu[s]) - float(cpu[s])) for s in gpu if s in cpu]
        if diffs:
            print(f"\nlargest |loss GPU - loss CPU| over {len(diffs)} steps: {max(diffs):.2e}")
    for d in runs:
        a, b = runs[d]["first_loss"], runs[d]["resumed_loss"]
        diffs = [abs(float(a[s]) - float(b[s])) for s in b if s in a]
        if diffs:
            print(f"{d}: largest |loss resumed - loss uninterrupted|: {max(diffs):.2e}")
    if bad:
        print(f"MISMATCH: {len(bad)} step hash(es) missing or different: {', '.join(bad)}")
        return 1
    print(f"MATCH: every step of every run ({', '.join(runs)}; resumed at step "
          f"{args.interval + 1}) has datalane's global batch hash")
    return 0


if __name__ == "__main__":
    sys.exit(main())
