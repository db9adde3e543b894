"""The sparse gradients of replicated tables are gathered together (`all_gather_slices`): the rows
TensorFlow's own all-reduce of each gradient gives, in one gather of the lengths and one of the rows
with their indices per row width and dtype (rows of 8- and 16-bit types: one of the rows, one of the
indices)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from sok_tutorial.embedding.collectives import all_gather_slices
from tests.distribute import _graphs


def _gradients(replica: tf.Tensor, low: tf.DType = tf.float16) -> list[tf.IndexedSlices]:
    """Three gradients of replica-dependent lengths (one of them empty on replica 0): two of width 3
    in float32 with int64 and int32 indices, one of width 2 in the `low` precision."""
    r = tf.cast(replica, tf.int64)

    def slices(n: tf.Tensor, width: int, dtype: tf.DType, index_dtype: tf.DType, rows: int) -> tf.IndexedSlices:
        at = tf.range(n)
        values = tf.cast(r * 100 + at, tf.float32)[:, None] * tf.range(1.0, width + 1.0)[None]
        indices = tf.cast((r * 7 + at * 3) % rows, index_dtype)
        return tf.IndexedSlices(tf.cast(values, dtype), indices, tf.constant([rows, width], tf.int64))

    return [slices(r + 1, 3, tf.float32, tf.int64, 50), slices(2 * r, 3, tf.float32, tf.int32, 40),
            slices(tf.constant(1, tf.int64), 2, low, tf.int64, 30)]


@pytest.mark.parametrize("replicas", [2, 4])
def test_gathered_gradients_are_the_rows_tensorflows_all_reduce_gives(strategy_of, replicas):
    strategy = strategy_of(replicas)

    @tf.function
    def both():
        def each():
            context = tf.distribute.get_replica_context()
            gradients = _gradients(context.replica_id_in_sync_group)
            ours = all_gather_slices(context, gradients)
            theirs = context.all_reduce("SUM", gradients)
            return [(o.values, o.indices, t.values, t.indices) for o, t in zip(ours, theirs)]
        return strategy.run(each)

    results = both()
    for k, expected_rows in enumerate([sum(r + 1 for r in range(replicas)), sum(2 * r for r in range(replicas)),
                                       replicas]):
        for ours_v, ours_i, theirs_v, theirs_i in zip(*(strategy.experimental_local_results(results[k][j])
                                                        for j in range(4))):
            assert ours_v.shape[0] == expected_rows and ours_i.dtype == theirs_i.dtype
            assert ours_v.dtype == theirs_v.dtype
            np.testing.assert_array_equal(ours_i.numpy(), theirs_i.numpy())
            np.testing.assert_array_equal(tf.cast(ours_v, tf.float32).numpy(), tf.cast(theirs_v, tf.float32).numpy())


def test_the_collectives_do_not_grow_with_the_number_of_gradients(strategy_of):
    strategy = strategy_of(2)

    def collectives(gather, copies: int) -> int:
        def each():
            context = tf.distribute.get_replica_context()
            gradients = _gradients(context.replica_id_in_sync_group) * copies  # two row widths and dtypes
            return [g.values for g in gather(context, gradients)]
        return _graphs.collectives(tf.function(lambda: strategy.run(each)).get_concrete_function().graph)

    def each_on_its_own(context, gradients):
        return context.all_reduce("SUM", gradients)

    ours = [collectives(all_gather_slices, copies) for copies in (1, 3)]
    theirs = [collectives(each_on_its_own, copies) for copies in (1, 3)]
    assert ours[0] == ours[1] < theirs[0] < theirs[1]


def test_bfloat16_gradients_are_gathered_exactly(strategy_of):
    """TensorFlow's collectives on CPU carry no bfloat16 (its own all-reduce of such a gradient
    fails); the gather carries them as float32, which holds every bfloat16 exactly."""
    strategy = strategy_of(2)

    @tf.function
    def gathered():
        def each():
            context = tf.distribute.get_replica_context()
            low, wide = (all_gather_slices(context, _gradients(context.replica_id_in_sync_group, dtype))[2]
                         for dtype in (tf.bfloat16, tf.float32))
            return low.values, tf.cast(wide.values, tf.bfloat16), low.indices, wide.indices
        return strategy.run(each)

    low, wide, low_at, wide_at = (strategy.experimental_local_results(t)[1] for t in gathered())
    assert low.dtype == tf.bfloat16 and low.shape[0] == 2
    np.testing.assert_array_equal(low.numpy(), wide.numpy())
    np.testing.assert_array_equal(low_at.numpy(), wide_at.numpy())


def _wide(replica: tf.Tensor, dtype: tf.DType) -> tf.IndexedSlices:
    """Rows ``[2 + replica, 2, 2]`` of `dtype` with the values a carrier that did arithmetic would
    change (NaN, infinities, -0, a subnormal, extremes), and indices beyond 2**32."""
    r = tf.cast(replica, tf.int64)
    if dtype.is_floating:
        special = tf.constant([np.nan, np.inf, -np.inf, -0.0, np.finfo(dtype.as_numpy_dtype).tiny / 2,
                               np.finfo(dtype.as_numpy_dtype).max, -1.5, 3.0], dtype)
    else:
        special = tf.constant([dtype.min, dtype.max, -1, 0, 1, 2, -3, 1 << 20], dtype)
    n = 2 + r
    values = tf.reshape(tf.roll(tf.tile(special, [n]), tf.cast(r, tf.int32), 0)[:4 * n], tf.stack([n, 2, 2]))
    indices = (1 << 40) + r * 10 + tf.range(n)
    return tf.IndexedSlices(values, indices, tf.constant([1 << 41, 2, 2], tf.int64))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int64])
def test_rows_of_32_and_64_bit_numbers_travel_with_their_indices_in_one_gather(strategy_of, dtype):
    strategy = strategy_of(2)

    def each():
        context = tf.distribute.get_replica_context()
        g = _wide(context.replica_id_in_sync_group, dtype)
        (ours,), (theirs,) = all_gather_slices(context, [g]), context.all_reduce("SUM", [g])
        return ours.values, ours.indices, theirs.values, theirs.indices

    def ours_only():
        context = tf.distribute.get_replica_context()
        return all_gather_slices(context, [_wide(context.replica_id_in_sync_group, dtype)])[0].values

    step = tf.function(lambda: strategy.run(each))
    bits = tf.int64 if dtype.size == 8 else tf.int32
    for ours_v, ours_i, theirs_v, theirs_i in zip(*(strategy.experimental_local_results(t) for t in step())):
        assert ours_v.dtype == dtype and ours_v.shape == (5, 2, 2) and ours_i.dtype == tf.int64
        np.testing.assert_array_equal(tf.bitcast(ours_v, bits).numpy(), tf.bitcast(theirs_v, bits).numpy())
        np.testing.assert_array_equal(ours_i.numpy(), theirs_i.numpy())
    # the lengths' all-reduce and TensorFlow's gather of the rows and indices together (its length, its
    # contents): three collectives per replica, where a gather of the rows and one of the indices take five
    graph = tf.function(lambda: strategy.run(ours_only)).get_concrete_function().graph
    assert _graphs.collectives(graph) == 2 * 3
