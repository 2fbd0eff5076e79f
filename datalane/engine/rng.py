"""Counter-based randomness keyed by purpose (docs/architecture.md, One lane).

Every random decision is a pure function of a key such as ``(seed, "chunks", source, epoch)``;
there is no generator state to save or restore, and no dependence on numpy's bit-generator
versions. Words come from BLAKE2b over the key and a counter; permutations are Fisher-Yates
driven by those words (64-bit modulo, bias below 2**-40 for any block size in use).
"""

from __future__ import annotations

import hashlib
import struct

__all__ = ["permutation", "words"]


def _key(parts: tuple[object, ...]) -> bytes:
    return "\x1f".join(str(p) for p in parts).encode()


def _words(key: bytes, count: int) -> list[int]:
    out: list[int] = []
    block = 0
    while len(out) < count:
        digest = hashlib.blake2b(key + struct.pack("<Q", block), digest_size=64).digest()
        out.extend(struct.unpack("<8Q", digest))
        block += 1
    return out[:count]


def permutation(n: int, *key: object) -> list[int]:
    """A permutation of ``range(n)`` determined by ``key`` alone."""
    perm = list(range(n))
    if n < 2:
        return perm
    words = _words(_key(key), n - 1)
    for i in range(n - 1, 0, -1):
        j = words[n - 1 - i] % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def words(count: int, *key: object) -> list[int]:
    """``count`` uniform 64-bit words determined by ``key`` alone (augmentations:
    :mod:`datalane.engine.images.augment`)."""
    return _words(_key(key), count)
