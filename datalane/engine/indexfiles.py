"""The index files of dataset directories (MDS ``index.json``, Hugging Face ``state.json`` and
``dataset_dict.json``), read as hostile input.

An index file is read whole only up to :data:`~datalane.spec.limits.MAX_RECORD_BYTES`, parsed
with nesting past the JSON parser's limit refused as a ConfigError (not a RecursionError), and
the files it names must lie inside the dataset directory: an absolute path, a URI or a ``..``
component is refused, so an index never makes a source read files beside the dataset.
Callers: :func:`datalane.engine.formats.mds.list_mds_directory`,
:func:`datalane.engine.formats.hf.list_hf_directory`.
"""

from __future__ import annotations

import json
from typing import Any

from datalane.spec.errors import ConfigError
from datalane.spec.limits import MAX_RECORD_BYTES

__all__ = ["inside", "read_index"]


def read_index(fs: Any, path: str, what: str) -> Any:
    """The parsed JSON of the index file ``path`` (``what`` it should be, for errors), or
    None when there is no such file."""
    try:
        with fs.open(path, "rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_RECORD_BYTES:
        raise ConfigError(f"{path} is not {what}: it holds more than {MAX_RECORD_BYTES} bytes")
    try:
        return json.loads(raw)
    except RecursionError as e:
        raise ConfigError(f"{path} is not {what}: its JSON is nested deeper than the parser's "
                          f"limit") from e
    except ValueError as e:
        raise ConfigError(f"{path} is not {what}: {type(e).__name__}: {e}") from e


def inside(name: Any, index_path: str, what: str) -> str:
    """``name``, a file an index lists as ``what``, checked to be a relative path inside the
    dataset directory (a merged MDS index's shards are in subdirectories)."""
    parts = str(name).replace("\\", "/").split("/")
    if not isinstance(name, str) or name.startswith("/") or ".." in parts or "" in parts or \
            "://" in name:
        raise ConfigError(f"{index_path}: {what} is {name!r}, which is no path inside the "
                          f"dataset directory (absolute, '..' or a URI); datalane reads only "
                          f"the dataset's own files")
    return name
