from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.remap import lookup_sorted, lookup_sorted_cuda, lookup_sorted_numpy

LOW, HIGH = -(2**63), 2**63 - 1
# Extremes and their neighbours are drawn often, so the binary search is probed at both ends.
EDGES = [LOW, LOW + 1, -1, 0, 1, HIGH - 1, HIGH]
int64s = st.one_of(st.sampled_from(EDGES), st.integers(-50, 50), st.integers(LOW, HIGH))


def _mapping(keys: list[int], ids: list[int] | None) -> tuple[np.ndarray, np.ndarray | None, dict[int, int]]:
    """Sorted key array, aligned ids (or None) and the same mapping as a dict."""
    sorted_keys = np.array(sorted(keys), dtype=np.int64)
    if ids is None:
        return sorted_keys, None, {k: i for i, k in enumerate(sorted(keys))}
    by_key = dict(zip(keys, ids))
    return sorted_keys, np.array([by_key[k] for k in sorted(keys)], dtype=np.int64), by_key


@settings(max_examples=300, deadline=None)
@given(st.lists(int64s, unique=True, max_size=40), st.data())
def test_matches_a_dict(keys, data):
    ids = data.draw(st.one_of(st.none(), st.lists(int64s, min_size=len(keys), max_size=len(keys))))
    queries = data.draw(st.lists(st.one_of(st.sampled_from(keys) if keys else int64s, int64s), max_size=60))
    default = data.draw(int64s)
    sorted_keys, ids_array, reference = _mapping(keys, ids)
    got = lookup_sorted(sorted_keys, ids_array, np.array(queries, dtype=np.int64), default)
    assert got.dtype == np.int64 and got.shape == (len(queries),)
    assert got.tolist() == [reference.get(q, default) for q in queries]


@settings(max_examples=50, deadline=None)
@given(st.lists(int64s, unique=True, max_size=20), st.lists(int64s, min_size=12, max_size=12))
def test_keeps_the_shape_of_values(keys, queries):
    sorted_keys, ids, reference = _mapping(keys, [k % 7 for k in keys])
    values = np.array(queries, dtype=np.int64).reshape(3, 2, 2)
    got = lookup_sorted(sorted_keys, ids, values, -1)
    assert got.shape == values.shape
    assert got.reshape(-1).tolist() == [reference.get(q, -1) for q in queries]


@pytest.mark.parametrize("keys", [[], [7], [LOW, HIGH]])
def test_empty_values_and_empty_mapping(keys):
    sorted_keys = np.array(keys, dtype=np.int64)
    empty = lookup_sorted(sorted_keys, None, np.zeros((0,), np.int64), 0)
    assert empty.dtype == np.int64 and empty.shape == (0,)
    assert lookup_sorted(sorted_keys, sorted_keys * 0 + 5, np.zeros((2, 0), np.int64), 0).shape == (2, 0)
    if not keys:
        got = lookup_sorted(sorted_keys, sorted_keys, np.array([[LOW, 0], [HIGH, 3]], np.int64), 9)
        assert got.dtype == np.int64 and got.tolist() == [[9, 9], [9, 9]]


def test_extreme_keys_are_found_and_their_neighbours_are_not():
    sorted_keys = np.array([LOW, 0, HIGH], dtype=np.int64)
    ids = np.array([10, 20, 30], dtype=np.int64)
    values = np.array([LOW, LOW + 1, -1, 0, 1, HIGH - 1, HIGH], dtype=np.int64)
    assert lookup_sorted(sorted_keys, ids, values, 0).tolist() == [10, 0, 0, 20, 0, 0, 30]


@pytest.mark.parametrize("ids, match", [(np.arange(2), "ids has shape"), (None, "must be 1-D")])
def test_bad_mappings_are_named(ids, match):
    keys = np.arange(3, dtype=np.int64)
    with pytest.raises(ValueError, match=match):
        lookup_sorted_numpy(keys.reshape(1, 3) if ids is None else keys, ids, keys, 0)


@pytest.mark.gpu
def test_cuda_matches_numpy(gpu):
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(LOW, HIGH, 200_000, dtype=np.int64))
    keys = np.unique(np.concatenate([keys, [LOW, -1, 0, HIGH]]))
    ids = rng.permutation(len(keys)).astype(np.int64) + 1
    values = np.concatenate([rng.choice(keys, 500_000), rng.integers(LOW, HIGH, 500_003, dtype=np.int64),
                             np.array([LOW, LOW + 1, -1, 0, 1, HIGH - 1, HIGH], dtype=np.int64)])
    for mapped in (ids, None):
        want = lookup_sorted_numpy(keys, mapped, values, 0)
        got = lookup_sorted_cuda(gpu.asarray(keys), None if mapped is None else gpu.asarray(mapped),
                                 gpu.asarray(values), 0)
        assert isinstance(got, gpu.ndarray) and got.dtype == np.int64
        np.testing.assert_array_equal(gpu.asnumpy(got), want)
    dispatched = lookup_sorted(gpu.asarray(keys), gpu.asarray(ids), gpu.asarray(values[:10].reshape(2, 5)), 0)
    assert isinstance(dispatched, gpu.ndarray) and dispatched.shape == (2, 5)
    empty = lookup_sorted(gpu.asarray(keys[:0]), gpu.asarray(ids[:0]), gpu.asarray(values[:10]), 3)
    assert gpu.asnumpy(empty).tolist() == [3] * 10
