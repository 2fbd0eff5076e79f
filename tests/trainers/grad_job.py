"""One rank of a gloo DDP job computing the gradient of a tiny model on datalane's stream,
with the loss normalized over the global batch (``item["global_tokens"]``).

Run by tests/trainers/test_uneven_grad.py. Each step: every microbatch's loss is
``sum(token losses) / global_tokens * dp_world_size`` (DDP averages the gradients over the
ranks); after the step's microbatches the rank writes its (DDP-averaged) gradient, then takes
an SGD step. Writes {"grads": [[floats] per step], "microbatches": [n per step]} to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from datalane import load_recipe
from datalane.client import InProcessLoader
from datalane.client.torch import DataLaneDataset

VOCAB = 61  # token ids are folded into a small vocabulary: the test compares gradients


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", required=True)
    p.add_argument("--microbatch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB))
    model = model.double()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    loader = InProcessLoader(load_recipe(args.recipe), rank, world, args.microbatch)
    per_step = loader.per_step
    it = iter(DataLaneDataset(loader, global_tokens=True))
    grads, counts = [], []
    for _ in range(args.steps):
        opt.zero_grad()
        for _ in range(per_step):
            item = next(it)
            ids = item["input_ids"] % VOCAB
            labels = torch.where(item["labels"] == -100, item["labels"], item["labels"] % VOCAB)
            logits = ddp(ids)
            losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                       labels.reshape(-1), ignore_index=-100,
                                                       reduction="sum")
            loss = losses / item["global_tokens"] * world
            loss.backward()  # type: ignore[no-untyped-call]
        grads.append(torch.cat([q.grad.reshape(-1) for q in model.parameters()
                                if q.grad is not None]).tolist())
        counts.append(per_step)
        opt.step()
    loader.close()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"grads": grads, "microbatches": counts,
                   "lanes": list(loader.lanes), "pid": os.getpid()}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
