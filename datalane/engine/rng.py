"""Counter-based randomness keyed by purpose (docs/architecture.md, One lane).

Every random decision is a pure function of a key such as ``(seed, "chunks", source, epoch)``;
there is no generator state to save or restore, and no dependence on numpy's bit-generator
versions. Words come from BLAKE2b over the key and a counter; permutations are Fisher-Yates
driven by those words (64-bit modulo, bias below 2**-40 for any block size in use).
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

__all__ = ["permutation", "words"]


def _key(parts: tuple[object, ...]) -> bytes:
    return "\x1f".join(str(p) for p in parts).encode()


def _blocks(key: bytes, count: int) -> list[bytes]:
    """The BLAKE2b blocks of 8 little-endian words that hold the first ``count`` words."""
    return [hashlib.blake2b(key + struct.pack("<Q", block), digest_size=64).digest()
            for block in range(-(-count // 8))]


def _words(key: bytes, count: int) -> list[int]:
    out: list[int] = []
    for digest in _blocks(key, count):
        out.extend(struct.unpack("<8Q", digest))
    return out[:count]


def permutation(n: int, *key: object) -> list[int]:
    """A permutation of ``range(n)`` determined by ``key`` alone."""
    perm = list(range(n))
    if n < 2:
        return perm
    # word k picks the swap of index n - 1 - k among 0 .. n - 1 - k (all the modulos at once,
    # exact in uint64; the swaps in order)
    raw = b"".join(_blocks(_key(key), n - 1))
    words = np.frombuffer(raw, dtype="<u8", count=n - 1)
    picks = (words % np.arange(n, 1, -1, dtype=np.uint64)).tolist()
    for i, j in zip(range(n - 1, 0, -1), picks, strict=True):
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def words(count: int, *key: object) -> list[int]:
    """``count`` uniform 64-bit words determined by ``key`` alone (augmentations:
    :mod:`datalane.engine.images.augment`)."""
    return _words(_key(key), count)
