"""The packing algorithms a recipe may name: the one declaration of each packer.

A recipe's ``packing.algorithm`` accepts exactly the names of :data:`DECLARED` (the operator
validates recipes without the engine), its reference text is derived from their summaries,
and the engine's registry (:mod:`datalane.engine.packers`) loads each declared implementation
by its path. A new packer is its module plus one :class:`PackerSpec` line here (and its
options, if any, as fields of :class:`~datalane.spec.recipe.Packing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from datalane.spec.seams import engine_path

__all__ = ["DECLARED", "PACKER_NAMES", "WHOLE_PACKERS", "PackerName", "PackerSpec",
           "packing_reference"]


@dataclass(frozen=True)
class PackerSpec:
    """One packer, as the recipe and the engine know it."""

    name: str  # what ``packing.algorithm`` names (and the engine's registry key)
    summary: str  # what it does, for the recipe reference
    #: a document of at most a sequence's tokens always lands whole in one sequence (what a
    #: kind whose documents may not be split, vision, needs)
    whole: bool = False
    #: ``module:attribute`` of the engine's class ("": ``datalane.engine.packers.<name>``,
    #: attribute ``PACKER``)
    implementation: str = ""

    @property
    def engine_path(self) -> tuple[str, str]:
        return engine_path(self.implementation, f"datalane.engine.packers.{self.name}:PACKER")


#: Every packer, in the order the recipe reference lists them (the first is the default).
DECLARED: tuple[PackerSpec, ...] = (
    PackerSpec("wrap", "concatenate documents and cut"),
    PackerSpec("bestfit", "documents never cross sequences (longer ones are split), placed by "
                          "best fit into a bounded set of open sequences", whole=True),
)
PACKER_NAMES = tuple(p.name for p in DECLARED)
#: Packers that never split a document that fits a sequence.
WHOLE_PACKERS = tuple(p.name for p in DECLARED if p.whole)

if TYPE_CHECKING:
    PackerName = str
else:  # the recipe model reads the choices of a Literal (its schema and its errors)
    PackerName = Literal[PACKER_NAMES]


def packing_reference() -> str:
    """The recipe reference's text on ``packing.algorithm``."""
    return "; ".join(f"`{p.name}`: {p.summary}" for p in DECLARED) + "."
