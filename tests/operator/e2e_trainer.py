"""A trainer process for the operator's end-to-end test (the PyTorchJob's container command).

It does what a torchrun worker of a real job would do with datalane: read its rank and world
size from the environment (the data-parallel ones from ``$DATALANE_DP_SIZE`` and
``$DATALANE_DP_READERS`` under tensor parallelism, where the TP peers of a pod read one DP
rank), stream its microbatches from the pod's sidecar at ``$DATALANE_SOCKET``, and ask for a
checkpoint every ``--checkpoint-every`` steps. Instead of training, it prints the lane window
digests of every step (JSON lines, with its DP rank, DP world size, readers and reader), from
which the test composes the global batch hashes.

    python -m tests.operator.e2e_trainer --steps 6 --checkpoint-every 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--microbatch", type=int, default=2)
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="sleep after each step, as a step of training would take")
    args = p.parse_args(argv)
    from datalane.client.sidecar import SidecarLoader

    resume = os.environ.get("E2E_RESUME_STEP")
    loader = SidecarLoader(microbatch_size=args.microbatch,
                           resume_step=int(resume) if resume else None)
    done = 0
    for batch in loader:
        if not batch.lane_digests:
            continue  # not the last microbatch of the step
        done += 1
        print(json.dumps({"step": batch.step, "rank": loader.rank, "world": loader.world_size,
                          "readers": loader.readers, "reader": loader.reader,
                          "lanes": {str(k): v.hex() for k, v in batch.lane_digests.items()}}),
              flush=True)
        if args.checkpoint_every and done % args.checkpoint_every == 0:
            print(json.dumps({"checkpoint": loader.checkpoint()}), flush=True)
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if done == args.steps:
            break
    loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
