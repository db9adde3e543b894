from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.hash_table import HashTable
from kernels.rows import gather_rows, scatter_add_rows, scatter_rows
from kernels.unique import unique

EXTREMES = [0, -1, 1, 2**63 - 1, -(2**63)]
keys_strategy = st.lists(st.one_of(st.sampled_from(EXTREMES), st.integers(-(2**63), 2**63 - 1),
                                   st.integers(-5, 5)), max_size=120)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "lookup", "lookup_or_insert"]), keys_strategy), max_size=8))
def test_matches_a_dict(ops):
    table, ref = HashTable(capacity=8), {}
    for op, keys in ops:
        arr = np.array(keys, dtype=np.int64)
        if op == "insert":
            values = np.arange(len(keys), dtype=np.int64) * 7 + 3
            table.insert(arr, values)
            for k, v in zip(keys, values.tolist()):
                ref[k] = v  # the last value of a repeated key wins
        elif op == "lookup":
            assert table.lookup(arr).tolist() == [ref.get(k, -1) for k in keys]
        else:
            start = len(ref)
            new = sorted({k for k in keys if k not in ref})
            for i, k in enumerate(new):
                ref[k] = start + i
            assert table.lookup_or_insert(arr).tolist() == [ref[k] for k in keys]
        assert len(table) == len(ref)
        assert 2 * len(table) <= table.capacity
    exported = dict(zip(table.keys().tolist(), table.values().tolist()))
    assert exported == ref
    assert table.values().tolist() == sorted(ref.values())


def test_grows_far_beyond_initial_capacity_and_keeps_every_key():
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, 200_000, dtype=np.int64))
    table = HashTable(capacity=8)
    values = table.lookup_or_insert(keys)
    np.testing.assert_array_equal(values, np.arange(len(keys)))  # sorted keys get 0..n-1
    np.testing.assert_array_equal(table.lookup(keys[::-1]), values[::-1])
    assert table.capacity >= 2 * len(keys)


def test_shapes_and_dtype_checks():
    table = HashTable()
    out = table.lookup_or_insert(np.array([[3, 4], [4, 3]], dtype=np.int64))
    assert out.shape == (2, 2) and out.tolist() == [[0, 1], [1, 0]]
    with pytest.raises(TypeError, match="int32"):
        table.lookup(np.array([1], dtype=np.int32))
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        table.insert(np.array([1, 2]), np.array([1]))
    with pytest.raises(ValueError, match="capacity=0"):
        HashTable(capacity=0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200))
def test_unique_matches_numpy(keys):
    arr = np.array(keys, dtype=np.int64)
    u, inv, counts = unique(arr)
    ref_u, ref_inv, ref_c = np.unique(arr, return_inverse=True, return_counts=True)
    assert u.tolist() == ref_u.tolist() and counts.tolist() == ref_c.tolist()
    assert u[inv].tolist() == keys


def test_row_helpers_check_bounds():
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    assert gather_rows(table, np.array([5, 0])).tolist() == [[10, 11], [0, 1]]
    scatter_add_rows(table, np.array([1, 1]), np.ones((2, 2), np.float32))
    assert table[1].tolist() == [4, 5]
    with pytest.raises(IndexError, match=r"row ids span \[0, 6\] but the table has 6 rows"):
        gather_rows(table, np.array([0, 6]))
    with pytest.raises(IndexError, match="scatter_rows"):
        scatter_rows(table, np.array([-1]), np.zeros((1, 2)))


@pytest.mark.gpu
def test_cuda_table_matches_numpy_table(gpu):
    rng = np.random.default_rng(1)
    batches = [rng.integers(-50_000, 50_000, 40_000, dtype=np.int64) for _ in range(5)]
    batches.append(np.array(EXTREMES * 100, dtype=np.int64))
    cpu, dev = HashTable(16), HashTable(16, device="gpu")
    for b in batches:
        np.testing.assert_array_equal(gpu.asnumpy(dev.lookup_or_insert(gpu.asarray(b))), cpu.lookup_or_insert(b))
    assert len(cpu) == len(dev)
    np.testing.assert_array_equal(gpu.asnumpy(dev.keys()), cpu.keys())
    dev.insert(gpu.asarray(batches[0][:100]), gpu.arange(100))
    cpu.insert(batches[0][:100], np.arange(100))
    probe = rng.integers(-60_000, 60_000, 10_000, dtype=np.int64)
    np.testing.assert_array_equal(gpu.asnumpy(dev.lookup(gpu.asarray(probe))), cpu.lookup(probe))
    table = gpu.zeros((10, 3), gpu.float32)
    scatter_add_rows(table, gpu.asarray([2, 2, 9]), gpu.ones((3, 3), gpu.float32))
    assert gpu.asnumpy(table[2]).tolist() == [2, 2, 2]


@pytest.mark.gpu
def test_cuda_unique_and_row_moves_match_numpy(gpu):
    rng = np.random.default_rng(2)
    keys = np.concatenate([rng.integers(-1000, 1000, 50_000), np.array(EXTREMES * 10, np.int64)])
    for a, b in zip(unique(gpu.asarray(keys)), unique(keys)):
        np.testing.assert_array_equal(gpu.asnumpy(a), b)
    table = rng.standard_normal((1000, 8)).astype(np.float32)
    rows = rng.integers(0, 1000, 5000)
    np.testing.assert_array_equal(gpu.asnumpy(gather_rows(gpu.asarray(table), gpu.asarray(rows))), table[rows])
    target, dev = np.zeros_like(table), gpu.zeros(table.shape, gpu.float32)
    unique_rows = rng.permutation(1000)[:300]
    scatter_rows(target, unique_rows, table[:300])
    scatter_rows(dev, gpu.asarray(unique_rows), gpu.asarray(table[:300]))
    np.testing.assert_array_equal(gpu.asnumpy(dev), target)
