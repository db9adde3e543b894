"""Tables stored in float16 / bfloat16: storage, lookups, float32 updates rounded back (to nearest
or stochastically), checkpoints, sharding, eviction, the SOK layers and a model's AUC."""
from __future__ import annotations

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial import optimizers
from sok_tutorial.embedding import EmbeddingTable
from sok_tutorial.embedding.placement import replica_bytes
from sok_tutorial.training.checkpoint import load_checkpoint, save_checkpoint
from sok_tutorial.training.summary import parameter_report

LOW = ["bfloat16", "float16"]
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def _table(dtype: str = "bfloat16", **kwargs) -> EmbeddingTable:
    table = EmbeddingTable(kwargs.pop("capacity", 64), kwargs.pop("dim", 4), storage_dtype=dtype, **kwargs)
    table.build()
    return table


def _step(table: EmbeddingTable, opt, keys, upstream) -> None:
    """One step of loss = sum(vectors * upstream) on `keys`."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(table(tf.constant(keys, tf.int64), training=True) * upstream)
    opt.apply([tape.gradient(loss, table.variable)], [table.variable])


@pytest.mark.parametrize("dtype", ["float32", *LOW])
def test_rows_are_stored_in_the_storage_dtype_and_counted_in_its_bytes(dtype):
    size = np.dtype(NP[dtype]).itemsize
    table = _table(dtype, capacity=100, dim=8, dynamic=False)
    assert table.variable.dtype == dtype and table.precision.row_bytes == size
    keys = keras.Input([1], dtype="int64")
    model = keras.Model(keys, table(keys))
    assert parameter_report(model)["embedding_bytes"] == 100 * 8 * size
    assert replica_bytes([table]) == 100 * 8 * size


@pytest.mark.parametrize("dtype", LOW)
def test_a_lookup_is_the_float32_cast_of_the_stored_rows(dtype):
    table = _table(dtype, dynamic=True, initializer=keras.initializers.RandomNormal(stddev=1.0, seed=3))
    out = table(tf.constant([[3, 2**40], [3, -7]], tf.int64), training=True)
    assert out.dtype == tf.float32
    stored = table.variable.numpy()
    rows = table.export()
    np.testing.assert_array_equal(rows["vectors"], stored[: len(rows["keys"])].astype(np.float32))
    by_key = dict(zip(rows["keys"].tolist(), rows["vectors"]))
    np.testing.assert_array_equal(out.numpy()[0, 1], by_key[2**40])
    # a new key's initial row is its float32 initial row rounded to nearest
    np.testing.assert_array_equal(by_key[-7], table.initial_values([-7])[0].astype(NP[dtype]).astype(np.float32))


def test_an_sgd_step_is_the_float32_update_rounded_to_nearest():
    rng = np.random.default_rng(0)
    table = _table("bfloat16", capacity=10, dim=16, dynamic=False)
    before = table.variable.numpy().astype(np.float32)
    upstream = rng.normal(size=(3, 16)).astype(np.float32)
    _step(table, optimizers.SGD(0.01), [1, 4, 1], upstream)
    want = before.copy()
    want[1] -= 0.01 * (upstream[0] + upstream[2])
    want[4] -= 0.01 * upstream[1]
    expected = tf.cast(want, tf.bfloat16).numpy()
    np.testing.assert_array_equal(table.variable.numpy().view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(expected, want.astype(ml_dtypes.bfloat16))  # tf.cast rounds to nearest even


def test_an_adam_step_is_the_float32_maths_rounded_and_keeps_float32_moments():
    rng = np.random.default_rng(1)
    table = _table("bfloat16", capacity=10, dim=8, dynamic=False)
    opt = optimizers.Adam(0.01)
    w = table.variable.numpy().astype(np.float32)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t in range(1, 4):
        g = rng.normal(size=(1, 8)).astype(np.float32)
        _step(table, opt, [5], g)
        m[5] = 0.9 * m[5] + 0.1 * g[0]
        v[5] = 0.999 * v[5] + 0.001 * g[0] ** 2
        alpha = 0.01 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        w[5] = (w[5] - alpha * m[5] / (np.sqrt(v[5]) + 1e-7)).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(table.variable.numpy().astype(np.float32), w, rtol=2**-7)
    [slot] = table.optimizer_slots(opt)
    assert slot.dtype == "float32"
    np.testing.assert_allclose(slot.numpy()[5], np.concatenate([m[5], v[5]]), rtol=1e-5)


@pytest.mark.parametrize("make", [lambda: optimizers.SGD(0.1, momentum=0.9), lambda: optimizers.Adagrad(0.1),
                                  lambda: optimizers.LazyAdam(0.01), lambda: optimizers.RowWiseAdagrad(0.1),
                                  lambda: optimizers.Ftrl(0.1)], ids=["sgd", "adagrad", "lazyadam", "rowwise", "ftrl"])
@pytest.mark.parametrize("slot_dtype", ["float32", "storage"])
def test_every_sparse_optimizer_updates_a_low_precision_table(make, slot_dtype):
    table, opt = _table("float16", dynamic=False, slot_dtype=slot_dtype), make()
    before = table.variable.numpy()
    _step(table, opt, [[2, 3]], tf.ones([1, 2, 4]))
    after = table.variable.numpy()
    assert after.dtype == np.float16 and (after[2:4] != before[2:4]).all()
    np.testing.assert_array_equal(np.delete(after, [2, 3], 0), np.delete(before, [2, 3], 0))
    want = "float32" if slot_dtype == "float32" else "float16"
    assert {s.dtype for s in table.optimizer_slots(opt)} == {want}


@pytest.mark.parametrize("dtype,ulp", [("bfloat16", 2.0**-7), ("float16", 2.0**-10)])
def test_stochastic_rounding_is_unbiased_where_rounding_to_nearest_loses_the_update(dtype, ulp):
    tiny = ulp / 8  # a step below half a unit in the last place at 1.0
    means = {}
    for stochastic in (False, True):
        table = _table(dtype, capacity=256, dim=16, dynamic=False, initializer="ones", stochastic_rounding=stochastic)
        opt = optimizers.SGD(1.0)
        for _ in range(4):
            _step(table, opt, np.arange(256), tf.fill([256, 16], -tiny))
        means[stochastic] = table.variable.numpy().astype(np.float64).mean()
    assert means[False] == 1.0  # round-to-nearest: every update lost
    assert abs(means[True] - (1.0 + 4 * tiny)) < 0.05 * 4 * tiny  # unbiased, within 5%


def test_stochastic_rounding_is_reproducible_for_a_seed_and_step():
    def run(seed: int) -> np.ndarray:
        table = _table("bfloat16", capacity=50, dim=8, dynamic=False, stochastic_rounding=True,
                       initializer=keras.initializers.RandomUniform(seed=seed))
        opt = optimizers.Adam(1e-3)
        for keys in ([1, 2, 3], [3, 2, 1], [7, 1]):  # the same rows in another order round alike
            _step(table, opt, keys, tf.fill([len(keys), 8], 0.37))
        return table.variable.numpy().view(np.uint16)

    np.testing.assert_array_equal(run(5), run(5))
    assert (run(5) != run(6)).any()


def test_stochastic_rounding_noise_depends_on_step_and_row_not_on_batch_order():
    from sok_tutorial.embedding.precision import noise_bits

    rows = tf.constant([4, 9, 2], tf.int64)
    a = noise_bits(rows, 8, 0, 0, 3, 16).numpy()
    b = noise_bits(tf.constant([2, 4, 9], tf.int64), 8, 0, 0, 3, 16).numpy()
    np.testing.assert_array_equal(a[[2, 0, 1]], b)
    assert (noise_bits(rows, 8, 0, 0, 4, 16).numpy() != a).mean() > 0.9
    assert a.min() >= 0 and a.max() < 2**16


def _model(dtype: str, **table_options) -> keras.Model:
    keys = keras.Input([3], dtype="int64")
    layer = sok.DistributedEmbedding("sum", 1000, 8, slot_num=3, max_nnz=1, name="emb", storage_dtype=dtype,
                                     **table_options)
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(layer(keys)))
    return keras.Model(keys, out)


def test_a_checkpoint_gives_back_the_stored_bits_and_slots(tmp_path):
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 10**9, (256, 3)), rng.integers(0, 2, (256, 1)).astype("float32")
    model, opt = _model("bfloat16", stochastic_rounding=True, slot_dtype="storage"), optimizers.Adam(0.01)
    model.compile(opt, "binary_crossentropy")
    model.fit(x, y, batch_size=64, verbose=0)
    save_checkpoint(tmp_path / "ckpt", model, opt)
    again, opt2 = _model("bfloat16", stochastic_rounding=True, slot_dtype="storage"), optimizers.Adam(0.01)
    again.compile(opt2, "binary_crossentropy")
    again.fit(x[:64], y[:64], batch_size=64, verbose=0)  # builds the optimizer; restored over below
    load_checkpoint(tmp_path / "ckpt", again, opt2)
    old, new = model.get_layer("emb").table, again.get_layer("emb").table
    rows_old, rows_new = old.export(opt), new.export(opt2)
    order_old, order_new = np.argsort(rows_old["keys"]), np.argsort(rows_new["keys"])
    for name in ("keys", "vectors", "slot_0"):
        np.testing.assert_array_equal(rows_old[name][order_old], rows_new[name][order_new])
    stored = new.variable.numpy()[: new.size]
    assert stored.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(stored.astype(np.float32), rows_new["vectors"])
    assert new.optimizer_slots(opt2)[0].dtype == "bfloat16"


def test_the_training_cache_reads_float32_and_writes_rounded_rows():
    table = _table("bfloat16", dynamic=True)
    values = np.array([[1 + 2**-9, 3.0, -0.1, 1e-3]] * 2, np.float32)
    table.write([11, 12], {"vectors": values})
    read = table.read([11, 12])["vectors"]
    assert read.dtype == np.float32
    np.testing.assert_array_equal(read, values.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_an_evicting_table_trains_in_bfloat16():
    table = _table("bfloat16", capacity=32, dynamic=True, eviction_policy="lru", stochastic_rounding=True)
    opt = optimizers.Adam(0.01)
    for step in range(6):
        _step(table, opt, np.arange(step * 16, step * 16 + 16), tf.ones([16, 4]))
    assert table.evictions > 0 and table.variable.dtype == "bfloat16"
    assert np.isfinite(table.export(opt)["slot_0"]).all()


def test_a_row_sharded_bfloat16_table_trains_like_one_replica(strategy_of):
    rng = np.random.default_rng(4)
    x = rng.integers(0, 200, (128, 4))
    y = (x[:, :1] % 3 == 0).astype("float32")

    def fit(strategy) -> dict[int, np.ndarray]:
        keras.utils.set_random_seed(0)
        with strategy.scope():
            inp = keras.Input([4], dtype="int64")
            layer = sok.DistributedEmbedding("sum", 500, 4, slot_num=4, max_nnz=1, sharding="row", name="emb",
                                             storage_dtype="bfloat16")
            out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Reshape([16])(layer(inp)))
            model = keras.Model(inp, out)
            model.compile(optimizers.SGD(0.05), "binary_crossentropy")
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
        assert layer.table.variable.dtype == "bfloat16"
        rows = layer.table.export()
        return dict(zip(rows["keys"].tolist(), rows["vectors"]))

    one, two = fit(strategy_of(1)), fit(strategy_of(2))
    assert one.keys() == two.keys()
    np.testing.assert_allclose(np.stack([two[k] for k in one]), np.stack(list(one.values())), rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("make", [lambda: keras.optimizers.Adam(0.01), lambda: keras.optimizers.SGD(0.1)],
                         ids=["Adam", "SGD"])
def test_a_keras_dense_optimizer_on_a_16_bit_table_is_refused_before_it_changes_a_row(dtype, make):
    """Keras' own optimizers update a variable in its type (bfloat16: Adam's beta_2 = 0.999 rounds to
    1.0 and its steps are zero; float16: steps far beyond Adam's bound); model.fit refuses while
    tracing its first step, naming the table and the optimizer to use instead."""
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 1000, (64, 3)), rng.integers(0, 2, (64, 1)).astype("float32")
    model = _model(dtype)
    model.compile(make(), "binary_crossentropy")
    model(x[:1])
    table = sok.tables_of(model)[0]
    before = table.variable.numpy().astype(np.float32)
    with pytest.raises(ValueError, match=rf"emb.*: a {dtype} table is being trained by a Keras optimizer.*"
                                         r"sok_tutorial\.optimizers"):
        model.fit(x, y, batch_size=32, verbose=0)
    np.testing.assert_array_equal(table.variable.numpy().astype(np.float32), before)
    model.compile(optimizers.Adam(0.01), "binary_crossentropy")  # the sparse one trains it
    model.fit(x, y, batch_size=32, verbose=0)
    assert (table.variable.numpy().astype(np.float32) != before).any()


def test_the_config_round_trips_the_precision():
    table = EmbeddingTable(10, 4, storage_dtype="float16", stochastic_rounding=True, slot_dtype="storage", name="t")
    again = EmbeddingTable.from_config(table.get_config())
    assert again.precision == table.precision and again.get_config() == table.get_config()
    layer = sok.DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, storage_dtype="bfloat16")
    assert type(layer).from_config(layer.get_config()).table_options["storage_dtype"] == "bfloat16"


@pytest.mark.parametrize("dtype", ["int8", "float64", "fp8"])
def test_an_unsupported_storage_dtype_fails_at_construction(dtype):
    with pytest.raises(ValueError, match=rf"items: storage_dtype='{dtype}' is invalid: expected one of "
                                         "float32, float16, bfloat16"):
        EmbeddingTable(10, 4, storage_dtype=dtype, name="items")


def test_bad_slot_dtype_and_stochastic_rounding_fail_at_construction():
    with pytest.raises(ValueError, match="items: slot_dtype='float16' is invalid"):
        EmbeddingTable(10, 4, storage_dtype="bfloat16", slot_dtype="float16", name="items")
    with pytest.raises(ValueError, match="items: stochastic_rounding='yes' is invalid"):
        EmbeddingTable(10, 4, stochastic_rounding="yes", name="items")
    with pytest.raises(ValueError, match="storage_dtype='int8'"):
        sok.DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, storage_dtype="int8").build()


def _auc(dtype: str, data: dict, seed: int = 0) -> float:
    from data_gen.criteo import CAT_NAMES

    cats = np.stack([data[n] for n in CAT_NAMES[:8]], 1).astype(np.int64)
    keras.utils.set_random_seed(seed)
    inp = keras.Input([8], dtype="int64")
    layer = sok.DistributedEmbedding("sum", 4096, 8, slot_num=8, max_nnz=1, storage_dtype=dtype,
                                     use_hashtable=True, name="emb")
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(layer(inp)))
    model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(optimizers.Adam(0.01), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    n = len(cats) * 3 // 4
    model.fit(cats[:n], data["label"][:n].astype("float32"), batch_size=512, epochs=2, verbose=0)
    return float(model.evaluate(cats[n:], data["label"][n:].astype("float32"), batch_size=4096, verbose=0,
                                return_dict=True)["auc"])


def test_a_model_with_bfloat16_tables_reaches_the_float32_auc():
    from data_gen.criteo import CriteoLike, scaled_cardinalities

    data = CriteoLike(scaled_cardinalities(0.0002), signal=2.0, seed=1).sample(40_000)
    f32, bf16 = _auc("float32", data), _auc("bfloat16", data)
    assert f32 > 0.6
    assert abs(bf16 - f32) < 0.01, (f32, bf16)
