"""Reading persisted JSON safely, and sealing it with a SHA-256 of its own content.

Every state datalane persists outside the checkpoint store (``datalane run --state-out``
files, the checkpoint inside a client's ``state_dict()``, the sidecar's SIGTERM resume files)
is a JSON document. Two things make such a file safe to use:

* :func:`parse_json` / :func:`read_json_file` turn any damaged input into one error that
  names the file and what is wrong: not UTF-8 (with the byte offset), not JSON, nested deeper
  than :data:`MAX_DEPTH` (the parser's recursion would otherwise crash with a traceback).
* :func:`seal` adds a ``sha256`` field, the SHA-256 of the canonical JSON (sorted keys, no
  whitespace) of the other fields, and :func:`check_seal` verifies it, so a single flipped
  bit is refused instead of silently changing the stream.

Callers: :mod:`datalane.spec.state` (checkpoints), :mod:`datalane.spec.recipe` (recipe
files); the sidecar's resume files and the client's state entries seal with the same
functions. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from datalane.spec.errors import ConfigError, DatalaneError, MismatchError

__all__ = [
    "MAX_DEPTH",
    "SEAL_KEY",
    "canonical_json",
    "check_depth",
    "check_seal",
    "content_sha256",
    "parse_json",
    "parse_text",
    "read_bytes",
    "read_json_file",
    "seal",
]

SEAL_KEY = "sha256"
MAX_DEPTH = 64
"""Nesting depth no recipe or state comes near (a checkpoint is 7 levels deep)."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace: the text a seal is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def content_sha256(doc: Mapping[str, Any], exclude: Iterable[str] = ()) -> str:
    """SHA-256 (hex) of the canonical JSON of ``doc`` without ``sha256`` and ``exclude``."""
    skip = {SEAL_KEY, *exclude}
    body = {k: v for k, v in doc.items() if k not in skip}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def seal(doc: Mapping[str, Any], exclude: Iterable[str] = ()) -> dict[str, Any]:
    """``doc`` plus its ``sha256`` (over every field but ``exclude``), as the last key."""
    out = {k: v for k, v in doc.items() if k != SEAL_KEY}
    out[SEAL_KEY] = content_sha256(out, exclude)
    return out


def check_seal(doc: Mapping[str, Any], where: str, exclude: Iterable[str] = (), *,
               required: bool = False) -> bool:
    """Verify the ``sha256`` of ``doc``; True if it carries one, False if not (``required``:
    absent is an error too). Raises :class:`MismatchError` naming ``where`` on a mismatch."""
    if SEAL_KEY not in doc:
        if required:
            raise MismatchError(f"{where} carries no sha256 of its content; it was not written "
                                f"by datalane, or was cut")
        return False
    claimed = doc[SEAL_KEY]
    actual = content_sha256(doc, exclude)
    if claimed != actual:
        shown = f"{claimed[:16]}..." if isinstance(claimed, str) else repr(claimed)
        raise MismatchError(f"{where} fails its integrity check: it carries sha256 {shown}, but "
                            f"its content hashes to {actual[:16]}...; it was altered or "
                            f"damaged after it was written and will not be used")
    return True


def check_depth(value: Any, where: str, error: type[DatalaneError] = ConfigError,
                limit: int = MAX_DEPTH) -> None:
    """Refuse lists and mappings nested deeper than ``limit`` (checked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[Any] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            raise error(f"{where} is nested deeper than {limit} levels; no datalane file is")
        stack.extend((child, depth + 1) for child in children)


def parse_text(data: bytes, where: str, error: type[DatalaneError] = ConfigError) -> str:
    """``data`` decoded as UTF-8; ``error`` naming ``where`` and the first bad byte if not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset "
                    f"{e.start}") from None


def parse_json(data: bytes | str, where: str, error: type[DatalaneError] = ConfigError,
               **options: Any) -> Any:
    """Parse JSON text; every kind of damage is one ``error`` naming ``where``."""
    text = parse_text(data, where, error) if isinstance(data, bytes) else data
    try:
        value = json.loads(text, **options)
    except DatalaneError:  # an object hook's own error
        raise
    except ValueError as e:  # JSONDecodeError, or an integer of more than 4,300 digits
        raise error(f"{where} is not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{where} is nested deeper than {MAX_DEPTH} levels; no datalane file "
                    f"is") from None
    check_depth(value, where, error)
    return value


def read_bytes(path: str, what: str) -> bytes:
    """The bytes of a local file; ConfigError naming it if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from e


def read_json_file(path: str, what: str, error: type[DatalaneError] = ConfigError) -> Any:
    """Parse the JSON file at ``path`` (``what`` names it in errors: "state file")."""
    return parse_json(read_bytes(path, what), f"{what} {path}", error)
