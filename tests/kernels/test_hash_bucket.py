from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels.hash_bucket import hash_bucket, hash_bucket_cuda, hash_bucket_numpy

MASK = (1 << 64) - 1


def reference(key: int, num_buckets: int, seed: int) -> int:
    """splitmix64 finalizer in plain Python integers, then multiply-shift reduction."""
    z = ((key & MASK) ^ seed) & MASK
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z ^= z >> 31
    return ((z >> 32) * num_buckets) >> 32


int64s = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(int64s, min_size=0, max_size=300), st.integers(1, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_matches_plain_python(keys, num_buckets, seed):
    got = hash_bucket(np.array(keys, dtype=np.int64), num_buckets, seed)
    assert got.tolist() == [reference(k, num_buckets, seed) for k in keys]


def test_extremes_shape_and_block_boundaries():
    keys = np.array([0, -1, 2**63 - 1, -(2**63)] * 50_000, dtype=np.int64).reshape(4, -1)
    out = hash_bucket(keys, 97)
    assert out.shape == keys.shape and out.dtype == np.int64
    assert out.min() >= 0 and out.max() < 97
    assert out[:, 0].tolist() == [reference(int(k), 97, 0) for k in keys[:, 0]]


def test_spreads_keys_evenly_and_seed_changes_the_function():
    keys = np.arange(1_000_000, dtype=np.int64)
    counts = np.bincount(hash_bucket(keys, 100), minlength=100)
    assert counts.min() > 9_500 and counts.max() < 10_500
    assert (hash_bucket(keys[:1000], 100, seed=1) != hash_bucket(keys[:1000], 100)).mean() > 0.9


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_buckets": 0}, ValueError, "num_buckets=0"),
    ({"num_buckets": 2**32}, ValueError, "fewer than 2\\*\\*32"),
    ({"num_buckets": 10, "seed": -1}, ValueError, "seed=-1"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        hash_bucket_numpy(np.arange(3, dtype=np.int64), **kwargs)


def test_wrong_dtype_is_named():
    with pytest.raises(TypeError, match="int32"):
        hash_bucket(np.arange(3, dtype=np.int32), 10)


@pytest.mark.gpu
def test_cuda_matches_numpy(gpu):
    keys = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 1_000_003, dtype=np.int64)
    keys[:4] = [0, -1, 2**63 - 1, -(2**63)]
    for num_buckets, seed in [(1, 0), (1000, 0), (2**32 - 1, 12345)]:
        np.testing.assert_array_equal(gpu.asnumpy(hash_bucket_cuda(gpu.asarray(keys), num_buckets, seed)),
                                      hash_bucket_numpy(keys, num_buckets, seed))
    assert isinstance(hash_bucket(gpu.asarray(keys[:10]), 7), gpu.ndarray)
