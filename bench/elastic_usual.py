"""The ordinary loader of the elastic experiment: packed sequences, ``DistributedSampler``.

"The usual way" a data-parallel trainer feeds a language model, as baseline (c) of
bench/elastic_training.py:

* :func:`pack_corpus` tokenizes every document of the corpus once (file order, EOS after each
  document), concatenates the ids and cuts them into rows of ``seq_len + 1`` tokens, dropping
  the tail; the rows are saved as one ``.npy`` file.
* :class:`PackedSequences` is the map-style dataset over those rows.
* :class:`UsualStream` is one rank's ``DataLoader`` over a ``DistributedSampler(shuffle=True,
  seed=...)``. Its checkpoint is what such trainers save: the epoch and the number of
  microbatches this rank has consumed in it. Resuming calls ``set_epoch`` and skips that many
  microbatches, per rank - right when the world size is unchanged, not when it changed.

Called by bench/elastic_training.py (packing, in the driver) and bench/elastic_rank.py.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from datalane.corpus import DemoCorpus

__all__ = ["PackedSequences", "UsualStream", "pack_corpus"]


def _texts(corpus: DemoCorpus) -> list[str]:
    import pyarrow.parquet as pq

    texts: list[str] = []
    for path in sorted(glob.glob(corpus.web)):
        texts.extend(pq.read_table(path, columns=["text"]).column("text").to_pylist())
    for path in sorted(glob.glob(corpus.code)):
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f if line.strip())
    return texts


def pack_corpus(corpus: DemoCorpus, seq_len: int, out: str) -> int:
    """Tokenize, concatenate and cut the corpus into rows of ``seq_len + 1`` tokens, saved to
    ``out`` (int32 ``.npy``); returns the number of rows."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(corpus.tokenizer)
    eos = tok.token_to_id("<|eos|>")
    if eos is None:
        raise SystemExit(f"{corpus.tokenizer} has no <|eos|> token; the usual packing needs one")
    ids: list[int] = []
    for enc in tok.encode_batch(_texts(corpus), add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    width = seq_len + 1
    rows = np.asarray(ids[:len(ids) // width * width], dtype=np.int32).reshape(-1, width)
    np.save(out, rows)
    return int(rows.shape[0])


class PackedSequences(Dataset[torch.Tensor]):
    """Row ``i`` of the packed token file, as int64 ``(seq_len + 1,)``."""

    def __init__(self, path: str) -> None:
        self.rows = np.load(path, mmap_mode="r")

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(np.array(self.rows[i], dtype=np.int64))


class UsualStream:
    """Microbatches of rank ``rank`` of ``world``; ``state_dict`` makes it a DCP ``Stateful``."""

    def __init__(self, path: str, rank: int, world: int, microbatch: int, seed: int) -> None:
        self.dataset = PackedSequences(path)
        self.sampler: DistributedSampler[int] = DistributedSampler(
            self.dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
        self.loader = DataLoader(self.dataset, batch_size=microbatch, sampler=self.sampler,
                                 drop_last=True)
        self.epoch = 0
        self.batches = 0  # microbatches of `epoch` this rank has consumed
        self._it: Iterator[torch.Tensor] | None = None

    def _stream(self) -> Iterator[torch.Tensor]:
        while True:
            self.sampler.set_epoch(self.epoch)
            for mb in islice(self.loader, self.batches, None):  # skip what was consumed
                self.batches += 1
                yield mb
            self.epoch, self.batches = self.epoch + 1, 0

    def next_microbatch(self) -> torch.Tensor:
        """The next ``(microbatch, seq_len + 1)`` int64 rows."""
        if self._it is None:
            self._it = self._stream()
        return next(self._it)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self._it = None
