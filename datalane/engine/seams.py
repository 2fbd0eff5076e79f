"""Loading what the spec declares: the implementation a declaration names.

Callers: :mod:`datalane.engine.formats` and :mod:`datalane.engine.packers`, which build their
registries from :data:`datalane.spec.formats.DECLARED` and
:data:`datalane.spec.packing.DECLARED`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load_declared"]


def load_declared(seam: str, name: str, declared_in: str, path: tuple[str, str],
                  check: type) -> Any:
    """The object ``path`` (``(module, attribute)``) names for the ``seam`` (``format``,
    ``packer``) declared as ``name`` in ``declared_in``: an instance or subclass of ``check``
    whose ``name`` is ``name``; ImportError naming the declaration and what is wrong."""
    module, attribute = path
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{seam} {name!r} is declared in {declared_in}, but its "
                          f"implementation {module}:{attribute} cannot be loaded: {e}") from e
    ok = isinstance(found, check) or (isinstance(found, type) and issubclass(found, check))
    if not ok or found.name != name:
        raise ImportError(f"{seam} {name!r} is declared in {declared_in}, but "
                          f"{module}:{attribute} is not a {check.__name__} named {name!r}")
    return found
