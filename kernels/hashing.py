"""The splitmix64 finalizer (``mix64``), the 64-bit mixing function behind `hash_bucket`, the
hash table's slots and key-seeded initial values. ``mix64.cuh`` is its CUDA twin.

Example:
    >>> import numpy as np
    >>> int(mix64(np.array([0], dtype=np.uint64))[0])
    16294208416658607535
"""
from __future__ import annotations

import numpy as np

_C1 = np.uint64(0x9E3779B97F4A7C15)
_C2 = np.uint64(0xBF58476D1CE4E5B9)
_C3 = np.uint64(0x94D049BB133111EB)
BLOCK = 1 << 16  # elements per pass: intermediates stay in cache


def mix64(z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """splitmix64 finalizer of uint64 values (wrapping arithmetic), blockwise and in place on `out`."""
    z = np.ascontiguousarray(z, dtype=np.uint64).reshape(-1)
    out = np.empty_like(z) if out is None else out
    tmp = np.empty(min(BLOCK, max(z.size, 1)), np.uint64)
    with np.errstate(over="ignore"):
        for lo in range(0, z.size, BLOCK):
            o, t = out[lo:lo + BLOCK], tmp[: min(BLOCK, z.size - lo)]
            np.add(z[lo:lo + BLOCK], _C1, out=o)
            np.right_shift(o, np.uint64(30), out=t)
            o ^= t
            o *= _C2
            np.right_shift(o, np.uint64(27), out=t)
            o ^= t
            o *= _C3
            np.right_shift(o, np.uint64(31), out=t)
            o ^= t
    return out
