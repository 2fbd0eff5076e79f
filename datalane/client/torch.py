"""torch adapter: microbatches as tensors, checkpointable with torch.distributed.checkpoint.

``DataLaneDataset(loader)`` wraps a :class:`~datalane.client.SidecarLoader` or an
:class:`~datalane.client.InProcessLoader` as an ``IterableDataset`` yielding dicts of tensors,
one per column of the recipe's sample schema plus ``labels`` and ``cu_seqlens``:

* ``input_ids``  int64 (mb, seq_len): tokens ``0..seq_len-1`` of each sequence
* ``labels``     int64 (mb, seq_len): tokens ``1..seq_len``, ``-100`` where the target is padding
  or, when the schema has a ``loss_mask``, where the target token's mask is 0
* ``positions``  int64 (mb, seq_len): 0 at every document start, -1 on padding
* ``loss_mask``  uint8 (mb, seq_len), chat recipes: the mask of the *target* tokens
  ``1..seq_len``, aligned with ``labels`` (``loss_mask[:, j]`` says whether ``labels[:, j]`` is
  trained on; ``labels`` already carries it as -100)
* every other per-token column (mb, seq_len) at the input tokens ``0..seq_len-1``, a
  per-sequence column (mb,) and a per-image column (vision recipes: ``image_patches``,
  ``image_grid_thw``, ... of the microbatch's images; :mod:`datalane.spec.imagecolumns`) as
  it is; int32 columns become int64, other dtypes stay
* ``cu_seqlens`` int32 (segments + 1,): document boundaries over the flattened microbatch, for
  variable-length attention kernels (each padding run is a segment of its own)
* ``step_tokens`` int64 scalar: the rank's trained targets (labels that are not -100) in the
  whole step this microbatch belongs to (the same on every microbatch of the step)
* ``global_tokens`` int64 scalar, with ``DataLaneDataset(loader, global_tokens=True)``:
  ``step_tokens`` summed over the data-parallel group (one all-reduce per step when
  ``torch.distributed`` is initialized; else the local count; opt-in, because a collective in
  the data iterator hangs a job whose ranks do not all iterate), the divisor of a loss
  normalized over the global batch:
  ``loss = sum(token losses) / global_tokens * dp_world_size`` under DDP's (or FSDP's)
  gradient averaging gives the same gradient at every world size, including world sizes that
  do not divide the lanes (whose ranks own unequal lane counts and end their steps with fully
  padded microbatches)

It implements ``state_dict()`` / ``load_state_dict()`` as a ``Stateful`` with one small JSON
entry per lane the rank owns (:mod:`datalane.client.lanekeys`), so a checkpoint that
``torch.distributed.checkpoint`` saved on W ranks loads on any W' ranks: each rank asks for the
lanes it owns now, and continues at exactly the next microbatch.

Over a loader of an eval stream (``SidecarLoader(..., stream="eval")``, or the in-process
one), every ``iter()`` of the dataset is one evaluation: the stream's ``steps`` steps from step
0, then the iterator ends, so ``for item in dataset:`` every N training steps evaluates on the
same batches each time. Such a dataset has no ``state_dict`` (the loader refuses it): keep it
out of the checkpoint.

**VLM mode** (``DataLaneDataset(loader, vlm=True)``, a vision recipe): each item is instead
TorchTitan's multimodal ``(input_dict, labels)`` of :func:`datalane.client.torchvlm.to_vlm`
(``input``, ``positions``, ``pixel_values``, ``grid_thw``, ``special_tokens``,
``mrope_positions``, ...), the special-token ids and the ``PatchRule`` read from the vision
contract of the loader's sample schema (:func:`~datalane.client.torchvlm.vlm_settings`: the
recipe's tokenizer ids for the names of its ``vision`` settings and the patch rule of those
settings; an in-process loader has its recipe's, a sidecar loader the one its sidecar
announces at Open, so both yield the same items; a sidecar that predates the contract is
refused naming what is missing). Opt-in, because it changes
what an item is: the default dict above carries a vision recipe's per-image columns as they
are, for trainers that build their own batch.
:class:`datalane.client.torchtitan.DataLaneDataLoader` turns it on by itself for a vision
recipe (TorchTitan's batch is the only form its trainer reads).

Use it with ``DataLoader(dataset, batch_size=None, num_workers=0)`` (or iterate it directly):
every item already is a whole microbatch, and the loader runs ahead on threads of its own (or
in the sidecar). A ``batch_size`` or DataLoader worker processes would stack or duplicate
microbatches, so both are refused at the first item with what to do instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch.utils.data import IterableDataset

from datalane.client import lanekeys
from datalane.client.batch import Batch
from datalane.spec import imagecolumns
from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.targets import IGNORE_INDEX, trained_targets

if TYPE_CHECKING:
    from datalane.client.torchvlm import VlmSettings
    from datalane.spec.schema import SampleSchema
    from datalane.spec.visioncontract import VisionContract

__all__ = ["DataLaneDataset", "cu_seqlens", "to_tensors"]

class _Loader(Protocol):
    @property
    def lanes(self) -> range: ...
    @property
    def lanes_total(self) -> int: ...
    @property
    def schema(self) -> SampleSchema: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def cu_seqlens(positions: np.ndarray) -> np.ndarray:
    """Segment boundaries of a (rows, cols) positions array, flattened row-major."""
    flat = positions.reshape(-1)
    n = flat.size
    start = np.zeros(n, dtype=bool)
    start[0] = True
    start[1:] = (flat[1:] == 0) | ((flat[1:] < 0) & (flat[:-1] >= 0))
    cols = positions.shape[1]
    start[::cols] = True  # every sequence starts a segment
    return np.append(np.flatnonzero(start), n).astype(np.int32)


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor owning a copy (the batch's arrays may be read-only views of the ring)."""
    return torch.from_numpy(np.array(a, dtype=np.int64 if a.dtype == np.int32 else a.dtype,
                                     order="C"))


def to_tensors(batch: Batch) -> dict[str, torch.Tensor]:
    """One microbatch as the tensors of the module docstring (``input_ids``, ``labels``,
    ``positions``, the schema's other columns, ``cu_seqlens``)."""
    columns = batch.columns
    ids, positions = columns["input_ids"], columns["positions"]
    # the target is padding or (with a loss_mask) not trained on: the same definition as the
    # microbatch's step_tokens
    ignore = ~trained_targets(columns)
    labels = _tensor(ids[:, 1:])
    labels[torch.from_numpy(ignore)] = IGNORE_INDEX
    pos = np.ascontiguousarray(positions[:, :-1])
    out = {"input_ids": _tensor(ids[:, :-1]), "labels": labels, "positions": _tensor(pos)}
    for name, a in columns.items():
        if name in out:
            continue
        if a.ndim == 1 or name in imagecolumns.NAMES:  # per sequence, per image
            out[name] = _tensor(a)
        else:  # the loss mask describes targets (labels); any other column, inputs
            out[name] = _tensor(a[:, 1:] if name == "loss_mask" else a[:, :-1])
    out["cu_seqlens"] = torch.from_numpy(cu_seqlens(pos))
    out["step_tokens"] = torch.tensor(batch.step_tokens, dtype=torch.int64)
    return out


def _vlm_settings(loader: _Loader, vlm: bool | VlmSettings
                  ) -> tuple[VlmSettings, VisionContract | None]:
    """VLM mode's settings: given, or (``vlm=True``) read from the vision contract of the
    loader's sample schema (the recipe's in-process, the one the sidecar announces); with the
    contract they were read from (None: given)."""
    from datalane.client.torchvlm import vlm_settings

    if vlm is not True:
        return vlm, None  # type: ignore[return-value]
    schema = getattr(loader, "schema", None)
    if schema is None:
        raise ConfigError(f"DataLaneDataset(vlm=True) over a {type(loader).__name__} that has "
                          f"no sample schema: pass vlm=vlm_settings(Plan.build(recipe)) "
                          f"(datalane.client.torchvlm) instead")
    socket = getattr(loader, "socket", None)
    where = (f"the sample schema the sidecar at {socket} announces" if socket else
             f"the sample schema of {type(loader).__name__}")
    settings = vlm_settings(schema, where)
    if settings is None:
        raise ConfigError(f"DataLaneDataset(vlm=True): the recipe's sample schema has no "
                          f"per-image columns (its columns {list(schema.names)}: no source has "
                          f"`vision` settings), so there are no images for TorchTitan's "
                          f"multimodal batch")
    return settings, schema.vision


def _where(loader: _Loader) -> str:
    socket = getattr(loader, "socket", None)
    return f"the sidecar at {socket}" if socket else f"the {type(loader).__name__}"


def _check_contract(loader: _Loader, read: VisionContract) -> None:
    """The contract VLM mode read before the first microbatch (from a sidecar: its Health) is
    the one the microbatches come with (the reply to Open): a sidecar restarted with another
    recipe in between would otherwise be served with the first one's tokens and normalisation.
    After the first Open the session's fingerprint holds the recipe."""
    now = loader.schema.vision
    if now == read:
        return
    first = read.to_dict()
    after = now.to_dict() if now is not None else dict.fromkeys(first)
    differ = [f"{k} {first[k]!r} then {after[k]!r}" for k in first if first[k] != after[k]]
    raise MismatchError(f"the vision contract {_where(loader)} announces with the first "
                        f"microbatch is not the one DataLaneDataset was built with "
                        f"({', '.join(differ)}): restarted with another recipe in between? "
                        f"Build the dataset again")


def _check_consumer(frame: Any) -> None:
    """Refuse the two DataLoader settings that would silently change what the trainer sees."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        raise ConfigError(
            f"DataLaneDataset is read in DataLoader worker {info.id} of {info.num_workers}: "
            f"every worker would yield the whole stream (each microbatch {info.num_workers} "
            f"times). Use DataLoader(dataset, batch_size=None, num_workers=0): datalane "
            f"already prepares data ahead on its own threads (or in the sidecar)")
    # the DataLoader's fetcher (the frame that asks for the first item) says whether it
    # collates several items into one batch
    if getattr(frame.f_locals.get("self"), "auto_collation", False):
        index = frame.f_locals.get("possibly_batched_index")
        size = len(index) if hasattr(index, "__len__") else "N"
        raise ConfigError(
            f"DataLaneDataset yields whole microbatches; a DataLoader with batch_size={size} "
            f"would stack {size} of them into one "
            "batch. Use DataLoader(dataset, batch_size=None) and set the loader's "
            "microbatch_size instead")


class DataLaneDataset(IterableDataset[dict[str, torch.Tensor]]):
    """An ``IterableDataset`` over a datalane loader; use it with ``batch_size=None``.

    Each ``iter()`` continues where the previous iterator stopped (the next microbatch after
    the last one handed out), so a DataLoader re-iterated every "epoch" neither repeats nor
    skips data.
    """

    def __init__(self, loader: _Loader, *, global_tokens: bool = False,
                 dp_group: Any = None, vlm: bool | VlmSettings = False) -> None:
        self.loader = loader
        self.global_tokens = global_tokens  # add item["global_tokens"] (an all-reduce a step)
        self.dp_group = dp_group  # the data-parallel process group (None: the default one)
        self._global: tuple[int, torch.Tensor] | None = None  # (step, global_tokens)
        self.vlm: VlmSettings | None = None
        """VLM mode's special tokens and patch rule (None: items are dicts of tensors)."""
        self._contract: VisionContract | None = None  # what they were read from: checked
        # again at each iterator's first microbatch (_check_contract)
        if vlm is not False:
            self.vlm, self._contract = _vlm_settings(loader, vlm)
        if self.vlm is not None and global_tokens:
            raise ConfigError("DataLaneDataset(vlm=..., global_tokens=True): a VLM item is "
                              "TorchTitan's (input_dict, labels), whose every input key "
                              "reaches the model; count the labels that are not -100 instead")

    def __iter__(self) -> Iterator[Any]:
        _check_consumer(sys._getframe(1))
        if self.vlm is not None:
            from datalane.client.torchvlm import to_vlm

            contract = self._contract
            for batch in self.loader:
                if contract is not None:
                    _check_contract(self.loader, contract)
                    contract = None
                yield to_vlm(batch.columns, self.vlm.special_tokens, self.vlm.rule)
            return
        for batch in self.loader:
            item = to_tensors(batch)
            if self.global_tokens:
                item["global_tokens"] = self._global_tokens(batch.step, item["step_tokens"])
            yield item

    def _global_tokens(self, step: int, local: torch.Tensor) -> torch.Tensor:
        """The step's trained targets over the data-parallel group: one all-reduce per step
        (every rank yields the same number of microbatches per step, so every rank calls it
        at the same microbatch)."""
        if self._global is not None and self._global[0] == step:
            return self._global[1]
        total = local.clone()
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            group = self.dp_group
            ranks = dist.get_world_size(group)
            expected = getattr(self.loader, "world_size", ranks)
            if ranks != expected:
                raise ConfigError(
                    f"the process group has {ranks} ranks but the loader's data-parallel world "
                    f"size is {expected}; pass DataLaneDataset(loader, global_tokens=True, "
                    f"dp_group=...) the "
                    f"data-parallel group (e.g. mesh['dp'].get_group())")
            device = (torch.device("cuda", torch.cuda.current_device())
                      if dist.get_backend(group) == "nccl" else torch.device("cpu"))
            on = total.to(device)
            dist.all_reduce(on, op=dist.ReduceOp.SUM, group=group)
            total = on.cpu()
        self._global = (step, total)
        return total

    def state_dict(self) -> dict[str, Any]:
        """One entry per lane this rank owns plus the recipe entry (plain strings)."""
        loader = self.loader
        return lanekeys.split(loader.state_dict(), loader.lanes, loader.lanes_total)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        loader = self.loader
        if set(state) == {"datalane"}:  # the one-key form of datalane 0.1 (one process)
            loader.load_state_dict(json.loads(state["datalane"]))
            return
        loader.load_state_dict(lanekeys.join(state, loader.lanes, loader.lanes_total))
