"""unique(keys) -> (unique, inverse, counts) for 1-D int64 arrays, on NumPy or CuPy.

``unique`` is sorted; ``unique[inverse]`` rebuilds `keys`; ``counts[i]`` is how often
``unique[i]`` occurs. NumPy's sort-based ``np.unique`` is the specification; on the GPU CuPy's
sort-based implementation (CUDA radix sort) computes the same three arrays.

Example:
    >>> import numpy as np
    >>> u, inv, c = unique(np.array([5, -1, 5, 7]))
    >>> u.tolist(), inv.tolist(), c.tolist()
    ([-1, 5, 7], [1, 0, 1, 2], [1, 2, 1])
"""
from __future__ import annotations

from typing import Any

from kernels.backend import array_module_of


def unique(keys: Any) -> tuple[Any, Any, Any]:
    """Sorted unique values of a 1-D array, the inverse index and the counts (all int64)."""
    xp = array_module_of(keys)
    if keys.ndim != 1:
        raise ValueError(f"keys must be 1-D, got shape {tuple(keys.shape)}")
    if keys.size == 0:
        empty = xp.zeros(0, xp.int64)
        return keys[:0], empty, empty
    uniq, inverse, counts = xp.unique(keys, return_inverse=True, return_counts=True)
    return uniq, inverse.reshape(-1).astype(xp.int64), counts.astype(xp.int64)
