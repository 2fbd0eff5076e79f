"""One rank of a real torch.distributed (gloo) job that saves or loads datalane's data state
with torch.distributed.checkpoint, then records the microbatches it reads next.

Run by tests/trainers/test_dcp.py as W subprocesses (RANK, WORLD_SIZE, MASTER_ADDR/PORT in
the environment, as torchrun sets them). Writes ``[[step, index, sha256(input_ids),
sha256(labels)], ...]`` of the next ``--follow`` microbatches to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from datalane import load_recipe
from datalane.client import InProcessLoader, SidecarLoader
from datalane.client.torch import DataLaneDataset


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", required=True)
    p.add_argument("--socket", default="")
    p.add_argument("--microbatch", type=int, required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--save-after", type=int, default=-1, help="microbatches before dcp.save")
    p.add_argument("--follow", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.socket:  # rank and world size from torchrun's environment
        loader = SidecarLoader(args.socket, microbatch_size=args.microbatch, transport="inline")
    else:
        loader = InProcessLoader(load_recipe(args.recipe), microbatch_size=args.microbatch)
    assert (loader.rank, loader.world_size) == (rank, world)
    data = DataLaneDataset(loader)
    it = iter(data)
    if args.save_after >= 0:
        for _ in range(args.save_after):
            next(it)
        dcp.save({"data": data}, checkpoint_id=args.ckpt)
    else:
        try:
            dcp.load({"data": data}, checkpoint_id=args.ckpt)
        except Exception as e:  # the test reads the refusal
            print(f"LOAD-FAILED {type(e).__name__}: {e}", file=sys.stderr)
            return 3
        it = iter(data)
    rows = []
    for _ in range(args.follow):
        mb = next(it)
        rows.append([hashlib.sha256(mb["input_ids"].numpy().tobytes()).hexdigest(),
                     hashlib.sha256(mb["labels"].numpy().tobytes()).hexdigest()])
    with open(args.out, "w") as f:
        json.dump(rows, f)
    loader.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.exit(main())
