"""Recipe fingerprints (DESIGN section 1).

The fingerprint document holds the canonical recipe, the identity of every source file and the
tokenizer's content hash; the fingerprint is SHA-256 of its canonical JSON. Persisted states
carry both, so a mismatch can be explained field by field (:func:`explain_mismatch`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from datalane.spec.errors import MismatchError

__all__ = ["check_fingerprint", "diff_documents", "fingerprint_of"]


def fingerprint_of(document: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of a fingerprint document."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value


def diff_documents(saved: dict[str, Any], current: dict[str, Any], limit: int = 12) -> list[str]:
    """Human lines naming each field that differs between two fingerprint documents."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(saved, "", a)
    _flatten(current, "", b)
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            lines.append(f"  {key}: saved {a.get(key, '<absent>')!r}, "
                         f"now {b.get(key, '<absent>')!r}")
    if len(lines) > limit:
        lines = [*lines[:limit], f"  ... and {len(lines) - limit} more"]
    return lines


def check_fingerprint(saved_fp: str, saved_doc: dict[str, Any] | None, current_fp: str,
                      current_doc: dict[str, Any], what: str) -> None:
    """Raise :class:`MismatchError` naming the differing fields unless the fingerprints match."""
    if saved_fp == current_fp:
        return
    detail = diff_documents(saved_doc, current_doc) if saved_doc else []
    if not detail:
        detail = ["  (the saved state carries no fingerprint document to compare)"]
    raise MismatchError(
        f"{what} was saved with recipe fingerprint {saved_fp[:16]}..., but this recipe has "
        f"{current_fp[:16]}...; these fields differ:\n" + "\n".join(detail))
