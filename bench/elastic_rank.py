#!/usr/bin/env python3
"""One rank of the elastic loss-curve experiment: DDP over gloo, steps ``--start..--stop``.

bench/elastic_training.py starts ``WORLD_SIZE`` of these with ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE`` set. Each builds the same :class:`TinyLM` from the
same seed, an AdamW with a fixed learning rate, and its data source:

* ``--loader datalane``: ``DataLaneDataset(InProcessLoader(recipe, rank, world, mb))``; the
  rank iterates the dataset's loader (whose last microbatch of a step carries the lane
  digests) and turns microbatches into tensors with ``datalane.client.torch.to_tensors``.
* ``--loader usual``: :class:`elastic_usual.UsualStream` (``DistributedSampler`` +
  ``DataLoader`` over packed rows).

A step accumulates ``global_batch / (world * mb)`` microbatches, so every world size trains on
global batches of the same number of sequences. With datalane any world size from 1 to the
lanes works: a world size that does not divide the lanes (7 ranks over 8: one rank owns 2
lanes, six own 1) steps every rank through ``ceil(L/W) * (B/L) / mb`` microbatches, a rank with
fewer lanes ending its step with fully padded ones (labels all -100:
``datalane.spec.lanes.rank_shape``). The loss is the mean over every token of the global batch:
each microbatch's summed cross-entropy is divided by the global token count - for datalane the
microbatches' ``step_tokens`` summed over the ranks (what ``DataLaneDataset(...,
global_tokens=True)`` gives), for the usual loader the labels counted - times the world size,
which DDP's gradient averaging divides out again. ``--resume`` and
``--save`` are torch.distributed.checkpoint directories holding ``model``, ``optim`` and
``data``. Rank 0 writes one JSON line per step: the loss, the token count, the SHA-256 of the
global batch's token bytes (rank by rank, microbatch by microbatch, padded microbatches left
out), an order-free hash of its
set of sequences (to tell "the same sequences in another order" from other data) and, for
datalane, the global step hash composed from the lane digests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from elastic_model import ModelConfig, TinyLM, global_loss_terms
from elastic_usual import UsualStream
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from datalane.client import InProcessLoader
from datalane.client.torch import DataLaneDataset, to_tensors
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import rank_shape
from datalane.spec.recipe import load_recipe


@dataclass
class LocalStep:
    """One rank's part of a step: its microbatches, as model inputs and as raw rows."""

    inputs: list[torch.Tensor] = field(default_factory=list)
    labels: list[torch.Tensor] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)  # int32 (mb, seq_len + 1), real ones
    lanes: dict[int, bytes] = field(default_factory=dict)  # datalane: lane window digests
    step_tokens: int | None = None  # datalane: the rank's trained targets in the step


class DatalaneSource:
    def __init__(self, recipe_path: str, rank: int, world: int, microbatch: int) -> None:
        recipe = load_recipe(recipe_path)
        loader = InProcessLoader(recipe, rank, world, microbatch, Knobs(workers=1))
        self.loader = loader
        self.stateful = DataLaneDataset(loader)
        self.shape = rank_shape(recipe.lanes, recipe.global_batch_size, world, rank, microbatch)
        self._it: Any = None

    def next_step(self, step: int, accum: int) -> LocalStep:
        if self._it is None:
            self._it = iter(self.loader)
        out = LocalStep()
        for i in range(accum):
            batch = next(self._it)
            if (batch.step, batch.index) != (step, i):
                raise SystemExit(f"datalane handed step {batch.step} microbatch {batch.index} "
                                 f"where the trainer is at step {step} microbatch {i}")
            t = to_tensors(batch)
            out.inputs.append(t["input_ids"])
            out.labels.append(t["labels"])
            if i < self.shape.real:  # the rest of the step is padding (labels all -100)
                out.rows.append(batch.input_ids)
            out.lanes.update(batch.lane_digests)
            out.step_tokens = batch.step_tokens
        return out

    def close(self) -> None:
        self.loader.close()


class UsualSource:
    def __init__(self, packed: str, rank: int, world: int, microbatch: int, seed: int) -> None:
        self.stateful = UsualStream(packed, rank, world, microbatch, seed)

    def next_step(self, step: int, accum: int) -> LocalStep:
        out = LocalStep()
        for _ in range(accum):
            mb = self.stateful.next_microbatch()
            out.inputs.append(mb[:, :-1].contiguous())
            out.labels.append(mb[:, 1:].contiguous())
            out.rows.append(mb.numpy().astype(np.int32))
        return out

    def close(self) -> None:
        pass


def _save(path: str, model: torch.nn.Module, optim: torch.optim.Optimizer, data: Any) -> None:
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.save({"model": model_sd, "optim": optim_sd, "data": data},  # type: ignore[attr-defined]
             checkpoint_id=path)


def _load(path: str, model: torch.nn.Module, optim: torch.optim.Optimizer, data: Any) -> None:
    """Fill model, optimizer and data state from a checkpoint saved by any world size."""
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.load({"model": model_sd, "optim": optim_sd, "data": data},  # type: ignore[attr-defined]
             checkpoint_id=path)
    set_state_dict(model, optim, model_state_dict=model_sd, optim_state_dict=optim_sd)


def _step_record(step: int, loss: float, tokens: int, local: LocalStep, rank: int,
                 world: int) -> dict[str, Any] | None:
    """Rank 0's record of a step: the global batch's hashes, gathered from every rank (whose
    real rows differ in number when the world size does not divide the lanes)."""
    rows = np.ascontiguousarray(np.concatenate(local.rows), dtype="<i4")
    parts: list[np.ndarray | None] = [None] * world
    dist.all_gather_object(parts, rows)
    lanes: list[dict[int, bytes] | None] = [None] * world
    dist.all_gather_object(lanes, local.lanes)
    if rank != 0:
        return None
    batch = np.concatenate([p for p in parts if p is not None])  # rank by rank, mb by mb
    rows_sorted = sorted(hashlib.sha256(row.tobytes()).digest() for row in batch)
    rec: dict[str, Any] = {"step": step, "loss": loss, "tokens": tokens,
                           "tokens_sha256": hashlib.sha256(batch.tobytes()).hexdigest(),
                           "rows_set_sha256": hashlib.sha256(b"".join(rows_sorted)).hexdigest()}
    digests: dict[int, bytes] = {}
    for d in lanes:
        digests.update(d or {})
    if digests:
        rec["global_hash"] = global_hash(digests[k] for k in sorted(digests))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loader", choices=("datalane", "usual"), required=True)
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--packed", help="the usual loader's packed rows (.npy)")
    ap.add_argument("--start", type=int, required=True)
    ap.add_argument("--stop", type=int, required=True)
    ap.add_argument("--resume")
    ap.add_argument("--save")
    ap.add_argument("--log", required=True, help="rank 0's JSON lines, one per step")
    ap.add_argument("--microbatch", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clip (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    recipe = load_recipe(args.recipe)
    if args.loader == "datalane":  # any world size; the same microbatch count on every rank
        accum = rank_shape(recipe.lanes, recipe.global_batch_size, world, rank,
                           args.microbatch).total
    else:
        per_step = recipe.global_batch_size // world
        if per_step * world != recipe.global_batch_size or per_step % args.microbatch:
            raise SystemExit(f"global batch {recipe.global_batch_size} does not split into "
                             f"microbatches of {args.microbatch} over {world} ranks")
        accum = per_step // args.microbatch

    torch.manual_seed(args.seed)
    cfg = ModelConfig(vocab=1024, seq_len=recipe.seq_len, d_model=args.d_model,
                      layers=args.layers, heads=args.heads)
    model = DistributedDataParallel(TinyLM(cfg))
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                              weight_decay=0.1)
    source: DatalaneSource | UsualSource
    if args.loader == "datalane":
        source = DatalaneSource(args.recipe, rank, world, args.microbatch)
    else:
        source = UsualSource(args.packed, rank, world, args.microbatch, args.seed)
    if args.resume:
        _load(args.resume, model, optim, source.stateful)

    log = open(args.log, "a", encoding="utf-8") if rank == 0 else None  # noqa: SIM115
    for step in range(args.start, args.stop):
        local = source.next_step(step, accum)
        labelled = sum(int((y != -100).sum()) for y in local.labels)
        if local.step_tokens is not None and local.step_tokens != labelled:
            raise SystemExit(f"step {step}: the microbatches' step_tokens {local.step_tokens} "
                             f"is not the {labelled} trained labels of rank {rank}'s step")
        counts = torch.tensor([labelled if local.step_tokens is None else local.step_tokens],
                              dtype=torch.float64)
        dist.all_reduce(counts)
        tokens = int(counts.item())
        total = torch.zeros((), dtype=torch.float64)
        for i, (x, y) in enumerate(zip(local.inputs, local.labels, strict=True)):
            with model.no_sync() if i < accum - 1 else nullcontext():
                terms = global_loss_terms(model(x), y)
                (terms * (world / tokens)).backward()  # type: ignore[no-untyped-call]
            total += terms.detach().double()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optim.step()
        optim.zero_grad(set_to_none=True)
        dist.all_reduce(total)
        rec = _step_record(step, float(total.item()) / tokens, tokens, local, rank, world)
        if log is not None and rec is not None:
            log.write(json.dumps(rec) + "\n")
            log.flush()
    if args.save:
        _save(args.save, model, optim, source.stateful)
    if log is not None:
        log.close()
    source.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
