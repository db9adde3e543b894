"""Column-wise sharded tables in one process: equal to one device on 2 logical CPU replicas, a
replicated key index, full-width checkpoints re-sharded on restore (onto 1, 2 and 4 replicas),
memory, bad input. (Each replica count has its own collective keys, see ``strategy_of`` in
conftest; tests/distribute/test_grid_sharding.py trains on 4 in this process too.)"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.embedding import ShardedTable, exchange_bytes, replica_bytes
from sok_tutorial.embedding.ops import local_components
from sok_tutorial.training import load_checkpoint, save_checkpoint
from tests.distribute._small_model import DIM, small_data, small_model


def _fit(strategy, sharding: str, dynamic: bool, optimizer: str) -> tuple:
    model, layer, opt = small_model(strategy, sharding, dynamic, optimizer)
    x, y = small_data(dynamic)
    loss = model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False).history["loss"]
    return loss, layer.table.export(opt), layer, opt


@pytest.mark.parametrize("n,dynamic,optimizer", [(2, True, "adam"), (2, True, "sgd"), (2, False, "lazyadam")])
def test_column_sharded_table_trains_like_one_device(strategy_of, n, dynamic, optimizer):
    loss_1, rows_1, _, _ = _fit(strategy_of(1), "replicated", dynamic, optimizer)
    loss_n, rows_n, layer, _ = _fit(strategy_of(n), "column", dynamic, optimizer)
    assert isinstance(layer.table, ShardedTable) and layer.table.slices.widths == sok.column_slices(DIM, n)
    np.testing.assert_allclose(loss_n, loss_1, rtol=1e-5)
    order_1, order_n = np.argsort(rows_1["keys"]), np.argsort(rows_n["keys"])
    np.testing.assert_array_equal(rows_n["keys"][order_n], rows_1["keys"][order_1])
    assert sorted(rows_n) == sorted(rows_1) and ("slot_0" in rows_1) == (optimizer != "sgd")
    for name in ("vectors", "slot_0")[:len(rows_1) - 3]:
        np.testing.assert_allclose(rows_n[name][order_n], rows_1[name][order_1], atol=1e-5)
    assert np.abs(rows_1["vectors"]).max() > 0


def test_every_replica_holds_the_same_key_index_and_its_own_columns(strategy_of):
    _, _, layer, opt = _fit(strategy_of(2), "column", True, "adam")
    table = layer.table
    index = [table.index_variables(c) for c in range(len(table.local_shards))]  # each replica's index
    for name in ("slots", "row_keys", "size"):
        parts = [getattr(i, name).numpy() for i in index]
        for p in parts[1:]:
            np.testing.assert_array_equal(p, parts[0])
    shapes = {tuple(c.shape) for c in local_components(table.variable)}
    assert shapes == {(400, 3)} and table.size == int(index[0].size.numpy()) > 0
    held = local_components(table.variable)[1].numpy()
    assert np.abs(held[:table.size, :2]).min() > 0 and not held[:, 2].any()  # replica 1: 2 columns, 1 padding
    moments = table.optimizer_slots(opt)[0]
    assert {tuple(c.shape) for c in local_components(moments)} == {(400, 6)}  # m | v of the slice


def test_checkpoints_move_between_column_row_and_one_device(strategy_of, tmp_path):
    """Saved column-wise on 2 replicas; restored on one device, column-wise on 4 (read outside
    strategy.run: no collectives), row-wise on 2, and from there back to column-wise on 2."""
    saved, layer, opt = small_model(strategy_of(2), "column", optimizer="adam")
    x, y = small_data(True)
    saved.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    save_checkpoint(tmp_path / "column2", saved, opt)
    expected = layer.table.export(opt)
    probe = tf.constant(x[:8])
    for n, sharding in ((1, "replicated"), (4, "column"), (2, "row")):
        model, other, other_opt = small_model(strategy_of(n), sharding, optimizer="adam")
        load_checkpoint(tmp_path / "column2", model, other_opt)
        np.testing.assert_allclose(model(probe), saved(probe), atol=1e-6)
        rows = other.table.export(other_opt)
        order, want = np.argsort(rows["keys"]), np.argsort(expected["keys"])
        for name in ("keys", "vectors", "slot_0"):
            np.testing.assert_array_equal(rows[name][order], expected[name][want])
        if sharding == "row":  # and back: saved row-wise, restored column-wise
            save_checkpoint(tmp_path / "row2", model, other_opt)
            back, back_layer, back_opt = small_model(strategy_of(2), "column", optimizer="adam")
            load_checkpoint(tmp_path / "row2", back, back_opt)
            np.testing.assert_allclose(back(probe), saved(probe), atol=1e-6)
            np.testing.assert_array_equal(back_layer.table.export(back_opt)["slot_0"][np.argsort(
                back_layer.table.export(back_opt)["keys"])], expected["slot_0"][want])


def test_memory_and_exchange_of_a_column_sharded_table(strategy_of):
    with strategy_of(4).scope():
        static = sok.DistributedEmbedding("sum", 1000, 10, slot_num=1, max_nnz=1, sharding="column",
                                          use_hashtable=False)
        static.build()
    assert static.table.slices.widths == [3, 3, 2, 2] and static.capacity == 1000
    assert replica_bytes([static]) == 1000 * 3 * 4  # capacity x ceil(d / N) x 4
    n, k, d = 4, 1000, 10
    assert exchange_bytes("column", n, k, d) == 2 * (n - 1) * 8 + (n - 1) * k * 8 + (n - 1) * n * k * 3 * 4 \
        + (n - 1) * k * d * 4
    assert exchange_bytes("column", n, k, d, "all_reduce") == \
        2 * (n - 1) * 8 + (n - 1) * k * 8 + 3 * (n - 1) * k * d * 4


def test_bad_column_sharding_inputs(strategy_of):
    with strategy_of(4).scope():
        narrow = sok.DistributedEmbedding("sum", 10, 3, slot_num=1, max_nnz=1, sharding="column", name="narrow")
        with pytest.raises(ValueError, match="narrow: dim=3 is smaller than num_replicas=4"):
            narrow.build()
    with pytest.raises(ValueError, match="'column'"):
        sok.DistributedEmbedding("sum", 10, 2, slot_num=1, max_nnz=1, sharding="columns")
    with strategy_of(2).scope():
        rowwise = sok.DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, sharding="column", name="rw")
        rowwise.build()
        opt = sok.optimizers.RowWiseAdagrad(0.1)
        with pytest.raises(ValueError, match="rw: RowWiseAdagrad keeps one value per row of all columns"):
            opt.build([rowwise.embedding_variable])  # refused before a step could train it wrongly
        assert not opt.built
