"""Sharded tables in one process (2 logical CPU replicas): model.fit, bad input, restore checks."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.training import CheckpointMismatch, load_checkpoint, save_checkpoint


def _fit(strategy, sharding: str, x: np.ndarray, y: np.ndarray) -> tuple[list[float], dict[int, np.ndarray]]:
    keras.utils.set_random_seed(0)
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        inp = keras.Input([4], dtype="int64")
        layer = sok.DistributedEmbedding("sum", 2000 // n, 4, slot_num=4, max_nnz=1, sharding=sharding,
                                         name="emb")
        out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Reshape([16])(layer(inp)))
        model = keras.Model(inp, out)
        model.compile(sok.optimizers.Adam(0.05), "binary_crossentropy")
    history = model.fit(x, y, batch_size=64, epochs=2, verbose=0, shuffle=False)
    rows = layer.table.export()
    return history.history["loss"], dict(zip(rows["keys"].tolist(), rows["vectors"]))


def test_model_fit_with_a_row_sharded_table_equals_one_device(strategy_of):
    rng = np.random.default_rng(2)
    x = rng.integers(-10**12, 10**12, (256, 4))
    y = (x[:, :1] % 3 == 0).astype("float32")
    loss_1, table_1 = _fit(strategy_of(1), "row", x, y)
    loss_2, table_2 = _fit(strategy_of(2), "row", x, y)
    np.testing.assert_allclose(loss_2, loss_1, rtol=1e-5)
    assert table_1.keys() == table_2.keys()
    np.testing.assert_allclose(np.stack([table_2[k] for k in table_1]), np.stack(list(table_1.values())), atol=1e-5)


def test_each_replica_holds_its_own_rows(strategy_of):
    strategy = strategy_of(2)
    with strategy.scope():
        layer = sok.All2AllDenseEmbedding(8, 2, slot_num=1, nnz_per_slot=1, use_hashtable=False, sharding="row")
        layer.build()
    shards = [c.numpy() for c in strategy.experimental_local_results(layer.embedding_variable.value)]
    assert layer.capacity == 16 and not np.allclose(shards[0], shards[1])
    looked_up = layer(tf.constant([[[3]], [[4]]], tf.int64)).numpy()[:, 0, 0]  # outside strategy.run: all shards
    np.testing.assert_array_equal(looked_up, np.stack([shards[1][1], shards[0][2]]))  # 3 -> replica 1 row 1


def test_bad_sharding_inputs(strategy_of):
    with pytest.raises(ValueError, match="sharding"):
        sok.DistributedEmbedding("sum", 10, 2, slot_num=1, max_nnz=1, sharding="columns")
    with pytest.raises(ValueError, match="exchange"):
        sok.DistributedEmbedding("sum", 10, 2, slot_num=1, max_nnz=1, exchange="carrier_pigeon")
    with pytest.raises(ValueError, match="vocabulary_size=3 is smaller than num_replicas=4"):
        sok.rows_per_replica(3, 4)
    with strategy_of(2).scope():
        layer = sok.DistributedEmbedding("sum", 10, 2, slot_num=3, max_nnz=1, sharding="table", slot_sizes=[5, 5])
        with pytest.raises(ValueError, match="slot_sizes has 2 entries, slot_num=3"):
            layer.build()
        layer = sok.DistributedEmbedding("sum", 10, 2, slot_num=2, max_nnz=1, sharding="table",
                                         slot_sizes=[15, 1])
        with pytest.raises(ValueError, match="15 rows on one replica, more than max_vocabulary_size_per_gpu=10"):
            layer.build()
    with pytest.raises(ValueError, match="global_batch_size=10 does not split evenly over 4 replicas"):
        sok.Init(global_batch_size=10, strategy=strategy_of(4))


def test_restore_refuses_a_mismatched_sharding(strategy_of, tmp_path):
    strategy = strategy_of(2)

    def model(sharding: str) -> keras.Model:
        with strategy.scope():
            inp = keras.Input([2], dtype="int64")
            emb = sok.DistributedEmbedding("sum", 8, 2, slot_num=2, max_nnz=1, sharding=sharding,
                                           slot_sizes=[4, 4] if sharding == "table" else None, name="emb")
            return keras.Model(inp, keras.layers.Flatten()(emb(inp)), name="m")

    saved = model("table")
    saved(tf.constant([[1, 11], [2, 12]], tf.int64))
    save_checkpoint(tmp_path / "ckpt", saved)
    with pytest.raises(CheckpointMismatch, match="saved table-wise .* restoring sharding='row'"):
        load_checkpoint(tmp_path / "ckpt", model("row"))
    restored = model("table")
    load_checkpoint(tmp_path / "ckpt", restored)
    np.testing.assert_allclose(restored(tf.constant([[2, 11]], tf.int64)), saved(tf.constant([[2, 11]], tf.int64)))


def test_launcher_rejects_bad_arguments():
    def launch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sok_tutorial.launch", *args], capture_output=True, text=True,
                              timeout=60)
    assert "expected at least 1" in launch("--workers", "0", "x.py").stderr
    assert "script 'no_such.py' not found" in launch("--workers", "2", "no_such.py").stderr


def test_bad_tf_config_is_a_clear_error(monkeypatch):
    from sok_tutorial.distribute import cluster_from_environment
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"index": 3}}))
    with pytest.raises(ValueError, match="task index 3 is outside the 1 workers"):
        cluster_from_environment()
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="not a valid cluster spec"):
        cluster_from_environment()
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    config = cluster_from_environment()
    assert config["task"]["index"] == 1 and len(config["cluster"]["worker"]) == 2
    assert json.loads(os.environ["TF_CONFIG"]) == config


def _grouped(strategy) -> list[np.ndarray]:
    """A grouped lookup over a row-sharded, a table-wise and a replicated table, run per replica."""
    keras.utils.set_random_seed(0)
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        layers = [sok.DistributedEmbedding("sum", 64 // n, 3, slot_num=1, max_nnz=4, sharding=mode, name=f"t{i}")
                  for i, mode in enumerate(("row", "table", "replicated"))]
        for layer in layers:
            layer.build()
    ids = [tf.ragged.constant([[1, 2**40], [7], [], [3, 3, 5]], dtype=tf.int64) for _ in layers]

    @tf.function
    def run():
        def replica():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            part = [ids_i[r * (4 // n):(r + 1) * (4 // n)] for ids_i in ids]
            with tf.GradientTape():  # as in a training step: new keys get rows
                return sok.group_embedding_lookup_sparse(layers, part, ["sum", "mean", "sum"])
        return strategy.run(replica)
    out = run()
    return [np.concatenate([t.numpy() for t in strategy.experimental_local_results(o)]) for o in out]


def test_grouped_lookup_over_sharded_tables_equals_one_device(strategy_of):
    one, two = _grouped(strategy_of(1)), _grouped(strategy_of(2))
    for a, b in zip(one, two):
        assert a.shape == (4, 3)
        np.testing.assert_allclose(b, a, atol=1e-7)
    assert np.allclose(one[0][2], 0) and not np.allclose(one[0][0], 0)  # an empty bag, a real one


def _grouped_table_wise(strategy, ids: tf.RaggedTensor) -> tuple[np.ndarray, np.ndarray]:
    """A grouped lookup over a 3-slot table-wise layer vs the layer's own output summed over slots."""
    keras.utils.set_random_seed(0)
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        layer = sok.DistributedEmbedding("sum", 64, 3, slot_num=3, max_nnz=2, sharding="table", name="fields")
        layer.build()

    @tf.function
    def run():
        def replica():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            part = ids[r * (4 // n):(r + 1) * (4 // n)]
            with tf.GradientTape():  # as in a training step: new keys get rows
                grouped = sok.group_embedding_lookup_sparse([layer], [part], ["sum"])[0]
            return grouped, tf.reduce_sum(layer(part), 1)
        return strategy.run(replica)
    grouped, own = run()
    return tuple(np.concatenate([t.numpy() for t in strategy.experimental_local_results(o)]) for o in (grouped, own))


def test_grouped_lookup_over_a_table_wise_multi_slot_layer_keeps_each_keys_slot(strategy_of):
    # disjoint keys per slot, as table-wise placement requires; a sample's keys form one bag
    ids = tf.ragged.constant([[[1, 2], [100], [200, 201]], [[3], [], [202]], [[], [101, 102], []],
                              [[1], [100], [200]]], dtype=tf.int64, ragged_rank=2)
    for n in (1, 2):
        grouped, own = _grouped_table_wise(strategy_of(n), ids)
        assert grouped.shape == (4, 3) and np.abs(grouped).max() > 0
        np.testing.assert_allclose(grouped, own, atol=1e-7)
    strategy = strategy_of(2)
    with strategy.scope():
        layer = sok.DistributedEmbedding("sum", 64, 3, slot_num=3, max_nnz=2, sharding="table", name="flat")
        layer.build()
    with pytest.raises(ValueError, match=r"sp_ids\[0\]: layer 'flat' places its 3 slots table-wise"):
        strategy.run(lambda: sok.group_embedding_lookup_sparse([layer], [ids.merge_dims(1, 2)], ["sum"]))


def test_a_sharded_table_keeps_its_admission_counts_through_a_checkpoint(strategy_of, tmp_path):
    """Keys seen once by a row-sharded table with min_count=2 get no row; saved and restored on one
    device (the shards' sketches summed), their second sighting admits them all."""
    strategy = strategy_of(2)
    keys = np.arange(1000, 1064, dtype=np.int64)[:, None]

    def layer(capacity):
        return sok.DistributedEmbedding("sum", capacity, 4, slot_num=1, max_nnz=1, sharding="row", name="emb",
                                        eviction_policy="lru", min_count=2, sketch_width=4096)

    with strategy.scope():
        sharded = keras.Sequential([keras.Input((1,), dtype="int64"), layer(64)])
    halves = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(keys[ctx.replica_id_in_sync_group * 32:][:32]))
    strategy.run(lambda x: sharded(x, training=True), args=(halves,))
    assert sharded.layers[0].table.size == 0  # seen once: none admitted
    save_checkpoint(tmp_path / "ckpt", sharded)
    one = keras.Sequential([keras.Input((1,), dtype="int64"), layer(128)])  # one device, the same rows
    one(keys[:1], training=False)
    load_checkpoint(tmp_path / "ckpt", one)
    one(keys, training=True)
    assert one.layers[0].table.size == len(keys)  # the second sighting admits every key


def test_a_sharded_table_keeps_its_eviction_log_through_a_checkpoint(strategy_of, tmp_path):
    """The shards' eviction logs merge into the checkpoint: restored onto 4 replicas or one device
    (the same 128 rows), the keys evicted since a mark are the ones the 2 shards evicted."""
    from sok_tutorial.embedding import lifecycle

    def layer(capacity):
        return sok.DistributedEmbedding("sum", capacity, 4, slot_num=1, max_nnz=1, sharding="row", name="emb",
                                        eviction_policy="lru", eviction_log=512)

    def model(n):
        with strategy_of(n).scope():
            return keras.Sequential([keras.Input((1,), dtype="int64"), layer(128 // n)])

    strategy, sharded = strategy_of(2), model(2)
    for step in range(4):  # 96 new keys a step into 128 rows: evictions from the second step on
        keys = np.arange(96 * step, 96 * (step + 1), dtype=np.int64)[:, None] * 7919
        halves = strategy.experimental_distribute_values_from_function(
            lambda ctx, k=keys: tf.constant(k[ctx.replica_id_in_sync_group * 48:][:48]))
        strategy.run(lambda x: sharded(x, training=True), args=(halves,))
        if step == 1:
            mark = lifecycle.mark(sharded.layers[0].table)
    evicted = np.sort(lifecycle.evicted_since(sharded.layers[0].table, mark))
    every = np.sort(lifecycle.evicted_since(sharded.layers[0].table, 0))
    assert len(evicted) > 96  # the last two steps evicted (about as many keys as they brought)
    save_checkpoint(tmp_path / "ckpt", sharded)
    for n in (4, 1):
        restored = model(n)
        if n == 1:
            restored(np.zeros((1, 1), np.int64), training=False)
        else:
            restored.layers[0].build()
        load_checkpoint(tmp_path / "ckpt", restored)
        table = restored.layers[0].table
        np.testing.assert_array_equal(np.sort(lifecycle.evicted_since(table, mark)), evicted)
        np.testing.assert_array_equal(np.sort(lifecycle.evicted_since(table, 0)), every)
