"""Field-by-field differences between two fingerprint documents (:mod:`.fingerprint`).

What a refusal of a saved state says when its recipe differs: each differing field, and file by
file for the source file lists. Callers: :func:`datalane.spec.fingerprint.check_fingerprint`
(which re-exports :func:`diff_documents`) and :mod:`datalane.spec.phases`; a module of its
own so that neither imports the other for it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["diff_documents"]


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
