"""Where the engine implements what the spec declares (formats, packers).

A declaration in :mod:`datalane.spec.formats` or :mod:`datalane.spec.packing` names its
implementation as ``module:attribute`` (the spec never imports the engine; the engine loads
it: :func:`datalane.engine.seams.load_declared`), by default a module of the engine's
package for that seam named after the declared name.
"""

from __future__ import annotations

__all__ = ["engine_path"]


def engine_path(implementation: str, default: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``implementation`` (``module:attribute``), or of
    ``default`` when it is empty."""
    module, _, attribute = (implementation or default).partition(":")
    return module, attribute
