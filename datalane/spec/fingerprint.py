"""Recipe fingerprints (docs/recipe.md).

The fingerprint document holds the canonical recipe, the identity of every source file and the
tokenizer's content hash; the fingerprint is SHA-256 of its canonical JSON. Persisted states
carry both, so a mismatch can be explained field by field (:func:`diff_documents`), and
file by file for the source file lists.
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


def _is_file_list(value: Any) -> bool:
    """A fingerprint document's file list: ``[[uri, size, etag or mtime], ...]``."""
    return isinstance(value, list) and all(
        isinstance(v, list) and v and isinstance(v[0], str) for v in value)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value


def _names(uris: list[str], cap: int) -> str:
    shown = ", ".join(uris[:cap])
    return shown if len(uris) <= cap else f"{shown} and {len(uris) - cap} more"


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _diff_files(key: str, saved: list[Any], current: list[Any], cap: int) -> list[str]:
    """Lines naming the files that changed, appeared or went away (``cap`` named of each)."""
    a = {str(f[0]): f[1:] for f in saved}
    b = {str(f[0]): f[1:] for f in current}
    changed = [u for u in a if u in b and a[u] != b[u]]
    lines = []
    if changed:
        first = changed[0]
        lines.append(f"  {key}: {len(changed)} of {_files(len(a))} changed: "
                     f"{_names(changed, cap)} (the first: saved {a[first]!r}, now "
                     f"{b[first]!r})")
    added = [u for u in b if u not in a]
    if added:
        lines.append(f"  {key}: {_files(len(added))} added: {_names(added, cap)}")
    removed = [u for u in a if u not in b]
    if removed:
        lines.append(f"  {key}: {_files(len(removed))} removed: {_names(removed, cap)}")
    if not lines:  # the same files in another order
        lines.append(f"  {key}: the same {_files(len(a))} in another order")
    return lines


def diff_documents(saved: dict[str, Any], current: dict[str, Any], limit: int = 12,
                   files_named: int = 3) -> list[str]:
    """Human lines naming each field that differs between two fingerprint documents.

    File lists are compared file by file: the lines name the files that changed, were added
    or removed (``files_named`` of each, then a count), never the whole list."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(saved, "", a)
    _flatten(current, "", b)
    lines = []
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key, "<absent>"), b.get(key, "<absent>")
        if old == new:
            continue
        if _is_file_list(old) and _is_file_list(new):
            lines.extend(_diff_files(key, old, new, files_named))
        else:
            lines.append(f"  {key}: saved {_clip(old)}, now {_clip(new)}")
    if len(lines) > limit:
        lines = [*lines[:limit], f"  ... and {len(lines) - limit} more"]
    return lines


def _clip(value: Any, width: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} characters)"


def check_fingerprint(saved_fp: str, saved_doc: dict[str, Any] | None, current_fp: str,
                      current_doc: dict[str, Any], what: str, step: int | None = None) -> None:
    """Raise :class:`MismatchError` naming the differing fields unless the fingerprints match.

    With ``step`` (the saved state's step: the steps it has consumed), only the part of the
    recipe those steps depend on must match (:func:`datalane.spec.phases.prefix_document`):
    phases starting at or after ``step`` and sources unused until then may differ, so a run
    may resume with phases appended. The refusal names which phase changed what."""
    if saved_fp == current_fp:
        return
    if step is not None and saved_doc:
        from datalane.spec.phases import phase_diff, prefix_document  # phases imports us

        saved, current = prefix_document(saved_doc, step), prefix_document(current_doc, step)
        if fingerprint_of(saved) == fingerprint_of(current):
            return
        lines = phase_diff(saved, current, step)
        # recipes without phases (or unused sources) read as they always did
        phased = any("phases" in d.get("recipe", {}) for d in (saved_doc, current_doc))
        note = "" if not phased and (saved, current) == (saved_doc, current_doc) else (
            f" in what the {step} steps before the resume consumed (phases starting at or "
            f"after step {step} may change)")
        raise MismatchError(
            f"{what} was saved with recipe fingerprint {saved_fp[:16]}..., but this recipe "
            f"has {current_fp[:16]}...{note}; these fields differ:\n"
            + "\n".join(lines or ["  (no field named; the documents differ)"]))
    detail = diff_documents(saved_doc, current_doc) if saved_doc else []
    if not detail:
        detail = ["  (the saved state carries no fingerprint document to compare)"]
    raise MismatchError(
        f"{what} was saved with recipe fingerprint {saved_fp[:16]}..., but this recipe has "
        f"{current_fp[:16]}...; these fields differ:\n" + "\n".join(detail))
