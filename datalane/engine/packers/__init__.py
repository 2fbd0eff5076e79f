"""The packers, by the name a recipe's ``packing.algorithm`` gives.

Each packer is a module of its own implementing :class:`~datalane.engine.packers.base.Packer`;
this table is the one place the engine looks them up (the recipe accepts exactly its keys).
"""

from __future__ import annotations

from datalane.engine.packers.base import PackContext, Packer
from datalane.engine.packers.bestfit import BestFitPacker
from datalane.engine.packers.wrap import WrapPacker

__all__ = ["PACKERS", "PackContext", "Packer"]

PACKERS: dict[str, type[Packer]] = {
    "wrap": WrapPacker,
    "bestfit": BestFitPacker,
}
