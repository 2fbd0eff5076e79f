"""Trainer-side loaders: the sidecar client and the in-process mode (docs/client.md).

Both yield :class:`Batch` microbatches (numpy int32 arrays) and share one ``state_dict``
format, so a job can move between them. ``datalane.client.torch`` adapts either to a torch
``IterableDataset`` (torch is imported only there).
"""

from datalane.client.batch import Batch
from datalane.client.inprocess import InProcessLoader
from datalane.client.position import CLIENT_STATE_FORMAT, Position

__all__ = ["CLIENT_STATE_FORMAT", "Batch", "InProcessLoader", "Position", "SidecarLoader"]


def __getattr__(name: str) -> object:
    if name == "SidecarLoader":  # grpc is imported only when the sidecar client is used
        from datalane.client.sidecar import SidecarLoader

        return SidecarLoader
    raise AttributeError(f"module 'datalane.client' has no attribute {name!r}")
