"""The gathers every sharded table's step makes (`all_gather`, `gather_counts`): the rows and counts
TensorFlow's own ``all_gather`` gives, for every dtype a table exchanges and lengths that differ by
replica or are all zero; the lengths by one all-reduce, in fewer ops than TensorFlow's gather."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from sok_tutorial.embedding.collectives import all_gather, gather_counts
from tests.distribute import _graphs

EXTREMES = {tf.int64: [-2**63, 2**63 - 1, -1], tf.uint64: np.array([2**64 - 1, 2**63, 1], np.uint64),
            tf.int32: [-2**31, 2**31 - 1, 7], tf.bool: [True, False, True], tf.float32: [np.inf, -3.4e38, np.nan],
            tf.bfloat16: [1.5, -2.0**-120, 3e38], tf.float16: [65504.0, -2.0**-24, 0.5]}


def _values(replica: tf.Tensor, dtype: tf.DType, width: int | None) -> tf.Tensor:
    """Replica r's rows: 2 * r of them (none on replica 0), the dtype's extremes among them."""
    r = tf.cast(replica, tf.int64)
    n = 2 * r
    base = tf.constant(EXTREMES[dtype], dtype)
    rows = tf.gather(base, tf.range(n) % 3)
    if dtype not in (tf.bool,):  # and something that tells the replicas apart (exact in every dtype here)
        rows = tf.where(tf.range(n) % 3 == 2, tf.cast(r + 1, dtype) if dtype != tf.float32 else rows, rows)
    return rows if width is None else tf.tile(rows[:, None], [1, width])


@pytest.mark.parametrize("replicas", [pytest.param(2, marks=pytest.mark.slow), 4])
def test_all_gather_gives_tensorflows_rows(strategy_of, replicas):
    """Every dtype in EXTREMES, as vectors and as rows of 3, in one traced step: every replica's rows
    in replica order, as TensorFlow's all_gather gives them (made here on the host, so the step
    traces only ours)."""
    strategy = strategy_of(replicas)
    cases = [(dtype, width) for dtype in EXTREMES for width in (None, 3)]

    @tf.function
    def gathered():
        def each():
            context = tf.distribute.get_replica_context()
            return [all_gather(context, _values(context.replica_id_in_sync_group, dtype, width))
                    for dtype, width in cases]
        return strategy.run(each)

    rows = sum(2 * r for r in range(replicas))
    for (dtype, width), ours in zip(cases, gathered()):
        expected = np.concatenate([_values(tf.constant(r), dtype, width).numpy() for r in range(replicas)])
        for o in strategy.experimental_local_results(ours):
            assert o.dtype == dtype and o.shape == (rows,) + (() if width is None else (width,))
            np.testing.assert_array_equal(o.numpy(), expected)  # (NaN equals NaN here)


def test_every_replica_empty_gives_nothing_with_the_row_shape(strategy_of):
    strategy = strategy_of(4)

    @tf.function
    def gathered():
        return strategy.run(lambda: all_gather(tf.distribute.get_replica_context(), tf.zeros([0, 5], tf.float32)))

    assert all(t.shape == (0, 5) for t in strategy.experimental_local_results(gathered()))


def test_given_sizes_and_counts_are_replica_major(strategy_of):
    strategy = strategy_of(4)

    @tf.function
    def gathered():
        def each():
            context = tf.distribute.get_replica_context()
            r = tf.cast(context.replica_id_in_sync_group, tf.int64)
            counts = gather_counts(context, tf.stack([r, 10 + r]))
            keys = tf.range(r) + 100 * r
            return counts, all_gather(context, keys, tf.reshape(counts, [4, 2])[:, 0])
        return strategy.run(each)

    counts, keys = (strategy.experimental_local_results(t)[3].numpy().tolist() for t in gathered())
    assert counts == [0, 10, 1, 11, 2, 12, 3, 13]
    assert keys == [100, 200, 201, 300, 301, 302]


def test_the_counts_take_one_collective_and_fewer_ops_than_tensorflows_gather(strategy_of):
    """TensorFlow's all_gather of a tensor whose length is not known while tracing (a count's is
    known; the gather does not know it) gathers the lengths itself, then the values, and builds
    about a hundred ops per replica; a table's step gathers its counts before its keys and rows."""
    strategy = strategy_of(4)

    def graph(gather) -> tf.Graph:
        def each():
            context = tf.distribute.get_replica_context()
            keys = tf.range(tf.cast(context.replica_id_in_sync_group, tf.int64) + 3)
            return gather(context, tf.shape(keys, out_type=tf.int64)[:1])
        return tf.function(lambda: strategy.run(each)).get_concrete_function().graph

    ours, theirs = graph(gather_counts), graph(lambda context, counts: context.all_gather(counts, 0))
    assert _graphs.collectives(ours) == 4 and _graphs.collectives(theirs) >= 4
    assert 2 * len(_graphs.op_types(ours)) < len(_graphs.op_types(theirs))
