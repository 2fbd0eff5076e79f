"""The lane engine: sources, map stages on a shared pool, ordered stateful stages, resume
points. Depends on :mod:`datalane.spec` only (plus pyarrow, fsspec, tokenizers, numpy)."""

from datalane.engine.loader import Loader, Microbatch, Step
from datalane.engine.plan import Plan

__all__ = ["Loader", "Microbatch", "Plan", "Step"]
