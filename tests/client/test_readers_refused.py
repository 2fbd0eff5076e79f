"""Tensor-parallel peers that forget ``readers=`` are refused at Open, naming ``readers``.

Two trainer processes of one data-parallel rank, each opening it as reader 0 of 1: the second
Open took the first one's reader away, so one of them failed - only sometimes, depending on
who streamed first - with ``StorageError: sidecar call failed: ABORTED`` that did not mention
``readers``. Real processes (the second trainer is a subprocess), a real sidecar and socket.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from datalane import load_recipe
from datalane.client import InProcessLoader, SidecarLoader

pytestmark = pytest.mark.slow  # real sidecar processes

_PEER = textwrap.dedent("""
    import sys
    from datalane.client import SidecarLoader
    from datalane.spec.errors import ConfigError
    socket, readers, reader = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    loader = SidecarLoader(socket, rank=0, world_size=2, microbatch_size=4, readers=readers,
                           reader=reader, open_timeout=60)
    try:
        next(iter(loader))
    except ConfigError as e:
        print(f"ConfigError: {e}")
        sys.exit(3)
    print("read")
""")


def _peer(socket: str, readers: int, reader: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PEER, socket, str(readers), str(reader)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


def _keys(batches: list[Any]) -> list[tuple[int, int, bytes]]:
    return [(b.step, b.index, b.input_ids.tobytes()) for b in batches]


def test_a_peer_without_readers_is_refused_naming_readers(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe)
    with SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=4) as first:
        it = iter(first)
        got = [next(it) for _ in range(3)]  # streaming: rank 0, reader 0 of 1
        proc = _peer(sc.socket, 1, 0)
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        line = proc.stdout.strip()
        assert line.startswith("ConfigError: reader 0 of rank 0 (readers=1) is already read "
                               "by another trainer process"), line
        assert "pass readers= (how many share it) and each its own reader= index" in line
        got += [next(it) for _ in range(3)]  # the first trainer never noticed
    ref = InProcessLoader(load_recipe(repeat_recipe), 0, 2, 4)
    try:
        want = [b for _, b in zip(range(6), ref, strict=False)]
    finally:
        ref.close()
    assert _keys(got) == _keys(want)


def test_a_peer_with_other_readers_is_refused_naming_both(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe)
    with SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=4, readers=2,
                       reader=0) as first:
        it = iter(first)
        next(it)
        proc = _peer(sc.socket, 1, 0)
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        assert proc.stdout.strip() == (
            "ConfigError: rank 0 is read by another trainer process with readers=2; this "
            "one asks readers=1: every process that reads a data-parallel rank (its "
            "tensor/context-parallel peers) passes the same readers= and its own reader= "
            "index")
        # the peer that does pass readers= reads the same rank
        ok = _peer(sc.socket, 2, 1)
        assert (ok.returncode, ok.stdout.strip()) == (0, "read"), ok.stderr
