"""One rank of the TorchTitan demo: TorchTitan's debug llama3 trained on CPU with datalane data.

``llama3_debugmodel_datalane`` is a TorchTitan config-registry function: TorchTitan's own
``llama3_debugmodel`` with :class:`~datalane.client.torchtitan.DataLaneDataLoader` as its
dataloader. On GPUs it runs under TorchTitan's trainer unchanged::

    torchrun --nproc-per-node 8 -m torchtitan.train --module datalane.demos.torchtitan_rank \\
        --config llama3_debugmodel_datalane --dataloader.recipe recipe.yaml \\
        --hf_assets_path <folder with the recipe's tokenizer.json>

TorchTitan 0.3.0's ``Trainer`` cannot run without an accelerator: with none,
``torchtitan.tools.utils.device_type`` falls back to ``"cuda"`` and ``Trainer.__init__`` calls
``torch.cuda.set_device`` before anything a config can change ("Found no NVIDIA driver"); and
its llama3 attention backends are GPU-only in training (FlexAttention has no CPU backward,
varlen needs flash-attention kernels). So on CPU, ``python -m datalane.demos.torchtitan_rank``
(under torchrun, gloo) parses the same TorchTitan command line with TorchTitan's
``ConfigManager``, switches the attention to TorchTitan's own ``ScaledDotProductAttention``
(plain causal) and runs :class:`CpuTrainer`: a ``Trainer`` whose ``__init__`` builds the
components from the config exactly as the Trainer builds them - TorchTitan's ``ParallelDims``
meshes (on CPU), the model, loss, optimizers, LR schedulers, the dataloader (same build
arguments) and TorchTitan's DCP ``CheckpointManager`` - and which trains with TorchTitan's own
``Trainer.train_step`` (so the loss normalization by the global count of trained tokens is
TorchTitan's), the ranks' gradients summed by an all-reduce after each step's last microbatch
(what FSDP's reduce-scatter computes).

Rank 0 appends ``{"step", "loss", "grad_norm"}`` lines (TorchTitan's ``global_avg_loss`` and
gradient norm) to ``<dump_folder>/loss.jsonl``. Caller:
:mod:`datalane.demos.torchtitan` (one torchrun per leg).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import ChunkedLossWrapper
from torchtitan.components.validate import Validator
from torchtitan.config import ConfigManager
from torchtitan.distributed import parallel_dims as parallel_dims_module
from torchtitan.distributed import utils as dist_utils
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from datalane.client.torchtitan import DataLaneDataLoader
from datalane.spec.errors import ConfigError

__all__ = ["CpuTrainer", "llama3_debugmodel_datalane", "main"]


def llama3_debugmodel_datalane() -> Trainer.Config:
    """TorchTitan's debug llama3 reading datalane lanes; for the demo recipe (8 lanes,
    sequences of 64 tokens, 16 per step): set ``--dataloader.recipe`` (or use the sidecar).
    Microbatches of 2 sequences serve every DP degree from 1 to 8; on a degree that does not
    divide the lanes set ``--training.global_batch_size`` to the padded global batch
    (:func:`~datalane.client.torchtitan.titan_global_batch_size`: 18 on 3 ranks)."""
    config = llama3_debugmodel()
    config.dataloader = DataLaneDataLoader.Config()
    config.validator = Validator.Config(enable=False)  # its dataloader is TorchTitan's c4 test set
    config.training.seq_len = 64
    config.training.local_batch_size = 2
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


class _LossLog:
    """What ``Trainer.train_step`` needs of TorchTitan's ``MetricsProcessor``: log every step,
    and keep what it logs (``global_avg_loss`` is the loss over the global batch)."""

    def __init__(self) -> None:
        self.loss = float("nan")
        self.max_loss = float("nan")
        self.grad_norm = float("nan")

    def should_log(self, step: int) -> bool:
        return True

    def log(self, step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
            extra_metrics: dict[str, Any] | None = None) -> None:
        self.loss, self.max_loss, self.grad_norm = global_avg_loss, global_max_loss, grad_norm


class CpuTrainer(Trainer):  # type: ignore[misc]
    """TorchTitan's ``Trainer`` on CPU and gloo for one data-parallel rank: its own
    ``train_step`` (the microbatch loop, the global count of trained tokens summed over the
    "batch" mesh, the loss normalized by it, gradient clipping, optimizer and LR steps) over
    components built from the config as ``Trainer.__init__`` builds them - which itself cannot
    run without an accelerator. Data parallelism sums the ranks' gradients after the step's
    last microbatch (what TorchTitan's FSDP computes)."""

    def __init__(self, config: Trainer.Config) -> None:
        self.config = config
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.device = torch.device("cpu")
        # TorchTitan's meshes, on CPU: its device_type falls back to "cuda" without a GPU
        parallel_dims_module.device_type = "cpu"
        self.parallel_dims = ParallelDims.from_config(config.parallelism, dist.get_world_size())
        if self.parallel_dims.non_data_parallel_size > 1:
            raise ConfigError("the CPU demo trainer is data parallel only; set no TP, PP, CP "
                              "or EP degree")
        if self.parallel_dims.dp_enabled:
            batch_mesh = self.parallel_dims.get_mesh("batch")
            self.dp_world_size, self.dp_rank = batch_mesh.size(), batch_mesh.get_local_rank()
        else:
            self.dp_world_size, self.dp_rank = 1, 0
        torch.manual_seed(config.debug.seed or 0)  # the same initial weights on every rank

        model_config = config.model_spec.model
        model_config.update_from_config(config=config)
        self.model_config = model_config
        with torch.device("meta"):
            model = model_config.build()
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        self.loss_fn = config.loss.build(compile_config=config.compile)
        if isinstance(self.loss_fn, ChunkedLossWrapper):  # as Trainer.__init__ does
            self.loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        self.model_parts = [model]

        training = config.training  # the batch sizes as Trainer.__init__ checks them
        global_batch = training.global_batch_size
        if global_batch < 0:
            global_batch = training.local_batch_size * self.dp_world_size
        per_pass = training.local_batch_size * self.dp_world_size
        if global_batch % per_pass:
            raise ConfigError(f"training.global_batch_size {global_batch} is not a multiple of "
                              f"local_batch_size x DP degree = {per_pass}")
        self.gradient_accumulation_steps = global_batch // per_pass
        self.num_pipeline_parallel_microbatches = 1

        self.optimizers = config.optimizer.build(model_parts=[model])
        self.lr_schedulers = config.lr_scheduler.build(optimizers=self.optimizers,
                                                       training_steps=training.steps)
        self.metrics_processor = _LossLog()
        self.train_context = dist_utils.get_spmd_context(parallel_dims=self.parallel_dims)
        self.fwd_bwd_fn = self._forward_backward_then_sum
        self._passes = 0
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

    def _forward_backward_then_sum(self, inputs: torch.Tensor, labels: torch.Tensor,
                                   global_valid_tokens: torch.Tensor,
                                   extra_kwargs: dict[str, Any]) -> torch.Tensor:
        """TorchTitan's forward-backward of one microbatch; after the step's last one, the
        ranks' gradients summed (what TorchTitan's FSDP reduce-scatter computes: it does not
        divide them by the DP degree, the loss is already divided by the global count of
        trained tokens)."""
        loss: torch.Tensor = self._forward_backward_body(inputs, labels, global_valid_tokens,
                                                         extra_kwargs)
        self._passes += 1
        if self._passes % self.gradient_accumulation_steps == 0 and self.dp_world_size > 1:
            for p in self.model_parts[0].parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
        return loss

    def train(self, preempt_after: int | None = None) -> None:
        """``Trainer.train``'s loop to ``training.steps``, or stop after step
        ``preempt_after`` as a preempted job would (the LR schedule still spans
        ``training.steps``)."""
        config = self.config
        self.checkpointer.load(step=config.checkpoint.load_step)
        os.makedirs(config.dump_folder, exist_ok=True)
        data = iter(self.dataloader)
        while self.step < config.training.steps and self.step != preempt_after:
            self.step += 1
            self.train_step(data)
            if self.dp_rank == 0:
                log = self.metrics_processor
                with open(os.path.join(config.dump_folder, "loss.jsonl"), "a",
                          encoding="utf-8") as f:
                    f.write(json.dumps({"step": self.step, "loss": log.loss,
                                        "grad_norm": log.grad_norm}) + "\n")
            self.checkpointer.save(self.step, last_step=self.step == config.training.steps)

    def close(self) -> None:
        self.checkpointer.close()
        self.dataloader.close()


def main(argv: list[str] | None = None) -> int:
    """``--module datalane.demos.torchtitan_rank --config llama3_debugmodel_datalane`` plus
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
