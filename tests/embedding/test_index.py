from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

tf = pytest.importorskip("tensorflow")

from sok_tutorial.embedding.index import (  # noqa: E402
    IndexVariables,
    VocabularyExhausted,
    home_slots,
    lookup,
    lookup_or_insert,
    num_slots,
)

LOW, HIGH = -(2**63), 2**63 - 1
int64s = st.one_of(st.sampled_from([LOW, LOW + 1, -1, 0, 1, HIGH - 1, HIGH]), st.integers(-40, 40),
                   st.integers(LOW, HIGH))


def _check_layout(index: IndexVariables) -> None:
    """Every key in use sits in one slot beside its row, reachable from its home slot without crossing
    an empty one."""
    slots, row_keys, size = index.slots.numpy(), index.row_keys.numpy(), int(index.size.numpy())
    slot_keys, slot_rows = slots[:, 0], slots[:, 1]
    occupied = np.flatnonzero(slot_rows >= 0)
    assert sorted(slot_rows[occupied].tolist()) == list(range(size))
    np.testing.assert_array_equal(slot_keys[occupied], row_keys[slot_rows[occupied]])  # the key beside its row
    homes = home_slots(tf.constant(slot_keys[occupied]), index.bits).numpy()
    for slot, home in zip(occupied, homes):
        path = np.arange(home, home + (slot - home) % len(slot_rows)) % len(slot_rows)
        assert (slot_rows[path] >= 0).all()


@given(st.lists(st.lists(int64s, unique=True, max_size=30), max_size=6))
def test_lookup_or_insert_matches_a_dict(batches):
    """Eager calls (the same ops as in a graph, without tracing a function per example)."""
    index, reference = IndexVariables.create(capacity=200), {}
    for batch in batches:
        rows, new_keys, new_rows = lookup_or_insert(index, tf.constant(batch, tf.int64), 200, "t")
        fresh = [k for k in batch if k not in reference]
        assert new_keys.numpy().tolist() == fresh
        assert new_rows.numpy().tolist() == list(range(len(reference), len(reference) + len(fresh)))
        reference.update(zip(fresh, new_rows.numpy().tolist()))
        assert rows.numpy().tolist() == [reference[k] for k in batch]
    probe = sorted(set(reference) | {LOW, 0, HIGH, 12345})
    found, _ = lookup(index, tf.constant(probe, tf.int64))
    assert found.numpy().tolist() == [reference.get(k, -1) for k in probe]
    assert int(index.size.numpy()) == len(reference)
    _check_layout(index)


def test_a_crowded_index_places_colliding_keys():
    """A table of 64 rows filled to the last row: long probe runs and many claims on one slot."""
    index = IndexVariables.create(capacity=64)
    keys = np.random.default_rng(0).integers(LOW, HIGH, 64, dtype=np.int64)
    for part in np.array_split(keys, 3):
        lookup_or_insert(index, tf.constant(part), 64, "t")
    rows, _ = lookup(index, tf.constant(keys))
    assert rows.numpy().tolist() == list(range(64)) and num_slots(64) == 128
    _check_layout(index)


def test_lookups_stop_where_linear_probing_does():
    """Each key's slot, held or the empty one it would take, is the first slot from its home that
    holds it or is empty, also at the end of long runs of full slots."""
    index = IndexVariables.create(capacity=64)
    lookup_or_insert(index, tf.constant(np.random.default_rng(1).integers(LOW, HIGH, 64, dtype=np.int64)), 64, "t")
    slots = index.slots.numpy()
    asked = np.r_[slots[slots[:, 1] >= 0, 0], np.random.default_rng(2).integers(LOW, HIGH, 200, dtype=np.int64)]
    rows, at = lookup(index, tf.constant(asked))
    expected_at, steps = [], []
    for key, home in zip(asked, home_slots(tf.constant(asked), index.bits).numpy()):
        slot = int(home)
        while slots[slot, 1] >= 0 and slots[slot, 0] != key:
            slot = (slot + 1) % len(slots)
        expected_at.append(slot)
        steps.append((slot - home) % len(slots))
    assert at.numpy().tolist() == expected_at
    assert rows.numpy().tolist() == [int(slots[s, 1]) if slots[s, 1] >= 0 else -1 for s in expected_at]
    assert max(steps) > 8  # long runs were met


def test_a_full_table_refuses_new_keys_and_writes_nothing():
    index = IndexVariables.create(capacity=3)
    lookup_or_insert(index, tf.constant([5, 6], tf.int64), 3, "items")
    before = [v.numpy().copy() for v in (index.slots, index.row_keys, index.size)]
    with pytest.raises(VocabularyExhausted, match="items: vocabulary exhausted: 4 distinct keys need rows but "
                                                  r"max_vocabulary_size_per_gpu=3 \(2 held, 2 new in this batch\)"):
        lookup_or_insert(index, tf.constant([5, 7, 8], tf.int64), 3, "items")
    graph = tf.function(lambda k: lookup_or_insert(index, k, 3, "items"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="4 distinct keys need rows"):
        graph(tf.constant([7, 8], tf.int64))
    for v, b in zip((index.slots, index.row_keys, index.size), before):
        np.testing.assert_array_equal(v.numpy(), b)
    assert issubclass(VocabularyExhausted, tf.errors.InvalidArgumentError)
    rows, new_keys, _ = graph(tf.constant([6, 7], tf.int64))  # one more key still fits
    assert rows.numpy().tolist() == [1, 2] and new_keys.numpy().tolist() == [7]


def test_empty_batches_and_no_python_in_the_graph():
    index = IndexVariables.create(capacity=8)
    fn = tf.function(lambda k: lookup_or_insert(index, k, 8, "t"))
    rows, new_keys, _ = fn(tf.zeros([0], tf.int64))
    assert rows.shape == (0,) and new_keys.shape == (0,) and int(index.size.numpy()) == 0
    graph = fn.get_concrete_function(tf.TensorSpec([None], tf.int64)).graph
    ops = {op.type for op in graph.get_operations()}
    for f in graph._functions.values():
        ops |= {node.op for node in f.definition.node_def}
    assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc"} and "ResourceScatterUpdate" in ops


def test_keras_weights_of_the_earlier_index_format_load_with_each_key_beside_its_row(tmp_path):
    """Weights saved when a slot held only its row (``slot_rows`` ``[S]``) load into ``[S, 2]`` slots."""
    import h5py
    import keras

    from sok_tutorial.embedding import EmbeddingTable

    def model() -> keras.Model:
        return keras.Sequential([keras.Input((1,), dtype="int64"), EmbeddingTable(100, 2, name="items")])

    saved = model()
    keys = tf.constant([[5], [-3], [2**63 - 1], [-2**63], [0]], tf.int64)
    vectors = saved.layers[0](keys, training=True).numpy()
    saved.save_weights(tmp_path / "w.weights.h5")
    with h5py.File(tmp_path / "w.weights.h5", "r+") as f:  # the earlier format: the row of each slot only
        group = next(g for g in f["layers"].values() if "vars" in g)["vars"]
        slots = group["1"][...]
        del group["1"]
        group["1"] = slots[:, 1]
    loaded = model()
    loaded.load_weights(tmp_path / "w.weights.h5")
    table = loaded.layers[0]
    np.testing.assert_array_equal(table.index_variables().slots.numpy(), slots)
    _check_layout(table.index_variables())
    np.testing.assert_array_equal(table(keys).numpy(), vectors)
    rows, new_keys, _ = lookup_or_insert(table.index_variables(), tf.constant([7, 5], tf.int64), 100, "items")
    assert rows.numpy().tolist() == [5, 0] and new_keys.numpy().tolist() == [7]
