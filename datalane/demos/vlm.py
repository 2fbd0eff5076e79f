"""The VLM demo: a tiny Qwen3.5 trained on image-caption pairs through datalane, resized
between DP degrees through a checkpoint, the same global batch every step.

``python -m datalane.demos.vlm`` (``make demo-vlm``) writes the generated image corpus
(:func:`datalane.testing.images.make_image_corpus`, JPEG, PNG and WebP) and a vision recipe of
8 lanes (8 sequences of 128 tokens a step, images resized to 128 x 128: 16 placeholder
tokens each), then runs four ``torchrun`` jobs on CPU with gloo, two at a time, each rank
:mod:`datalane.demos.vlm_rank` (TorchTitan's Qwen3.5 shrunk, :mod:`datalane.demos.vlm_model`,
fed by TorchTitan's ``DataLaneDataLoader`` in its VLM mode):

* ``DP2`` and ``DP1``: uninterrupted to ``--steps``, each saving a checkpoint
  (``torch.distributed.checkpoint``: model, AdamW, the dataloader's per-lane state) after
  ``--resume-at``;
* ``DP2>DP1``: 1 rank resumes from DP2's checkpoint; ``DP1>DP2``: 2 ranks from DP1's.

Every rank logs the SHA-256 of each of its lane windows per step; the step's global batch hash
is ``global_hash`` over the lanes in lane order. The demo prints one row per step next to
datalane's own stream (no torch) and exits 1 if any leg's hash differs or a step is missing,
or a loss differs from ``DP2``'s by more than ``--tolerance`` (relative): the DP degree
changes only the order of the gradient sums. ``--short`` is the CI size (4 steps, resized
after 2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from datalane.demos.torchtitan import (
    LANES,
    in_workdir,
    losses,
    mismatches,
    print_mismatch,
    print_steps,
    reference_hashes,
    step_hashes,
    steps_of,
)
from datalane.testing.images import make_image_corpus

__all__ = ["main", "write_recipe"]

SEQ_LEN = 127  # + 1 target: 128 tokens a sequence
LOCAL_BATCH = 2  # sequences per microbatch: DP 1 reads 4 a step, DP 2 2 each


def write_recipe(root: Path, images: int = 32) -> Path:
    """The corpus and its recipe: 8 lanes, one sequence each a step, chunks of 2 samples, the
    corpus repeated (an epoch of 32 pairs lasts about 4 steps)."""
    corpus = make_image_corpus(str(root / "corpus"), images=images, per_shard=8)
    recipe = {"lanes": LANES, "global_batch_size": LANES, "seq_len": SEQ_LEN,
              "packing": {"algorithm": "bestfit"}, "tokenizer": {"uri": corpus.tokenizer},
              "sources": [{"name": "pairs", "uris": corpus.shards, "chunk_rows": 2,
                           "epochs": None,  # repeated: --steps may run past one epoch
                           "vision": {"resize": {"size": [128, 128]}}}]}
    path = root / "corpus" / "vlm.json"
    path.write_text(json.dumps(recipe, indent=1), encoding="utf-8")
    return path


def _job(dp: int, recipe: Path, steps: int, dump: Path, log: Path, *, save_at: int = 0,
         ckpt: Path | None = None, load: Path | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={dp}", "-m", "datalane.demos.vlm_rank", "--recipe", str(recipe),
           "--seq-len", str(SEQ_LEN), "--local-batch", str(LOCAL_BATCH), "--steps", str(steps),
           "--dump", str(dump)]
    if save_at:
        cmd += ["--save-at", str(save_at), "--ckpt", str(ckpt)]
    if load is not None:
        cmd += ["--load", str(load)]
    dump.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait(jobs: dict[str, tuple[subprocess.Popen[bytes], Path]]) -> None:
    for name, (proc, log) in jobs.items():
        if proc.wait():
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
            raise SystemExit(f"{name} failed with exit code {proc.returncode}; the end of "
                             f"{log}:\n" + "\n".join(tail))


def run(work: Path, steps: int, resume_at: int, tolerance: float) -> int:
    recipe = write_recipe(work)
    started = time.monotonic()
    dumps = {name: work / name for name in ("dp2", "dp1", "dp2-dp1", "dp1-dp2")}
    print(f"DP2, DP1: torchrun steps 1..{steps}, checkpoint after {resume_at}", flush=True)
    _wait({name: (_job(dp, recipe, steps, dumps[name], work / f"{name}.log",
                       save_at=resume_at, ckpt=work / f"ckpt-{name}"), work / f"{name}.log")
           for name, dp in (("dp2", 2), ("dp1", 1))})
    print(f"DP2>DP1, DP1>DP2: torchrun steps {resume_at + 1}..{steps} from the other's "
          f"checkpoint", flush=True)
    _wait({name: (_job(dp, recipe, steps, dumps[name], work / f"{name}.log",
                       load=work / f"ckpt-{parent}"), work / f"{name}.log")
           for name, dp, parent in (("dp2-dp1", 1, "dp2"), ("dp1-dp2", 2, "dp1"))})
    total = time.monotonic() - started

    names = ["DP2", "DP1", "DP2>DP1", "DP1>DP2"]
    parents = [None, None, "dp2", "dp1"]
    hashes, loss = [], []
    for dump, parent in zip(dumps.values(), parents, strict=True):
        h, lo = step_hashes(dump), losses(dump)
        if parent is not None:  # the steps before the resize are the parent job's
            h = {**{s: v for s, v in step_hashes(work / parent).items() if s <= resume_at}, **h}
            lo = {**{s: v for s, v in losses(work / parent).items() if s <= resume_at}, **lo}
        hashes.append(h)
        loss.append(lo)
    reference = reference_hashes(recipe, steps)
    bad = mismatches(reference, hashes, steps)
    print_steps(names, reference, hashes, bad, loss, resume_at)
    drifts = [max((abs(lo.get(s, float("inf")) - loss[0][s]) / max(abs(loss[0][s]), 1e-30)
                   for s in range(1, steps + 1)), default=0.0) for lo in loss[1:]]
    each = ", ".join(f"{n} {d:.2e}" for n, d in zip(names[1:], drifts, strict=True))
    print(f"\n6 torchrun ranks in {total:.0f}s; largest relative loss difference to DP2: "
          f"{each} (tolerance {tolerance:.0e})")
    if bad:
        print_mismatch(names, bad)
        return 1
    if max(drifts) > tolerance:
        print(f"LOSS DIFFERS: beyond the tolerance {tolerance:.0e}")
        return 1
    print(f"MATCH: all {steps} global batches identical in DP2, DP1, DP2>DP1 and DP1>DP2 "
          f"(resized at step {resume_at + 1}) and in datalane's own stream; losses within "
          f"{tolerance:.0e}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m datalane.demos.vlm",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=8, help="optimizer steps")
    p.add_argument("--resume-at", type=int, default=4, help="the step checkpointed")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest relative loss difference to DP2")
    p.add_argument("--short", action="store_true", help="CI size: 4 steps, resize after 2")
    p.add_argument("--workdir", help="keep the corpus, checkpoints and logs here")
    args = p.parse_args(argv)
    steps, resume_at = steps_of(p, args)
    return in_workdir(args.workdir, "datalane-vlm-",
                      lambda work: run(work, steps, resume_at, args.tolerance))


if __name__ == "__main__":
    sys.exit(main())
