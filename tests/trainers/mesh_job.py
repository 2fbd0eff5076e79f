"""One rank of a gloo job with a (dp, tp) DeviceMesh reading its data-parallel rank through
the pod's sidecar as one of the tensor-parallel readers of that rank.

Run by tests/trainers/test_mesh.py. Writes {"dp": [rank, size], "reader": [i, n], "hashes":
[sha256(input_ids) of each microbatch], "reconnects": n} to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from datalane.client import SidecarLoader
from datalane.client.torch import DataLaneDataset


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--microbatch", type=int, required=True)
    p.add_argument("--take", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    loader = SidecarLoader(args.socket, mesh=mesh["dp"], readers=args.tp,
                           reader=mesh["tp"].get_local_rank(),
                           microbatch_size=args.microbatch)
    it = iter(DataLaneDataset(loader))
    hashes = [hashlib.sha256(next(it)["input_ids"].numpy().tobytes()).hexdigest()
              for _ in range(args.take)]
    dist.barrier()  # every session is open ...
    stats = loader.stats()
    dist.barrier()  # ... and still open while each rank looks
    with open(args.out, "w") as f:
        json.dump({"dp": [loader.rank, loader.world_size],
                   "reader": [loader.reader, loader.readers], "hashes": hashes,
                   "reconnects": loader.reconnects, "stats": stats}, f)
    loader.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
