"""lookup_sorted(sorted_keys, ids, values, default): raw key -> id through a sorted mapping.

The mapping is given as two aligned 1-D arrays: `sorted_keys` (ascending, unique) and `ids`
(``ids[i]`` is the id of ``sorted_keys[i]``; ``None`` means the position ``i``). Every value of
`values` found among the keys becomes its id, every other value becomes `default` (the OOV row
of a fitted vocabulary). It is a binary search (``searchsorted``) per value, then one equality
test at the found position.

The NumPy implementation is the specification. On the GPU the CUDA implementation is CuPy's own
``cupy.searchsorted`` (a CUDA binary-search kernel) followed by the same elementwise steps, so no
``.cu`` source of this package is involved; both give the same ids for the same input.

Example:
    >>> import numpy as np
    >>> keys = np.array([-5, 3, 2**63 - 1])
    >>> lookup_sorted(keys, np.array([2, 1, 3]), np.array([[3, 4], [-5, 2**63 - 1]]), 0).tolist()
    [[1, 0], [2, 3]]
    >>> lookup_sorted(keys, None, np.array([3, 7]), -1).tolist()
    [1, -1]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kernels import backend


def _lookup(xp: Any, sorted_keys: Any, ids: Any, values: Any, default: int) -> Any:
    if sorted_keys.ndim != 1:
        raise ValueError(f"sorted_keys must be 1-D, got shape {tuple(sorted_keys.shape)}")
    if ids is not None and ids.shape != sorted_keys.shape:
        raise ValueError(f"ids has shape {tuple(ids.shape)} but sorted_keys has shape {tuple(sorted_keys.shape)}")
    n = sorted_keys.shape[0]
    if n == 0:
        return xp.full(values.shape, default, dtype=xp.int64)
    pos = xp.minimum(xp.searchsorted(sorted_keys, values), n - 1)
    found = ids[pos] if ids is not None else pos.astype(xp.int64)
    return xp.where(sorted_keys[pos] == values, found, default)


def lookup_sorted_numpy(sorted_keys: Any, ids: Any, values: Any, default: int) -> Any:
    """NumPy implementation (the specification); see `lookup_sorted`."""
    return _lookup(np, np.asarray(sorted_keys), None if ids is None else np.asarray(ids), np.asarray(values), default)


def lookup_sorted_cuda(sorted_keys: Any, ids: Any, values: Any, default: int) -> Any:
    """CUDA implementation on CuPy arrays: ``cupy.searchsorted``; same result as the NumPy twin."""
    cupy = backend.cupy
    if cupy is None:
        raise RuntimeError("lookup_sorted_cuda needs CuPy and a visible GPU (kernels.backend found none)")
    return _lookup(cupy, cupy.asarray(sorted_keys), None if ids is None else cupy.asarray(ids),
                   cupy.asarray(values), default)


def lookup_sorted(sorted_keys: Any, ids: Any, values: Any, default: int) -> Any:
    """Map `values` to the ids of a sorted key -> id mapping; keys not in it -> `default`.

    Args:
        sorted_keys: 1-D array of unique keys in ascending order (same dtype as `values`).
        ids: 1-D int64 array aligned with `sorted_keys`, or ``None`` for ids ``0..n-1``.
        values: array of keys to map, any shape. A CuPy array runs on the GPU; `sorted_keys`
            and `ids` must then be CuPy arrays on the same device (keep them there across calls).
        default: the id of a key not in the mapping.

    Returns:
        int64 array of ids, same shape and device as `values`.
    """
    if backend.cupy is not None and isinstance(values, backend.cupy.ndarray):
        return lookup_sorted_cuda(sorted_keys, ids, values, default)
    return lookup_sorted_numpy(sorted_keys, ids, values, default)
