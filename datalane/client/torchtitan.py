"""TorchTitan adapter: datalane as a TorchTitan dataloader, resharding through its checkpointer.

TorchTitan (0.3.0) builds every component from its ``Trainer.Config`` tree; the dataloader is
``config.dataloader``, a ``BaseDataLoader.Config`` whose ``build()`` the Trainer calls with
``dp_world_size``, ``dp_rank`` (its "batch" mesh), ``tokenizer``, ``seq_len``,
``local_batch_size`` and ``snapshot_every_n_steps``. So datalane plugs in with no fork and no
patch: put :class:`DataLaneDataLoader.Config` there (in a config-registry function, or
``--dataloader.recipe`` on the command line)::

    config = llama3_debugmodel()
    config.dataloader = DataLaneDataLoader.Config(recipe="recipe.yaml")   # in-process
    config.dataloader = DataLaneDataLoader.Config()        # the pod's sidecar, $DATALANE_SOCKET

Each item is TorchTitan's ``({"input": input_ids, "positions": positions}, labels)``, one
microbatch of ``local_batch_size`` sequences of the data-parallel rank's lanes. Labels are
``-100`` where the target is padding or, for a recipe with a ``loss_mask`` (chat), where the
target token is not trained on (the adapter's labels; the mask itself is not passed: every
key of the input dict reaches ``model.forward``); padding tokens get position 0 (TorchTitan's
RoPE indexes its cache with the positions, and block-causal masks see each padding token as a
document of its own). The state is :class:`~datalane.client.torch.DataLaneDataset`'s: one
entry per lane plus a ``recipe`` entry, which TorchTitan's ``CheckpointManager`` saves with
``torch.distributed.checkpoint`` under ``dataloader.*``, so a checkpoint saved at DP degree W
resumes at any DP degree W' from 1 to the lane count.

**Uneven DP degrees** (W that does not divide the lanes L: 3 ranks over 8 lanes own 2, 3 and 3
lanes). TorchTitan's trainer has one ``local_batch_size`` and one gradient-accumulation count
for every rank, and an optimizer step that every rank takes together, so a rank cannot read a
smaller local batch. The scheme (:func:`datalane.spec.lanes.rank_shape`): every rank yields
the same ``ceil(L/W) * (B/L) / local_batch_size`` microbatches per datalane step, a rank with
fewer lanes ending its step with microbatches whose labels are all ``-100``; and
``training.global_batch_size`` is the padded global batch ``W * ceil(L/W) * B/L`` sequences
(:func:`titan_global_batch_size`; ``B`` itself when W divides L), so that TorchTitan's
accumulation count is that number of microbatches and one TorchTitan step is one datalane step.
The loss needs nothing more: TorchTitan's ``train_step`` divides each microbatch's summed loss
by ``global_valid_tokens``, the labels that are not ``-100`` summed over the step's
microbatches and the "batch" mesh, which is the step's ``step_tokens`` summed over the DP ranks
(the adapter's global trained-token count: padded microbatches add 0 to it and 0 to the loss);
its FSDP sums the gradients (``disable_fsdp_gradient_division``), so the gradient is the one of
any other DP degree up to float-reduction order. A checkpoint saved in the middle of a datalane
step means TorchTitan's steps are not datalane's (a wrong ``global_batch_size``):
:meth:`DataLaneDataLoader.state_dict` refuses it, naming the value to set.

**Vision recipes.** When the recipe's schema has per-image columns (a ``vision`` source), each
item is TorchTitan's multimodal ``(input_dict, labels)`` instead, as its ``MMDataLoader`` and
``MultiModalCollator`` yield it (:func:`datalane.client.torchvlm.to_vlm`; ``DataLaneDataset``'s
VLM mode, with the special-token ids from the recipe's tokenizer by the names of its
``vision`` settings and its ``PatchRule``, from the vision contract of the sample schema). This
is automatic, not a flag: TorchTitan's trainer reads the one batch form its model takes, and
the text form would drop the images without a word. In-process and through a sidecar alike:
the sidecar announces the contract at Open; one that predates it is refused naming what is
missing.

Callers: TorchTitan's ``Trainer`` (through its config), :mod:`datalane.demos.torchtitan_rank`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torchtitan.components.dataloader import BaseDataLoader

from datalane.client.batch import Batch
from datalane.client.inprocess import InProcessLoader
from datalane.client.torch import DataLaneDataset
from datalane.spec import imagecolumns
from datalane.spec.errors import ConfigError
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import rank_shape
from datalane.spec.recipe import load_recipe
from datalane.spec.schema import SampleSchema

if TYPE_CHECKING:
    from datalane.client.sidecar import SidecarLoader

__all__ = ["DataLaneDataLoader", "titan_global_batch_size", "to_titan"]

TitanBatch = tuple[dict[str, Any], torch.Tensor]


def _check_seq_len(ids: torch.Tensor, seq_len: int) -> None:
    if ids.shape[1] != seq_len:
        raise ConfigError(f"the recipe's sequences have {ids.shape[1]} tokens but TorchTitan's "
                          f"training.seq_len is {seq_len}; set --training.seq_len "
                          f"{ids.shape[1]}")


def to_titan(item: dict[str, torch.Tensor], seq_len: int) -> TitanBatch:
    """One :class:`DataLaneDataset` item as TorchTitan's ``(input_dict, labels)``."""
    ids = item["input_ids"]
    _check_seq_len(ids, seq_len)
    return {"input": ids, "positions": item["positions"].clamp(min=0)}, item["labels"]


def titan_global_batch_size(lanes: int, global_batch_size: int, dp_world_size: int,
                            local_batch_size: int) -> int:
    """TorchTitan's ``training.global_batch_size`` for a recipe of ``lanes`` lanes and global
    batch ``global_batch_size`` on ``dp_world_size`` DP ranks reading microbatches of
    ``local_batch_size`` sequences: the padded global batch ``W * ceil(L/W) * B/L``, so that
    TorchTitan accumulates exactly one datalane step per optimizer step (``B`` when W divides
    L; 8 lanes, B=16 on 3 ranks: 18). ConfigError, naming the sizes that can, when
    ``local_batch_size`` cannot serve ``dp_world_size``."""
    shape = rank_shape(lanes, global_batch_size, dp_world_size, 0, local_batch_size)
    return dp_world_size * shape.total * local_batch_size


class _Tap:
    """The loader as :class:`DataLaneDataset` sees it; hands each step's lane digests (on the
    last microbatch of the step) to ``on_step`` on the way through."""

    def __init__(self, loader: InProcessLoader | SidecarLoader,
                 on_step: Callable[[int, dict[int, bytes]], None]) -> None:
        self.loader = loader
        self.on_step = on_step
        self.last: Batch | None = None  # the latest microbatch handed out

    @property
    def lanes(self) -> range:
        return self.loader.lanes

    @property
    def lanes_total(self) -> int:
        return self.loader.lanes_total

    @property
    def schema(self) -> SampleSchema:
        return self.loader.schema

    @property
    def socket(self) -> str | None:
        """The sidecar's socket (errors name it); None in-process."""
        return getattr(self.loader, "socket", None)

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.loader:
            self.last = batch
            if batch.lane_digests:  # the step's last microbatch (padded ones included)
                self.on_step(batch.step, batch.lane_digests)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


class DataLaneDataLoader(BaseDataLoader):  # type: ignore[misc]
    """A TorchTitan dataloader over the lanes of one data-parallel rank."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):  # type: ignore[misc]
        recipe: str = ""
        """Recipe file (YAML or JSON): compute this rank's lanes in the trainer process.
        Empty: read them from the pod's sidecar."""

        socket: str = ""
        """Sidecar Unix socket when ``recipe`` is empty; default ``$DATALANE_SOCKET``."""

        workers: int = 2
        """In-process mode: threads for the map stages (decode, filter, tokenize)."""

        map_processes: int = 0
        """In-process mode: child processes for the map stages instead of ``workers`` threads,
        each with its own interpreter lock, so the map work does not take the trainer's
        (0: threads; docs/architecture.md, Map processes)."""

        digest_log: str = ""
        """A folder: each data-parallel rank appends one JSON line per step to
        ``dp<rank>.jsonl`` with the SHA-256 of each of its lane windows (their
        ``global_hash`` in lane order is the step's global batch hash). Empty: no log."""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, seq_len: int,
                 local_batch_size: int, tokenizer: Any = None,
                 snapshot_every_n_steps: int | None = None, **kwargs: Any) -> None:
        # the tokenizer is the recipe's (datalane tokenizes); snapshots are not needed: the
        # state is exact at every microbatch and a few hundred bytes per lane
        del tokenizer, snapshot_every_n_steps, kwargs
        if config.dataset or config.dataset_path:
            raise ConfigError(f"DataLaneDataLoader reads its recipe, not a TorchTitan dataset "
                              f"(dataset={config.dataset!r}, dataset_path="
                              f"{config.dataset_path!r}); remove them and set "
                              f"--dataloader.recipe or the sidecar socket")
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.seq_len = seq_len
        self.digest_log = config.digest_log
        self.last_step: tuple[int, dict[int, bytes]] | None = None
        """The latest step whose last microbatch was handed out, with its lane digests."""
        self.local_batch_size = local_batch_size
        self.loader = _open_loader(config, dp_rank, dp_world_size, local_batch_size)
        self._tap = _Tap(self.loader, self._on_step)
        try:  # the schema may be refused (a sidecar's malformed announcement), and VLM mode
            # refuses a sidecar that announces images but no vision contract
            self.vlm = any(name in imagecolumns.NAMES for name in self.loader.schema.names)
            """Items are TorchTitan's multimodal batch (a vision recipe; the module docstring)."""
            self.dataset = DataLaneDataset(self._tap, vlm=self.vlm)
        except Exception:
            self.loader.close()
            raise

    def __iter__(self) -> Iterator[TitanBatch]:
        for item in self.dataset:
            if self.vlm:
                _check_seq_len(item[0]["input"], self.seq_len)
                yield item
            else:
                yield to_titan(item, self.seq_len)

    def _on_step(self, step: int, digests: dict[int, bytes]) -> None:
        self.last_step = (step, digests)
        if self.digest_log:
            os.makedirs(self.digest_log, exist_ok=True)
            line = {"step": step, "dp_rank": self.dp_rank, "dp_world_size": self.dp_world_size,
                    "lanes": {str(lane): d.hex() for lane, d in sorted(digests.items())}}
            path = os.path.join(self.digest_log, f"dp{self.dp_rank}.jsonl")
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

    def state_dict(self) -> dict[str, Any]:
        """One entry per lane of this rank plus the ``recipe`` entry (DataLaneDataset's).

        TorchTitan saves after an optimizer step, so the state must stand at the end of a
        datalane step; in the middle of one, TorchTitan's steps are not datalane's (its
        ``training.global_batch_size`` is not :func:`titan_global_batch_size`) and the
        checkpoint is refused with the value to set."""
        last = self._tap.last
        if last is not None and not last.lane_digests:
            per_step = self.loader.per_step
            raise ConfigError(
                f"TorchTitan saves a checkpoint after microbatch {last.index + 1} of the "
                f"{per_step} of datalane step {last.step} (DP rank {self.dp_rank} of "
                f"{self.dp_world_size}): its optimizer steps are not datalane's steps, so "
                f"neither its global batches nor its loss normalization are. Set "
                f"--training.global_batch_size "
                f"{self.dp_world_size * per_step * self.local_batch_size} "
                f"(DP degree x {per_step} microbatches x local_batch_size "
                f"{self.local_batch_size}; titan_global_batch_size)")
        return self.dataset.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state_dict)

    def close(self) -> None:
        self.loader.close()


def _open_loader(config: DataLaneDataLoader.Config, rank: int, world_size: int,
                 microbatch_size: int) -> InProcessLoader | SidecarLoader:
    if config.recipe and config.socket:
        raise ConfigError(f"set one of dataloader.recipe ({config.recipe!r}, in-process) and "
                          f"dataloader.socket ({config.socket!r}, the sidecar), not both")
    if config.recipe:
        return InProcessLoader(load_recipe(config.recipe), rank, world_size, microbatch_size,
                               Knobs(workers=config.workers,
                                     map_processes=config.map_processes))
    if not (config.socket or os.environ.get("DATALANE_SOCKET")):
        raise ConfigError("DataLaneDataLoader has no data source: set --dataloader.recipe "
                          "(compute the lanes in-process) or --dataloader.socket / "
                          "$DATALANE_SOCKET (read them from the pod's sidecar)")
    from datalane.client.sidecar import SidecarLoader

    return SidecarLoader(config.socket or None, rank=rank, world_size=world_size,
                         microbatch_size=microbatch_size)
