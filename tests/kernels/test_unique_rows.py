from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels import rows
from kernels.unique import unique

int64s = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(int64s, max_size=60))
def test_unique_rebuilds_the_keys_and_counts_them(values):
    keys = np.array(values, np.int64)
    uniq, inverse, counts = unique(keys)
    assert uniq.tolist() == sorted(set(values))
    np.testing.assert_array_equal(uniq[inverse], keys)
    assert counts.tolist() == [values.count(v) for v in uniq.tolist()]
    assert inverse.dtype == counts.dtype == np.int64


def test_unique_refuses_2d_keys():
    with pytest.raises(ValueError, match=r"keys must be 1-D, got shape \(2, 2\)"):
        unique(np.zeros((2, 2), np.int64))


def test_row_moves_match_indexing_and_accumulate_duplicates():
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.testing.assert_array_equal(rows.gather_rows(table, np.array([5, 0, 5])), table[[5, 0, 5]])
    out = np.empty((2, 2), np.float32)
    assert rows.gather_rows(table, [1, 2], out=out) is out and out.tolist() == [[2, 3], [4, 5]]
    rows.scatter_add_rows(table, np.array([1, 1, 4]), np.ones((3, 2), np.float32))
    assert table[1].tolist() == [4, 5] and table[4].tolist() == [9, 10] and table[0].tolist() == [0, 1]
    rows.scatter_rows(table, np.array([0]), np.array([[-1, -2]], np.float32))
    assert table[0].tolist() == [-1, -2]


@pytest.mark.parametrize("move", ["gather_rows", "scatter_rows", "scatter_add_rows"])
@pytest.mark.parametrize("bad", [-1, 6])
def test_row_moves_refuse_rows_outside_the_table_before_writing(move, bad):
    table = np.zeros((6, 2), np.float32)
    args = (table, np.array([0, bad])) + (() if move == "gather_rows" else (np.ones((2, 2), np.float32),))
    with pytest.raises(IndexError, match=rf"{move}: row ids span \[{min(0, bad)}, {max(0, bad)}\] but the table has 6"):
        getattr(rows, move)(*args)
    assert not table.any()


@pytest.mark.gpu
def test_cupy_unique_and_row_moves_give_the_numpy_result(gpu):
    rng = np.random.default_rng(0)
    keys = np.concatenate([rng.integers(-(2**63), 2**63 - 1, 300_000, dtype=np.int64), rng.integers(0, 1000, 300_000)])
    for cpu, dev in zip(unique(keys), unique(gpu.asarray(keys))):
        assert isinstance(dev, gpu.ndarray) and dev.dtype == np.int64
        np.testing.assert_array_equal(gpu.asnumpy(dev), cpu)
    # small integers: sums come out exact in any order, so atomic adds must equal np.add.at bit for bit
    table = rng.integers(-100, 100, (100_000, 16)).astype(np.float32)
    picked = rng.integers(0, len(table), 200_000)  # duplicates: the adds must accumulate, not race
    updates = rng.integers(-8, 8, (len(picked), 16)).astype(np.float32)
    dev_table = gpu.asarray(table)
    np.testing.assert_array_equal(gpu.asnumpy(rows.gather_rows(dev_table, gpu.asarray(picked))), table[picked])
    rows.scatter_add_rows(table, picked, updates)
    rows.scatter_add_rows(dev_table, gpu.asarray(picked), gpu.asarray(updates))
    np.testing.assert_array_equal(gpu.asnumpy(dev_table), table)
    distinct = np.unique(picked)
    rows.scatter_rows(table, distinct, updates[: len(distinct)])
    rows.scatter_rows(dev_table, gpu.asarray(distinct), gpu.asarray(updates[: len(distinct)]))
    np.testing.assert_array_equal(gpu.asnumpy(dev_table), table)
    with pytest.raises(IndexError, match="scatter_add_rows: row ids span"):
        rows.scatter_add_rows(dev_table, gpu.asarray([0, len(table)]), gpu.ones((2, 16), np.float32))
