"""``datalane inspect``: a checkpoint of lane resume points, in human form."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from datalane.spec.errors import MismatchError
from datalane.spec.state import Checkpoint, LaneState, Piece

__all__ = ["describe"]


def _sources(ckpt: Checkpoint) -> list[dict[str, Any]]:
    doc = ckpt.fingerprint_doc or {}
    recipe = doc.get("recipe") or {}
    return list(recipe.get("sources") or [])


def _lane(state: LaneState, names: list[str], files: dict[str, list[Any]]) -> list[str]:
    def name(i: int) -> str:
        return names[i] if i < len(names) else f"source[{i}]"

    def file(src: int, f: int) -> str:
        listed = files.get(name(src), [])
        return str(listed[f][0]) if f < len(listed) else f"file[{f}]"

    lines = [f"lane {state.lane}: {state.sequences} sequences emitted"
             f"{' (ended: every source exhausted)' if state.ended else ''}; "
             f"{state.encoded_size()} bytes"]
    for i, c in enumerate(state.sources):
        where = "chunk start" if c.pos < 0 else f"record at {c.pos}"
        lines.append(f"  {name(i)}: epoch {c.epoch}, block {c.block} (starts at the lane's "
                     f"chunk #{c.chunk}, {where}), {c.offset} shuffled records consumed")
    mix = ", ".join(f"{name(i)}={t}" for i, t in enumerate(state.mixture))
    lines.append(f"  mixture tokens consumed: {mix}")
    pk = state.packer
    label = pk.name or "version-1 carry-over"
    held = list(_pieces(pk.data, ""))
    if not held:
        lines.append(f"  packer ({label}): holds nothing")
    else:
        lines.append(f"  packer ({label}):")
    for where, p in held:
        # a reference is the file's index, then whatever position its format needs
        doc = (f"{file(p.source, p.ref[0])} @{','.join(map(str, p.ref[1:]))}" if len(p.ref) > 1
               else f"document {list(p.ref)}")
        lines.append(f"    {where}: {name(p.source)} {doc} tokens {p.start}-{p.stop}")
    n = state.counters
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(n.skipped.items())) or "none"
    lines.append(f"  counters: documents read {n.docs}, packed {n.kept}, tokens {n.tokens}, "
                 f"padding {n.padding}, skipped {skipped}")
    return lines


def _pieces(value: Any, where: str) -> Iterator[tuple[str, Piece]]:
    """Every piece in a packer's JSON state, with where it sits (``bins[0][1]``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _pieces(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        try:
            yield where, Piece.decode(value, where)
            return
        except MismatchError:
            pass
        for i, v in enumerate(value):
            yield from _pieces(v, f"{where}[{i}]")


def describe(ckpt: Checkpoint, raw: bool = False) -> str:
    srcs = _sources(ckpt)
    names = [str(s.get("name")) for s in srcs]
    files = (ckpt.fingerprint_doc or {}).get("files") or {}
    sizes = [s.encoded_size() for s in ckpt.lanes.values()]
    out = [
        f"checkpoint at step {ckpt.step}: lanes {len(ckpt.lanes)} of {ckpt.lanes_total}",
        f"fingerprint {ckpt.fingerprint}",
        f"sources: {', '.join(names) or 'unknown (no fingerprint document)'}",
        f"resume point bytes per lane: max {max(sizes, default=0)}, "
        f"mean {sum(sizes) / max(len(sizes), 1):.0f}",
    ]
    for lane in sorted(ckpt.lanes):
        out.extend(_lane(ckpt.lanes[lane], names, files))
        if raw:
            out.append("  " + json.dumps(ckpt.lanes[lane].to_json(), separators=(",", ":")))
    return "\n".join(out)
