"""Row x column ("grid") sharded tables in one process, on 4 logical CPU replicas: equal to one
device as 2 x 2, 4 x 1 and 1 x 4 grids; the replicas of a row group share a key index; full-width
checkpoints move between the grid, one device and column-wise tables; memory, bytes exchanged,
bad input. (Each replica count has its own collective keys: see ``strategy_of`` in conftest.)"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.embedding import ShardedTable, exchange_bytes, replica_bytes
from sok_tutorial.embedding.ops import local_components
from sok_tutorial.training import load_checkpoint, save_checkpoint
from tests.distribute._small_model import DIM, ROWS, small_data, small_model

_FITS: dict = {}


def _fit(strategy, sharding: str, dynamic: bool = True, optimizer: str = "adam", **kwargs) -> tuple:
    """(losses, exported rows, model, layer, optimizer) of two epochs, memoized: tests share
    trainings (and must not train them further)."""
    kwargs = {k: v for k, v in kwargs.items() if (k, v) != ("exchange", "all_gather")}  # the default
    key = (strategy.num_replicas_in_sync, sharding, dynamic, optimizer, tuple(sorted(kwargs.items())))
    if key not in _FITS:
        model, layer, opt = small_model(strategy, sharding, dynamic, optimizer, **kwargs)
        x, y = small_data(dynamic)
        loss = model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False).history["loss"]
        _FITS[key] = loss, layer.table.export(opt), model, layer, opt
    return _FITS[key]


def _assert_same_rows(got: dict, want: dict, atol: float = 1e-5) -> None:
    order, expected = np.argsort(got["keys"]), np.argsort(want["keys"])
    assert sorted(got) == sorted(want)
    np.testing.assert_array_equal(got["keys"][order], want["keys"][expected])
    for name in [k for k in want if k == "vectors" or k.startswith("slot_")]:
        np.testing.assert_allclose(got[name][order], want[name][expected], atol=atol)


@pytest.mark.parametrize("dynamic,optimizer,exchange", [(True, "adam", "all_gather"), (True, "sgd", "all_reduce"),
                                                        (False, "lazyadam", "all_gather")])
def test_a_2x2_grid_trains_like_one_device(strategy_of, dynamic, optimizer, exchange):
    loss_1, rows_1, *_ = _fit(strategy_of(1), "replicated", dynamic, optimizer)
    loss_4, rows_4, _, layer, _ = _fit(strategy_of(4), "row_column", dynamic, optimizer, exchange=exchange)
    table = layer.table
    assert isinstance(table, ShardedTable) and table.layout.columns == 2 and table.slices.widths == [3, 2]
    assert layer.capacity == ROWS and table.size == len(rows_1["keys"])
    np.testing.assert_allclose(loss_4, loss_1, rtol=1e-5)
    _assert_same_rows(rows_4, rows_1)
    assert np.abs(rows_1["vectors"]).max() > 0 and ("slot_0" in rows_1) == (optimizer != "sgd")


@pytest.mark.parametrize("column_shards,like", [(4, "column"), (1, "row")])
def test_grids_of_one_row_group_or_one_column_group_train_like_column_and_row(strategy_of, column_shards, like):
    loss_1, rows_1, *_ = _fit(strategy_of(1), "replicated")
    loss_4, rows_4, _, layer, _ = _fit(strategy_of(4), "row_column", column_shards=column_shards)
    assert (layer.table.layout.rows, layer.table.layout.columns) == (4 // column_shards, column_shards)
    assert layer.table.slices.widths == (sok.column_slices(DIM, 4) if like == "column" else [DIM])
    np.testing.assert_allclose(loss_4, loss_1, rtol=1e-5)
    _assert_same_rows(rows_4, rows_1)


def test_the_replicas_of_a_row_group_share_a_key_index_and_hold_their_columns(strategy_of):
    *_, layer, opt = _fit(strategy_of(4), "row_column")
    table = layer.table
    replicas = [table.index_variables(c) for c in range(len(table.local_shards))]
    index = [[getattr(i, name).numpy() for i in replicas] for name in ("slots", "row_keys", "size")]
    for parts in index:
        np.testing.assert_array_equal(parts[0], parts[1])  # row group 0: replicas 0 and 1
        np.testing.assert_array_equal(parts[2], parts[3])  # row group 1: replicas 2 and 3
    sizes = index[2]
    held = [keys[:int(size)] for keys, size in zip(index[1], sizes)]
    assert set(held[0] % 2) == {0} and set(held[2] % 2) == {1} and int(sizes[0]) + int(sizes[2]) == table.size
    assert {tuple(c.shape) for c in local_components(table.variable)} == {(ROWS // 2, 3)}
    replica_1 = local_components(table.variable)[1].numpy()  # columns 3 and 4, then padding
    assert np.abs(replica_1[:int(sizes[1]), :2]).min() > 0 and not replica_1[:, 2].any()
    moments = table.optimizer_slots(opt)[0]
    assert {tuple(c.shape) for c in local_components(moments)} == {(ROWS // 2, 6)}  # m | v of the slice


def test_checkpoints_move_between_the_grid_one_device_and_column(strategy_of, tmp_path):
    """A 2 x 2 grid saved and restored on one device; the one-device checkpoint restored onto a
    fresh grid and onto a column-wise table on 2 replicas (read outside strategy.run)."""
    _, expected, saved, _, opt = _fit(strategy_of(4), "row_column")
    save_checkpoint(tmp_path / "grid", saved, opt)
    probe = tf.constant(small_data(True)[0][:8])
    one, one_layer, one_opt = small_model(strategy_of(1), "replicated")
    load_checkpoint(tmp_path / "grid", one, one_opt)
    np.testing.assert_allclose(one(probe), saved(probe), atol=1e-6)
    _assert_same_rows(one_layer.table.export(one_opt), expected, atol=0)
    save_checkpoint(tmp_path / "one", one, one_opt)
    for n, sharding in ((4, "row_column"), (2, "column")):
        model, other, other_opt = small_model(strategy_of(n), sharding)
        load_checkpoint(tmp_path / "one", model, other_opt)
        np.testing.assert_allclose(model(probe), saved(probe), atol=1e-6)
        _assert_same_rows(other.table.export(other_opt), expected, atol=0)


def test_a_static_grid_restores_its_own_rows(strategy_of):
    _, rows, *_ = _fit(strategy_of(4), "row_column", False, "lazyadam")
    _, layer, opt = small_model(strategy_of(4), "row_column", False, "lazyadam")
    layer.table.restore(rows, opt)
    _assert_same_rows(layer.table.export(opt), rows, atol=0)
    with pytest.raises(ValueError, match=r"emb: keys span \[0, 400\] but the table holds row ids \[0, 400\)"):
        layer.table.restore({"keys": np.array([0, ROWS]), "vectors": np.zeros((2, DIM), np.float32)}, opt)


def test_memory_and_exchange_of_a_grid(strategy_of):
    with strategy_of(4).scope():
        static = sok.DistributedEmbedding("sum", 1000, 10, slot_num=1, max_nnz=1, sharding="row_column",
                                          use_hashtable=False)
        static.build()
    layout = static.table.layout
    assert (layout.rows, layout.columns) == (2, 2) and static.table.slices.widths == [5, 5] and static.capacity == 2000
    assert replica_bytes([static]) == 1000 * 5 * 4  # capacity x ceil(d / C) x 4
    n, k, d = 4, 1000, 10
    ids = 2 * (n - 1) * 8 + (n - 1) * k * 8 + (n - 1) * k * d * 4  # counts (all-reduced), keys, gradients backward
    assert exchange_bytes("row_column", n, k, d) == ids + (n - 1) * 2 * k * 5 * 4  # C*K keys' slices from each
    assert exchange_bytes("row_column", n, k, d, "all_reduce") == ids + 2 * (n - 1) * k * d * 4
    assert exchange_bytes("row_column", n, k, d, column_shards=4) == exchange_bytes("column", n, k, d)
    assert exchange_bytes("row_column", n, k, d, column_shards=1) == exchange_bytes("row", n, k, d)
    assert static.get_config()["column_shards"] is None
    assert sok.DistributedEmbedding.from_config(
        {**static.get_config(), "column_shards": 2}).column_shards == 2


def test_bad_grid_inputs(strategy_of):
    with strategy_of(4).scope():
        odd = sok.DistributedEmbedding("sum", 10, 8, slot_num=1, max_nnz=1, sharding="row_column", column_shards=3,
                                       name="odd")
        with pytest.raises(ValueError, match=r"odd: column_shards=3 does not divide num_replicas=4: .* expected one "
                                             r"of \[1, 2, 4\]"):
            odd.build()
        narrow = sok.DistributedEmbedding("sum", 10, 3, slot_num=1, max_nnz=1, sharding="row_column",
                                          column_shards=4, name="narrow")
        with pytest.raises(ValueError, match=r"narrow: column_shards=4 is larger than dim=3: .* expected one of "
                                             r"\[1, 2\]"):
            narrow.build()
        rowwise = sok.DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, sharding="row_column", name="rw")
        rowwise.build()
        opt = sok.optimizers.RowWiseAdagrad(0.1)
        with pytest.raises(ValueError, match="rw: RowWiseAdagrad keeps one value per row of all columns.*'row_column'"):
            opt.build([rowwise.embedding_variable])
        assert not opt.built
    with pytest.raises(ValueError, match="rows: column_shards=2 sets the grid of sharding='row_column'; got "
                                         "sharding='row'"):
        sok.DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, sharding="row", column_shards=2, name="rows")
    with pytest.raises(ValueError, match="column_shards=0 is invalid"):
        sok.DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, sharding="row_column", column_shards=0)
