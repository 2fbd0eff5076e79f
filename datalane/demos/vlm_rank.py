"""One rank of the VLM demo: a tiny Qwen3.5 trained on CPU (gloo) on datalane's image-text
batches, checkpointed with ``torch.distributed.checkpoint``.

Run under ``torchrun`` by :mod:`datalane.demos.vlm`. The data is TorchTitan's
:class:`~datalane.client.torchtitan.DataLaneDataLoader` built as TorchTitan's ``Trainer``
builds it; for the vision recipe it yields TorchTitan's multimodal ``(input_dict, labels)``
(its VLM mode), which the model (:func:`datalane.demos.vlm_model.tiny_qwen35`) takes as its
keyword arguments, with ``attention_masks`` from the model's ``get_attention_masks`` as
TorchTitan's ``post_dataloading_process`` adds them. One optimizer step is one datalane step:
the rank reads the step's microbatches, the loss of each is its summed token cross-entropy
divided by the step's trained targets summed over the ranks (TorchTitan's
``global_valid_tokens``), the gradients are summed over the ranks (what TorchTitan's FSDP
computes), then AdamW steps. Every parameter's gradient is materialised (zeros where nothing
reached it) so every rank all-reduces the same tensors.

The checkpoint (``--save-at K``, into ``--ckpt``) holds the model and optimizer (FQN-keyed, by
``get_state_dict``), the dataloader (one entry per lane: it loads on any DP degree) and the
step; ``--load`` resumes from one. Rank 0 appends ``{"step", "loss"}`` lines to
``<dump>/loss.jsonl``; each rank's digest log goes to ``<dump>/digests-<dp>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from datalane.client.torchtitan import DataLaneDataLoader
from datalane.demos.vlm_model import cpu_attention, tiny_qwen35

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m datalane.demos.vlm_rank")
    p.add_argument("--recipe", required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--local-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dump", required=True)
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--ckpt", default="")
    p.add_argument("--load", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cpu_attention()
    model = tiny_qwen35(seed=0)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    loader = DataLaneDataLoader.Config(
        recipe=args.recipe, digest_log=str(Path(args.dump) / f"digests-dp{world}")).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=args.seq_len,
        local_batch_size=args.local_batch, snapshot_every_n_steps=None)
    assert loader.vlm, "the recipe has no vision source"
    step = torch.zeros((), dtype=torch.int64)
    if args.load:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd, "dataloader": loader, "step": step}
        dcp.load(state, checkpoint_id=args.load)  # type: ignore[attr-defined]
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    per_step = loader.loader.per_step
    data = iter(loader)
    while int(step) < args.steps:
        batches = [next(data) for _ in range(per_step)]
        tokens = sum(((labels != -100).sum() for _, labels in batches), torch.tensor(0))
        dist.all_reduce(tokens)
        total = torch.zeros(())
        optimizer.zero_grad(set_to_none=False)
        for inputs, labels in batches:
            extra = {k: v for k, v in inputs.items() if k != "input"}
            extra["attention_masks"] = model.get_attention_masks(positions=inputs["positions"])
            logits = model(inputs["input"], **extra)
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                reduction="sum") / tokens.clamp(min=1)
            loss.backward()  # type: ignore[no-untyped-call]
            total += loss.detach()
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)
        dist.all_reduce(total)
        optimizer.step()
        step += 1
        if rank == 0:
            with open(Path(args.dump) / "loss.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": int(step), "loss": float(total)}) + "\n")
        if int(step) == args.save_at:
            msd, osd = get_state_dict(model, optimizer)
            dcp.save({"model": msd, "optim": osd, "dataloader": loader,  # type: ignore[attr-defined]
                      "step": step}, checkpoint_id=args.ckpt)
    dist.barrier()  # every rank's checkpoint part written before any leaves
    loader.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.exit(main())
