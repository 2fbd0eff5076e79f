"""Where every object of a checkpoint store lives (the storage layout).

One base URI (any fsspec URI) holds one training run's checkpoints::

    <base>/steps/<step:012d>/pod-<pod_id>.json   lane states of one pod at one step
    <base>/steps/<step:012d>/MANIFEST.json       the commit marker of the step
    <base>/steps/<step:012d>/MANIFEST.sig        its HMAC signature (with a ledger key only)
    <base>/HEAD.json                             the newest committed step (history.py)
    <base>/gc/<step:012d>.json                   what a garbage collection removed

Steps are zero-padded to 12 digits so that a lexicographic listing is also numeric order.
A step is *committed* iff its ``MANIFEST.json`` exists and verifies; pod objects without a
manifest are a checkpoint in progress (or an abandoned one) and are never read for a restore.

Temporary objects (local filesystems only) are named ``<name>.tmp-<random>`` next to their
final name; they never match the patterns below, so a crash mid-write leaves nothing that a
reader could take for a real object.

Pure functions: no I/O. Callers: :mod:`datalane.store.store` and :mod:`datalane.store.audit`.
"""

from __future__ import annotations

import re

from datalane.spec.errors import ConfigError
from datalane.spec.state import check_step as spec_check_step

__all__ = [
    "MANIFEST_NAME",
    "STEPS_DIR",
    "gc_path",
    "gc_root",
    "head_path",
    "manifest_path",
    "pod_object_name",
    "pod_path",
    "signature_path",
    "step_dir",
    "step_of_dir",
    "step_of_manifest",
]

STEPS_DIR = "steps"
MANIFEST_NAME = "MANIFEST.json"
SIGNATURE_NAME = "MANIFEST.sig"
HEAD_NAME = "HEAD.json"
GC_DIR = "gc"
STEP_DIGITS = 12

_POD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_POD_OBJECT = re.compile(r"pod-([A-Za-z0-9][A-Za-z0-9._-]{0,127})\.json")
_STEP_DIR = re.compile(rf"[0-9]{{{STEP_DIGITS}}}")


def check_step(step: int) -> int:
    """``step`` if it is a non-negative int that fits the layout; ConfigError otherwise."""
    return spec_check_step(step, "a checkpoint step")  # 10^12 = 10^STEP_DIGITS


def pod_object_name(pod_id: str | int) -> str:
    """``pod-<pod_id>.json``; pod ids are pod names or ordinals (letters, digits, ``._-``)."""
    text = str(pod_id)
    if isinstance(pod_id, bool) or not _POD_ID.fullmatch(text):
        raise ConfigError(f"pod id {pod_id!r} cannot name an object: use 1-128 letters, digits, "
                          f"'.', '_' or '-', starting with a letter or digit")
    return f"pod-{text}.json"


def is_pod_object_name(name: str) -> bool:
    """Whether a file name inside a step directory is a pod object."""
    return _POD_OBJECT.fullmatch(name) is not None


def pod_id_of(name: str) -> str:
    """The pod id encoded in a pod object's name."""
    m = _POD_OBJECT.fullmatch(name)
    if m is None:
        raise ConfigError(f"{name!r} is not a pod object name")
    return m.group(1)


def step_dir(base: str, step: int) -> str:
    """The directory (key prefix) that holds every object of ``step``."""
    return f"{base}/{STEPS_DIR}/{check_step(step):0{STEP_DIGITS}d}"


def steps_root(base: str) -> str:
    """The directory under which every step directory lives."""
    return f"{base}/{STEPS_DIR}"


def pod_path(base: str, step: int, pod_id: str | int) -> str:
    """Path of the object holding pod ``pod_id``'s lane states at ``step``."""
    return f"{step_dir(base, step)}/{pod_object_name(pod_id)}"


def manifest_path(base: str, step: int) -> str:
    """Path of the commit marker of ``step``."""
    return f"{step_dir(base, step)}/{MANIFEST_NAME}"


def signature_path(base: str, step: int) -> str:
    """Path of the HMAC signature of ``step``'s manifest (see :mod:`datalane.store.signing`)."""
    return f"{step_dir(base, step)}/{SIGNATURE_NAME}"


def head_path(base: str) -> str:
    """Path of ``HEAD.json``, the record of the newest committed step."""
    return f"{base}/{HEAD_NAME}"


def gc_root(base: str) -> str:
    """The directory of the gc records."""
    return f"{base}/{GC_DIR}"


def gc_path(base: str, step: int) -> str:
    """Path of the gc record whose newest removed step is ``step``."""
    return f"{gc_root(base)}/{check_step(step):0{STEP_DIGITS}d}.json"


def basename(path: str) -> str:
    """Last component of a ``/``-separated path."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def step_of_dir(path: str) -> int | None:
    """The step a step directory stands for, or None for anything else."""
    name = basename(path)
    return int(name) if _STEP_DIR.fullmatch(name) else None


def step_of_manifest(path: str) -> int | None:
    """The step of a ``.../steps/<step>/MANIFEST.json`` path, or None for anything else."""
    parent, _, name = path.rstrip("/").rpartition("/")
    if name != MANIFEST_NAME:
        return None
    return step_of_dir(parent)


def format_steps(steps: list[int]) -> str:
    """``10, 20, 30`` (or ``none``), the way error messages list steps."""
    return ", ".join(str(s) for s in steps) if steps else "none"
