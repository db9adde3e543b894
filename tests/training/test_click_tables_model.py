"""`ClickTablesModel`: three tables sharded three ways, trained by `make_sok_step` on N replicas
as on one device."""
from __future__ import annotations

import keras
import numpy as np

import sok_tutorial as sok
from data_gen.click_tables import ClickSamples
from sok_tutorial.models.click_tables import ClickTablesModel
from sok_tutorial.training import make_sok_step

ITEMS, FIELDS, DIM, BATCH, STEPS = 300, [120, 60, 30, 8], 4, 64, 4


def trained(strategy) -> tuple[ClickTablesModel, list[float]]:
    with strategy.scope():
        model = ClickTablesModel(ITEMS, FIELDS, embedding_dim=DIM, hidden=8, seed=1)
        model.build()
        sparse, dense = sok.optimizers.LazyAdam(0.05), keras.optimizers.Adam(0.01)
    step = make_sok_step(model, sparse, dense, global_batch_size=BATCH, strategy=strategy)
    samples = ClickSamples(ITEMS, FIELDS, seed=0)
    return model, [float(step(*samples.batch(BATCH))) for _ in range(STEPS)]


def rows_by_key(layer) -> tuple[np.ndarray, np.ndarray]:
    rows = layer.table.export()
    order = np.argsort(rows["keys"])
    return rows["keys"][order], rows["vectors"][order]


def test_each_table_is_sharded_its_own_way(strategy_of):
    with strategy_of(4).scope():
        model = ClickTablesModel(ITEMS, FIELDS, embedding_dim=DIM, hidden=8)
        model.build()
    assert [layer.sharding for layer in model.tables] == ["row", "table", "replicated"]
    assert [layer.num_shards for layer in model.tables] == [4, 4, 1]  # the replicated table: one copy, mirrored
    assert model.items.max_vocabulary_size_per_gpu == sok.rows_per_replica(ITEMS, 4)
    assert model.fields.max_vocabulary_size_per_gpu == max(sok.plan_table_wise(FIELDS, 4)[1])


def test_n_replicas_train_like_one_device(strategy_of):
    """The same losses and, key by key, the same rows in every table on 2 replicas as on 1."""
    one, losses_one = trained(strategy_of(1))
    two, losses_two = trained(strategy_of(2))
    np.testing.assert_allclose(losses_two, losses_one, rtol=0, atol=1e-5)
    assert losses_one[-1] != losses_one[0]
    for a, b in zip(one.tables, two.tables):
        (keys_a, rows_a), (keys_b, rows_b) = rows_by_key(a), rows_by_key(b)
        np.testing.assert_array_equal(keys_a, keys_b)
        np.testing.assert_allclose(rows_a, rows_b, rtol=0, atol=1e-5)
    for a, b in zip(one.mlp.weights, two.mlp.weights):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
