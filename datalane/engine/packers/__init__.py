"""The packers, by the name a recipe's ``packing.algorithm`` gives: the implementations of the
packers :data:`datalane.spec.packing.DECLARED` declares.

Each packer is a module of its own implementing :class:`~datalane.engine.packers.base.Packer`
(a :class:`~datalane.engine.packers.base.PackerBase`); this registry is built from the
declarations, each class loaded from the path its declaration names
(``datalane.engine.packers.<name>:PACKER`` unless it says otherwise), so the recipe accepts
exactly its keys.
"""

from __future__ import annotations

from datalane.engine.packers.base import PackContext, Packer, PackerBase
from datalane.engine.seams import load_declared
from datalane.spec.packing import DECLARED, PackerSpec

__all__ = ["PACKERS", "PackContext", "Packer", "implementation"]


def implementation(spec: PackerSpec) -> type[Packer]:
    """The engine's class of the declared packer ``spec``; ImportError naming the declaration
    and what is missing when there is none."""
    cls: type[Packer] = load_declared("packer", spec.name, "datalane.spec.packing",
                                      spec.engine_path, PackerBase)
    return cls


PACKERS: dict[str, type[Packer]] = {spec.name: implementation(spec) for spec in DECLARED}
