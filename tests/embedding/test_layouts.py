"""Layout objects: the five sharding names map to three layouts, which agree with what the sharded
tables build and with the bytes the planner and `exchange_bytes` report."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.embedding.layouts import Grid, Replicated, TableWise, layout_of  # noqa: E402
from sok_tutorial.embedding.placement import exchange_bytes  # noqa: E402


def test_the_five_shardings_are_three_layouts():
    assert isinstance(layout_of("replicated", 4), Replicated) and isinstance(layout_of("table", 4), TableWise)
    row, column, grid = (layout_of(s, 4, dim=6) for s in ("row", "column", "row_column"))
    assert (row.rows, row.columns) == (4, 1) and (column.rows, column.columns) == (1, 4)
    assert (grid.rows, grid.columns) == sok.grid_shape(4, 6) == (2, 2)
    assert (layout_of("row_column", 4, dim=6, column_shards=1).rows, column.widths(6)) == (4, [2, 2, 1, 1])
    assert row.rows_per_replica(1001) == 251 and column.rows_per_replica(1001) == 1001 and grid.width(6) == 3


@pytest.mark.parametrize("sharding", ["replicated", "row", "table", "column", "row_column"])
@pytest.mark.parametrize("exchange", ["all_gather", "all_reduce"])
def test_a_layout_counts_the_bytes_its_table_exchanges(sharding, exchange):
    layout = layout_of(sharding, 4, dim=16)
    assert layout.exchange_bytes(1000, 16, exchange) == exchange_bytes(sharding, 4, 1000, 16, exchange) > 0
    assert layout_of(sharding, 1, dim=16).exchange_bytes(1000, 16, exchange) == 0


@pytest.mark.parametrize("sharding", ["row", "column", "row_column"])
def test_a_grid_is_what_the_sharded_table_builds(strategy_of, sharding):
    strategy = strategy_of(4)
    with strategy.scope():
        layer = sok.DistributedEmbedding("sum", 96, 6, slot_num=1, max_nnz=1, sharding=sharding, name=f"l_{sharding}")
        layer.build()
    layout = layer.table.layout
    expected = layout_of(sharding, 4, dim=6)
    assert (layout.rows, layout.columns) == (expected.rows, expected.columns)
    for component in strategy.experimental_local_results(layer.table.variable.value):
        assert tuple(component.shape) == (96, layout.width(6))  # rows per replica as given, the widest slice


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="a grid of 3 x 1 is not num_replicas=4"):
        Grid(4, 3, 1)
    with pytest.raises(ValueError, match="column_shards=2 is for sharding='row_column', not sharding='row'"):
        layout_of("row", 4, column_shards=2)
    with pytest.raises(ValueError, match="sharding"):
        layout_of("diagonal", 4)
    assert "narrower" in layout_of("column", 4, dim=2).refuses(100, 2)
    assert "mixes the columns" in layout_of("column", 2, dim=8).refuses(100, 8, splits_by_column=False)
    assert layout_of("row", 2, dim=8).refuses(100, 8, splits_by_column=False) is None


def test_a_layout_says_which_replica_holds_a_key():
    keys = tf.constant([0, 1, 2, 3, 10, 11], tf.int64)
    assert layout_of("row", 4, dim=8).group_of(keys).numpy().tolist() == [0, 1, 2, 3, 2, 3]
    assert layout_of("row_column", 4, dim=8).group_of(keys).numpy().tolist() == [0, 1, 0, 1, 0, 1]  # 2 x 2
    assert layout_of("column", 4, dim=8).group_of_np(keys.numpy()).tolist() == [0] * 6  # one row group
    table_wise = layout_of("table", 2, slot_sizes=[100, 10, 60, 50])
    assert table_wise.group_of(None, tf.constant([0, 1, 2, 3], tf.int64)).numpy().tolist() == [0, 0, 1, 1]
    assert table_wise.group_of_np(None, np.array([3, 2])).tolist() == [1, 1]


class _Mirrored(Grid):
    """A layout the library does not ship: key ``k`` on replica ``N - 1 - (k mod N)``."""

    def group_of(self, keys, slots=None, buckets=None):
        return self.rows - 1 - tf.math.floormod(keys, self.rows)

    def group_of_np(self, keys, slots=None, buckets=None):
        return self.rows - 1 - np.mod(keys, self.rows)


def test_a_new_layout_is_all_a_sharded_table_needs(strategy_of, monkeypatch):
    """What a new module in `layouts` does (its SHARDINGS entry), and nothing else: the table
    composes it, trains like one device and exports where the layout says."""
    from sok_tutorial.embedding import layouts
    from sok_tutorial.embedding.sharding import ShardedTable
    from sok_tutorial.embedding.table import EmbeddingTable

    monkeypatch.setitem(layouts.LAYOUTS, "mirrored", lambda n, dim, column_shards, slot_sizes: _Mirrored(n, n, 1))
    strategy = strategy_of(2)
    batches = [tf.constant([[3, 8, 3, 11], [8, 20, 5, 2]], tf.int64), tf.constant([[5, 6, 7, 3], [20, 1, 1, 9]])]
    weights = tf.reshape(tf.range(16, dtype=tf.float32), [4, 4]) / 16
    with strategy.scope():
        sharded = ShardedTable(16, 4, sharding="mirrored", name="mirrored")
        sharded.build()
        sharded_opt = sok.optimizers.SGD(0.5)
    one, one_opt = EmbeddingTable(32, 4, name="one"), sok.optimizers.SGD(0.5)
    one.build()

    def step(table, opt, keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table(keys, training=True) * weights)
        opt.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])
        return loss

    for batch in batches:
        parts = strategy.experimental_distribute_values_from_function(
            lambda ctx, b=batch: b[ctx.replica_id_in_sync_group])
        losses = strategy.experimental_local_results(strategy.run(step, args=(sharded, sharded_opt, parts)))
        assert abs(sum(float(x) for x in losses) - float(step(one, one_opt, batch))) < 1e-5
    got, want = sharded.export(), one.export()
    order, expected = np.argsort(got["keys"]), np.argsort(want["keys"])
    np.testing.assert_array_equal(got["keys"][order], want["keys"][expected])
    np.testing.assert_allclose(got["vectors"][order], want["vectors"][expected], atol=1e-6)
    np.testing.assert_array_equal(got["shard"], 1 - got["keys"] % 2)  # where the new layout put each key
