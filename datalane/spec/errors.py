"""The error taxonomy every datalane component raises.

Callers catch by meaning, not by origin:

* :class:`ConfigError` - a recipe, knob or request is wrong; fixing the input fixes it.
* :class:`DataError` - a source record or file cannot be used (names the file and offset).
* :class:`StorageError` - reading or writing an object failed; ``transient`` says whether a
  retry may help. The original exception is chained as ``__cause__``.
* :class:`MismatchError` - persisted state belongs to another recipe, version or lane split.
"""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "DatalaneError", "MismatchError", "StorageError"]


class DatalaneError(Exception):
    """Base class of every error datalane raises on purpose."""


class ConfigError(DatalaneError, ValueError):
    """An input (recipe field, knob, CLI flag, request) has a value that cannot work."""


class DataError(DatalaneError):
    """A source record or file cannot be read under the recipe's ``bad_records`` policy."""


class StorageError(DatalaneError, OSError):
    """An object could not be read or written. ``transient`` marks errors worth retrying."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class MismatchError(DatalaneError):
    """Persisted state does not belong to this recipe, schema version or lane split."""
