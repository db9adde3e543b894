from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels import ragged

rows_strategy = st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6), min_size=1, max_size=40)


def _csr(rows):
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    return values, ragged.lengths_to_offsets(np.array([len(r) for r in rows], dtype=np.int64))


def _rows(values, offsets):
    return [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


@given(rows_strategy, st.data())
def test_take_matches_list_indexing(rows, data):
    pick = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=60))
    values, offsets = _csr(rows)
    got = ragged.take(values, offsets, np.array(pick, dtype=np.int64))
    assert _rows(*got) == [rows[i] for i in pick]


@given(rows_strategy, st.integers(1, 7))
def test_dense_truncate_slice_concat(rows, width):
    values, offsets = _csr(rows)
    cut = ragged.truncate(values, offsets, width)
    assert _rows(*cut) == [r[:width] for r in rows]
    dense = ragged.to_dense(*cut, width=width, pad=-7)
    assert dense.tolist() == [r[:width] + [-7] * (width - len(r[:width])) for r in rows]
    mid = len(rows) // 2
    a, b = ragged.slice_rows(values, offsets, 0, mid), ragged.slice_rows(values, offsets, mid, len(rows))
    assert _rows(*ragged.concat([a, b])) == rows


def test_to_dense_refuses_rows_longer_than_width():
    values, offsets = _csr([[1, 2, 3], [4]])
    with pytest.raises(ValueError, match="3 values, more than width=2"):
        ragged.to_dense(values, offsets, 2)


@pytest.mark.gpu
def test_cupy_arrays_give_the_numpy_result(gpu):
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 5, 10_000)
    offsets = ragged.lengths_to_offsets(lengths)
    values = rng.integers(0, 1000, int(offsets[-1]))
    pick = rng.permutation(10_000)
    cpu = ragged.take(values, offsets, pick)
    dev = ragged.take(gpu.asarray(values), gpu.asarray(offsets), gpu.asarray(pick))
    assert isinstance(dev[0], gpu.ndarray)
    np.testing.assert_array_equal(gpu.asnumpy(dev[0]), cpu[0])
    np.testing.assert_array_equal(gpu.asnumpy(dev[1]), cpu[1])
