"""A trainer that exits with its loader's iterator still open exits quietly.

A torch DataLoader's iterator held by the trainer outlived the modules at exit, and the
client's stream cleanup then printed ``Exception ignored in: <generator object
SidecarLoader._stream ...> AttributeError: 'NoneType' object has no attribute 'suppress'``
(and a TypeError from ``__iter__``) on every exit. A real trainer process, sidecar and socket.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # a real sidecar process exits, for each transport

_TRAINER = textwrap.dedent("""
    import sys
    from torch.utils.data import DataLoader
    from datalane.client import SidecarLoader
    from datalane.client.torch import DataLaneDataset

    class Trainer:
        def __init__(self, loader):
            self.batches = iter(DataLoader(DataLaneDataset(loader), batch_size=None))

    trainer = Trainer(SidecarLoader(sys.argv[1], rank=0, world_size=2, microbatch_size=4,
                                    transport=sys.argv[2]))
    steps = [int(next(trainer.batches)["input_ids"].shape[0]) for _ in range(3)]
    print(steps)
""")


@pytest.mark.parametrize("transport", ["shm", "inline"])
def test_an_exit_with_an_open_iterator_prints_nothing(sidecar, repeat_recipe,
                                                      transport: str) -> None:
    sc = sidecar(repeat_recipe)
    proc = subprocess.run([sys.executable, "-c", _TRAINER, sc.socket, transport],
                          capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "[4, 4, 4]\n", "")
