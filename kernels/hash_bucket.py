"""hash_bucket(keys, num_buckets, seed=0): deterministic 64-bit hashing of int64 keys.

The splitmix64 finalizer of ``key XOR seed``, reduced to ``[0, num_buckets)`` by a
multiply-shift of its high 32 bits (no division). The NumPy implementation below is the
specification; ``hash_bucket.cu`` computes the same bits on the GPU. Unlike Python's ``hash``
it is never salted: the same key gives the same bucket in every process and on every device.

Example:
    >>> import numpy as np
    >>> hash_bucket(np.array([0, 1, -1, 2**63 - 1]), 1000).tolist()
    [883, 566, 893, 165]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kernels import backend, checks
from kernels.hashing import mix64


def _check(keys: Any, num_buckets: int, seed: int) -> int:
    checks.positive_int("num_buckets", num_buckets)
    if num_buckets >= 1 << 32:
        raise ValueError(f"num_buckets={num_buckets} is invalid: expected fewer than 2**32 buckets")
    checks.positive_int("seed", seed, allow_zero=True)
    if keys.dtype != np.int64:
        raise TypeError(f"keys have dtype {keys.dtype}, expected int64")
    return num_buckets


def hash_bucket_numpy(keys: np.ndarray, num_buckets: int, seed: int = 0) -> np.ndarray:
    """NumPy implementation (the specification); any shape, returns int64 of the same shape."""
    keys = np.asarray(keys)
    _check(keys, num_buckets, seed)
    flat = np.ascontiguousarray(keys).reshape(-1).view(np.uint64)
    z = mix64(flat ^ np.uint64(seed))
    with np.errstate(over="ignore"):
        z >>= np.uint64(32)
        z *= np.uint64(num_buckets)
        z >>= np.uint64(32)
    return z.view(np.int64).reshape(keys.shape)


def hash_bucket_cuda(keys: Any, num_buckets: int, seed: int = 0) -> Any:
    """CUDA implementation (``hash_bucket.cu``) on CuPy arrays; same result as the NumPy twin."""
    from kernels import _cuda

    cupy = backend.cupy
    keys = cupy.ascontiguousarray(cupy.asarray(keys))
    _check(keys, num_buckets, seed)
    out = cupy.empty(keys.shape, cupy.int64)
    if keys.size:
        kernel = _cuda.function("hash_bucket", "hash_bucket")
        kernel(_cuda.grid(keys.size), (_cuda.THREADS,),
               (keys, out, np.int64(keys.size), np.uint64(seed), np.uint64(num_buckets)))
    return out


def hash_bucket(keys: Any, num_buckets: int, seed: int = 0) -> Any:
    """Hash int64 `keys` into ``[0, num_buckets)``; CuPy input runs the CUDA kernel.

    Args:
        keys: int64 array (NumPy or CuPy), any shape.
        num_buckets: number of buckets, ``1 <= num_buckets < 2**32``.
        seed: changes the hash function (same seed, same buckets everywhere).

    Returns:
        int64 array of bucket ids, same shape and device as `keys`.
    """
    if backend.cupy is not None and isinstance(keys, backend.cupy.ndarray):
        return hash_bucket_cuda(keys, num_buckets, seed)
    return hash_bucket_numpy(keys, num_buckets, seed)
