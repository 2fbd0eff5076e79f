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
from datalane.spec.recipediff import diff_documents

__all__ = ["check_fingerprint", "diff_documents", "fingerprint_of"]


def fingerprint_of(document: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of a fingerprint document."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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
