"""One rank of the TorchTitan demo: TorchTitan's debug llama3 trained on CPU with datalane data.

``llama3_debugmodel_datalane`` is a TorchTitan config-registry function: TorchTitan's own
``llama3_debugmodel`` with :class:`~datalane.client.torchtitan.DataLaneDataLoader` as its
dataloader. On GPUs it runs under TorchTitan's trainer unchanged::

    torchrun --nproc-per-node 8 -m torchtitan.train --module datalane.demo_torchtitan_rank \\
        --config llama3_debugmodel_datalane --dataloader.recipe recipe.yaml \\
        --hf_assets_path <folder with the recipe's tokenizer.json>

TorchTitan 0.3.0's ``Trainer`` cannot run without an accelerator: with none,
``torchtitan.tools.utils.device_type`` falls back to ``"cuda"`` and ``Trainer.__init__`` calls
``torch.cuda.set_device`` before anything a config can change ("Found no NVIDIA driver"); and
its llama3 attention backends are GPU-only in training (FlexAttention has no CPU backward,
varlen needs flash-attention kernels). So on CPU, ``python -m datalane.demo_torchtitan_rank``
(under torchrun, gloo) parses the same TorchTitan command line with TorchTitan's
``ConfigManager``, switches the attention to TorchTitan's own ``ScaledDotProductAttention``
(plain causal) and runs :class:`CpuTrainer`: ``Trainer.train``'s loop over components built from
the config exactly as the Trainer builds them - the model, loss, optimizers, LR schedulers, the
dataloader (same build arguments) and TorchTitan's DCP ``CheckpointManager`` - with data-parallel
gradients summed by an all-reduce (what FSDP's reduce-scatter computes).

Rank 0 appends ``{"step", "loss"}`` lines to ``<dump_folder>/loss.jsonl``. Caller:
:mod:`datalane.demo_torchtitan` (one torchrun per leg).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import IGNORE_INDEX, ChunkedLossWrapper
from torchtitan.components.validate import Validator
from torchtitan.config import ConfigManager
from torchtitan.distributed.utils import clip_grad_norm_
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from datalane.client.torchtitan import DataLaneDataLoader, TitanBatch
from datalane.spec.errors import ConfigError

__all__ = ["CpuTrainer", "llama3_debugmodel_datalane", "main"]


def llama3_debugmodel_datalane() -> Trainer.Config:
    """TorchTitan's debug llama3 reading datalane lanes; for the demo recipe (sequences of 64
    tokens, 16 per step): set ``--dataloader.recipe`` (or use the sidecar)."""
    config = llama3_debugmodel()
    config.dataloader = DataLaneDataLoader.Config()
    config.validator = Validator.Config(enable=False)  # its dataloader is TorchTitan's c4 test set
    config.training.seq_len = 64
    config.training.local_batch_size = 8
    config.training.global_batch_size = 16  # the recipe's: one TorchTitan step = one datalane step
    config.checkpoint = CheckpointManager.Config(enable=True, interval=1000, keep_latest_k=0,
                                                 last_save_model_only=False,
                                                 initial_load_model_only=False)
    config.debug.seed = 7
    return config


def use_cpu_attention(config: Trainer.Config) -> None:
    """Every layer's inner attention -> TorchTitan's SDPA backend (causal; trains on CPU)."""
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()


class CpuTrainer:
    """``Trainer.train`` on CPU and gloo for one data-parallel rank; a DCP ``Stateful``
    (``train_state``) like the Trainer."""

    def __init__(self, config: Trainer.Config) -> None:
        self.config = config
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.dp_rank, self.dp_world_size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(config.debug.seed or 0)  # the same initial weights on every rank

        model_config = config.model_spec.model
        model_config.update_from_config(config=config)
        with torch.device("meta"):
            model = model_config.build()
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        self.model = model
        self.loss_fn = config.loss.build(compile_config=config.compile)
        if isinstance(self.loss_fn, ChunkedLossWrapper):  # as Trainer.__init__ does
            self.loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True

        training = config.training
        global_batch = training.global_batch_size
        if global_batch < 0:
            global_batch = training.local_batch_size * self.dp_world_size
        per_pass = training.local_batch_size * self.dp_world_size
        if global_batch % per_pass:
            raise ConfigError(f"training.global_batch_size {global_batch} is not a multiple of "
                             f"local_batch_size x DP degree = {per_pass}")
        self.gradient_accumulation_steps = global_batch // per_pass

        self.optimizers = config.optimizer.build(model_parts=[model])
        self.lr_schedulers = config.lr_scheduler.build(optimizers=self.optimizers,
                                                       training_steps=training.steps)
        self.step = 0
        self.ntokens_seen = 0
        tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
        self.dataloader = config.dataloader.build(
            dp_world_size=self.dp_world_size, dp_rank=self.dp_rank, tokenizer=tokenizer,
            seq_len=training.seq_len, local_batch_size=training.local_batch_size,
            snapshot_every_n_steps=config.checkpoint.interval * self.gradient_accumulation_steps)
        self.checkpointer = config.checkpoint.build(
            dataloader=self.dataloader, model_parts=[model], optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers, states={"train_state": self},
            sd_adapter=None,  # only used to export Hugging Face weights
            base_folder=config.dump_folder)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]
        self.ntokens_seen = state["ntokens_seen"]

    def train_step(self, data: Iterator[TitanBatch]) -> float:
        """One optimizer step over ``gradient_accumulation_steps`` microbatches; the global
        average loss (every rank's token-normalized sum, all-reduced)."""
        self.optimizers.zero_grad()
        microbatches = [next(data) for _ in range(self.gradient_accumulation_steps)]
        global_valid = sum(((labels != IGNORE_INDEX).sum() for _, labels in microbatches),
                           torch.tensor(0))
        dist.all_reduce(global_valid)
        loss_sum = torch.zeros(())
        for inputs, labels in microbatches:
            self.ntokens_seen += labels.numel()
            pred = self.model(inputs["input"], positions=inputs["positions"])
            loss, _ = self.loss_fn(pred, labels, global_valid, positions=inputs["positions"])
            loss.backward()
            loss_sum += loss.detach()
        params = [p for p in self.model.parameters() if p.grad is not None]
        for p in params:  # data parallelism: sum the ranks' gradients (the loss is
            dist.all_reduce(p.grad)  # already divided by the global token count)
        clip_grad_norm_(params, self.config.training.max_norm, foreach=True)
        self.optimizers.step()
        self.lr_schedulers.step()
        dist.all_reduce(loss_sum)
        return float(loss_sum)

    def train(self, preempt_after: int | None = None) -> None:
        """Train to ``training.steps``; or stop after step ``preempt_after`` as a preempted
        job would (the LR schedule still spans ``training.steps``)."""
        config = self.config
        self.checkpointer.load(step=config.checkpoint.load_step)
        data = iter(self.dataloader)
        while self.step < config.training.steps and self.step != preempt_after:
            self.step += 1
            loss = self.train_step(data)
            if self.dp_rank == 0:
                with open(os.path.join(config.dump_folder, "loss.jsonl"), "a",
                          encoding="utf-8") as f:
                    f.write(json.dumps({"step": self.step, "loss": loss}) + "\n")
            self.checkpointer.save(self.step, last_step=self.step == config.training.steps)

    def close(self) -> None:
        self.checkpointer.close()
        self.dataloader.close()


def main(argv: list[str] | None = None) -> int:
    """``--module datalane.demo_torchtitan_rank --config llama3_debugmodel_datalane`` plus
    any TorchTitan flags, as for ``torchtitan.train``; and ``--preempt-after K`` (not a
    TorchTitan flag): stop after step K (with ``--checkpoint.interval K`` it is saved)."""
    args = list(sys.argv[1:] if argv is None else argv)
    preempt_after = None
    if "--preempt-after" in args:
        i = args.index("--preempt-after")
        if i + 1 == len(args) or not args[i + 1].isdigit():
            raise ConfigError(f"--preempt-after needs a step number, got {args[i + 1:i + 2]}")
        preempt_after = int(args[i + 1])
        del args[i:i + 2]
    config = ConfigManager().parse_args(args)
    use_cpu_attention(config)
    trainer = CpuTrainer(config)
    try:
        trainer.train(preempt_after)
    finally:
        trainer.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
