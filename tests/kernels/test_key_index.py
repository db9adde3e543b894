from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels.key_index import DENSE_FACTOR, KeyIndex

LOW, HIGH = -(2**63), 2**63 - 1
# Extremes and their neighbours are drawn often, so both ends of the binary search and of the
# dense table's span are probed.
EDGES = [LOW, LOW + 1, -1, 0, 1, HIGH - 1, HIGH]
int64s = st.one_of(st.sampled_from(EDGES), st.integers(-50, 50), st.integers(LOW, HIGH))


def both_paths(index: KeyIndex) -> list[KeyIndex]:
    """The index as built, and a copy forced onto the binary search."""
    sparse = KeyIndex(index.keys, index.ids)
    sparse._table = False
    return [index, sparse]


@given(st.lists(int64s, unique=True, max_size=40), st.data())
def test_matches_a_dict(keys, data):
    ids = data.draw(st.one_of(st.none(), st.lists(st.integers(0, 2**40), min_size=len(keys), max_size=len(keys))))
    queries = data.draw(st.lists(st.one_of(st.sampled_from(keys) if keys else int64s, int64s), max_size=60))
    default = data.draw(st.sampled_from([-1, 0, 7]))
    reference = dict(zip(keys, range(len(keys)) if ids is None else ids))
    for index in both_paths(KeyIndex(np.array(keys, np.int64), None if ids is None else np.array(ids))):
        got = index.lookup(np.array(queries, dtype=np.int64), default)
        assert got.dtype == np.int64 and got.shape == (len(queries),)
        assert got.tolist() == [reference.get(q, default) for q in queries]
        assert index.contains(np.array(queries, np.int64)).tolist() == [q in reference for q in queries]
    assert index.keys.tolist() == sorted(keys)


@given(st.lists(st.lists(int64s, unique=True, max_size=15), max_size=5))
def test_inserts_match_a_dict_and_leave_the_old_index_alone(batches):
    index, reference, snapshots = KeyIndex(np.zeros(0, np.int64)), {}, []
    for batch in batches:
        new = [k for k in batch if k not in reference]
        ids = [len(reference) + i for i in range(len(new))]
        snapshots.append((index, dict(reference)))
        index = index.insert(np.array(new, np.int64), np.array(ids, np.int64))
        reference.update(zip(new, ids))
    probe = np.array(sorted(set(reference) | set(EDGES)), np.int64)
    assert index.lookup(probe).tolist() == [reference.get(k, -1) for k in probe.tolist()]
    for old, then in snapshots:  # insert returns a new index; the old one answers as before
        assert old.lookup(probe).tolist() == [then.get(k, -1) for k in probe.tolist()]


def test_dense_and_sparse_paths_on_typical_keysets():
    rng = np.random.default_rng(1)
    extremes = np.array(EDGES, np.int64)
    for keys in (np.unique(rng.integers(0, 10_000, 3000)), np.unique(rng.integers(-50, 50, 40)),
                 np.unique(np.concatenate([extremes, rng.integers(-10**6, 10**6, 100)])), np.array([5]),
                 np.zeros(0, np.int64)):
        queries = np.concatenate([keys, rng.integers(-20_000, 20_000, 500), extremes]).reshape(1, -1)
        dense, sparse = both_paths(KeyIndex(keys))
        expected = np.array([np.searchsorted(keys, q) if q in set(keys.tolist()) else -1 for q in queries.ravel()])
        np.testing.assert_array_equal(dense.lookup(queries), expected.reshape(queries.shape))
        np.testing.assert_array_equal(sparse.lookup(queries), expected.reshape(queries.shape))
    narrow = KeyIndex(np.arange(0, 1000 * DENSE_FACTOR, DENSE_FACTOR))
    wide = KeyIndex(np.array([LOW, 0, HIGH]))
    assert narrow._dense() is not None and wide._dense() is None  # the span decides the path


def test_keeps_the_shape_of_values_and_handles_empty_input():
    index = KeyIndex(np.array([3, 1, 2]), ids=np.array([30, 10, 20]))
    assert index.lookup(np.array([[1, 9], [3, 2]])).tolist() == [[10, -1], [30, 20]]
    assert index.lookup(np.zeros((2, 0), np.int64)).shape == (2, 0)
    assert KeyIndex(np.zeros(0, np.int64)).lookup(np.array([LOW, HIGH]), 4).tolist() == [4, 4]
    assert index.insert(np.zeros(0, np.int64), np.zeros(0, np.int64)) is index


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="distinct; e.g. 3 repeats"):
        KeyIndex(np.array([3, 1, 3]))
    with pytest.raises(ValueError, match="ids has 2 entries but keys has 3"):
        KeyIndex(np.array([3, 1, 2]), ids=np.array([0, 1]))
    with pytest.raises(TypeError, match="keys must hold integer keys, got dtype float64"):
        KeyIndex(np.array([1.5]))
    index = KeyIndex(np.array([1, 2]))
    with pytest.raises(TypeError, match="values must be integer keys, got dtype float32"):
        index.lookup(np.array([1.0], np.float32))
    with pytest.raises(ValueError, match="already in the index"):
        index.insert(np.array([2, 5]), np.array([7, 8]))


@pytest.mark.gpu
def test_cuda_matches_numpy(gpu):
    rng = np.random.default_rng(0)
    sparse_keys = np.unique(np.concatenate([rng.integers(LOW, HIGH, 200_000, dtype=np.int64), EDGES]))
    dense_keys = np.unique(rng.integers(0, 3_000_000, 100_000))
    for keys in (sparse_keys, dense_keys):
        ids = rng.permutation(len(keys)).astype(np.int64) + 1
        values = np.concatenate([rng.choice(keys, 500_000), rng.integers(LOW, HIGH, 500_003, dtype=np.int64),
                                 rng.integers(-10, 3_000_010, 1000), np.array(EDGES, np.int64)])
        cpu, dev = KeyIndex(keys, ids), KeyIndex(gpu.asarray(keys), gpu.asarray(ids))
        for default in (-1, 0):
            got = dev.lookup(gpu.asarray(values), default)
            assert isinstance(got, gpu.ndarray) and got.dtype == np.int64
            np.testing.assert_array_equal(gpu.asnumpy(got), cpu.lookup(values, default))
        new = np.setdiff1d(rng.integers(-10**6, 10**6, 1000), keys)
        grown_cpu, grown_dev = cpu.insert(new, np.arange(len(new))), dev.insert(gpu.asarray(new), gpu.arange(len(new)))
        np.testing.assert_array_equal(gpu.asnumpy(grown_dev.keys), grown_cpu.keys)
        np.testing.assert_array_equal(gpu.asnumpy(grown_dev.lookup(gpu.asarray(values))), grown_cpu.lookup(values))
