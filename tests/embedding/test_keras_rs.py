"""`from_keras_rs`: Keras-RS's configuration builds our layer, which computes what
``keras_rs.layers.DistributedEmbedding`` computes on its default-device path (the same activations
from the same tables, the same tables after one training step), places its tables over replicas,
and takes our own table options; bad configurations fail when the layer is built, naming the
feature or table."""
from __future__ import annotations

import importlib
import sys

import keras_rs  # (the dev extra installs it: these tests run, never skip)
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.embedding.keras_rs import from_keras_rs  # noqa: E402
from sok_tutorial.training.delta import apply_delta, export_delta, export_model_tables  # noqa: E402

TableConfig, FeatureConfig = keras_rs.layers.TableConfig, keras_rs.layers.FeatureConfig
B = 8


def configs(optimizer, batch: int = B) -> dict:
    """Single ids and ragged ids sharing a table (mean), dense multi-hot ids (sum), sparse ids (sqrtn)."""
    items = TableConfig("items", 40, 4, optimizer=optimizer, combiner="mean")
    users = TableConfig("users", 30, 3, optimizer=optimizer, combiner="sum")
    tags = TableConfig("tags", 20, 2, optimizer=optimizer, combiner="sqrtn")
    return {"item": FeatureConfig("item", items, (batch,), (batch, 4)),
            "history": FeatureConfig("history", items, (batch, None), (batch, 4)),
            "context": [FeatureConfig("friends", users, (batch, 5), (batch, 3)),
                        FeatureConfig("tags", tags, (batch, 6), (batch, 2))]}


def batch(seed: int = 0, weighted: bool = False) -> tuple[dict, dict | None]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 6, B)  # some rows empty
    dense = (rng.random((B, 6)) < 0.4) * rng.integers(1, 20, (B, 6))
    tags = tf.sparse.from_dense(tf.constant(dense))  # present entries only (ids 1..19)
    ids = {"item": tf.constant(rng.integers(0, 40, B)),
           "history": tf.RaggedTensor.from_row_lengths(rng.integers(0, 40, lengths.sum()), lengths),
           "context": [tf.constant(rng.integers(0, 30, (B, 5))), tags]}
    if not weighted:
        return ids, None
    w = {"item": tf.constant(rng.random(B) + 0.5, tf.float32),
         "history": tf.RaggedTensor.from_row_lengths(rng.random(lengths.sum()).astype("float32") + 0.5, lengths),
         "context": [tf.constant(rng.random((B, 5)) + 0.5, tf.float32),
                     tf.SparseTensor(tags.indices, tf.cast(tags.values, tf.float32) / 7, tags.dense_shape)]}
    return ids, w


def flat(structure) -> list[np.ndarray]:
    return [np.asarray(x) for x in tf.nest.flatten(structure)]


def one_step(layer, optimizer, ids, weights, target, dense: bool) -> None:
    """loss = sum(activations * target); `dense`: the gradients as dense tensors (Keras-RS on CPU)."""
    with tf.GradientTape() as tape:
        out = layer(ids, weights, training=True)
        loss = sum(tf.reduce_sum(o * t) for o, t in zip(tf.nest.flatten(out), target))
    grads = tape.gradient(loss, layer.trainable_variables)
    optimizer.apply([tf.convert_to_tensor(g) for g in grads] if dense else grads, layer.trainable_variables)


def touched(ids) -> dict[str, np.ndarray]:
    rows = {"items": [np.asarray(ids["item"]), ids["history"].values.numpy()],
            "users": [ids["context"][0].numpy().ravel()], "tags": [ids["context"][1].values.numpy()]}
    return {name: np.unique(np.concatenate(r)) for name, r in rows.items()}


OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.5), "adagrad": lambda: keras.optimizers.Adagrad(0.5),
              "adam": lambda: keras.optimizers.Adam(0.1),
              "ftrl": lambda: keras.optimizers.Ftrl(0.2, l1_regularization_strength=0.01)}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_equal_to_keras_rs_activations_and_one_step(name):
    """Same tables -> the same activations (single ids, ragged, dense and sparse multi-hot ids, with and
    without weights); one step later the same tables: Keras-RS trained densely by the compile optimizer,
    ours by each table's own (TableConfig.optimizer, made sparse). Keras' FTRL also rewrites every row
    no id touched (to zero: its dense formula on an empty history); ours leaves those rows alone."""
    for weighted in (False, True):
        ids, weights = batch(seed=1, weighted=weighted)
        theirs = keras_rs.layers.DistributedEmbedding(configs(OPTIMIZERS[name]()))
        ours = from_keras_rs(configs(OPTIMIZERS[name]()))
        expected = theirs(ids, weights)
        ours.set_embedding_tables({k: v.numpy() for k, v in theirs.get_embedding_tables().items()})
        before = ours.get_embedding_tables()
        got = ours(ids, weights)
        assert tf.nest.map_structure(lambda x: tuple(x.shape), got) == \
            tf.nest.map_structure(lambda x: tuple(x.shape), expected)
        for a, b in zip(flat(got), flat(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)

        target = [tf.constant(np.random.default_rng(2).normal(size=x.shape), tf.float32) for x in flat(expected)]
        one_step(theirs, OPTIMIZERS[name](), ids, weights, target, dense=True)
        one_step(ours, sok.optimizers.SGD(1.0), ids, weights, target, dense=False)  # hands each table to its own
        mine, keras_rs_tables = ours.get_embedding_tables(), theirs.get_embedding_tables()
        for table, rows in touched(ids).items():
            if name == "ftrl":
                np.testing.assert_allclose(mine[table][rows], keras_rs_tables[table].numpy()[rows], rtol=1e-5,
                                           atol=1e-6)
                untouched = np.setdiff1d(np.arange(len(mine[table])), rows)
                np.testing.assert_array_equal(mine[table][untouched], before[table][untouched])
            else:
                np.testing.assert_allclose(mine[table], keras_rs_tables[table].numpy(), rtol=1e-5, atol=1e-6)
            assert not np.array_equal(mine[table][rows], before[table][rows])  # the step moved them


def test_tensorflow_tpu_configs_against_a_dense_reference():
    """tf.tpu.experimental.embedding configs (Keras-RS sends them to its TPU path): activations,
    sequence features and one Adagrad step equal a plain TensorFlow computation on dense tables."""
    tpu = tf.tpu.experimental.embedding
    words = tpu.TableConfig(50, 4, optimizer=tpu.Adagrad(0.3), combiner="sqrtn", name="words")
    pages = tpu.TableConfig(20, 3, optimizer=tpu.Adagrad(0.3, initial_accumulator_value=0.2), combiner="sum")
    layer = from_keras_rs({"query": tpu.FeatureConfig(words, name="query"),
                           "recent": tpu.FeatureConfig(words, max_sequence_length=3, name="recent"),
                           "page": tpu.FeatureConfig(pages, output_shape=[B])})
    assert sorted(layer.tables) == ["table_0", "words"]  # the unnamed table gets a name
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 6, B)
    ids = {"query": tf.RaggedTensor.from_row_lengths(rng.integers(0, 50, lengths.sum()), lengths),
           "recent": tf.RaggedTensor.from_row_lengths(rng.integers(0, 50, lengths.sum()), lengths[::-1]),
           "page": tf.constant(rng.integers(0, 20, B))}
    start = {k: v.copy() for k, v in layer.get_embedding_tables().items()}
    variables = {k: tf.Variable(v) for k, v in start.items()}

    def reference():
        q = tf.gather(variables["words"], ids["query"])
        sqrtn = tf.reduce_sum(q, 1) / tf.maximum(tf.sqrt(tf.cast(ids["query"].row_lengths(), tf.float32)), 1.0)[:, None]
        recent = tf.gather(variables["words"], ids["recent"][:, :3]).to_tensor(shape=[B, 3, 4])
        return {"page": tf.gather(variables["table_0"], ids["page"]), "query": sqrtn, "recent": recent}

    target = {k: tf.constant(rng.normal(size=v.shape), tf.float32) for k, v in reference().items()}
    got = layer(ids)
    for key in target:
        np.testing.assert_allclose(got[key], reference()[key], rtol=1e-6, atol=1e-6)
    with tf.GradientTape() as tape:
        loss = sum(tf.reduce_sum(reference()[k] * target[k]) for k in target)
    names = sorted(variables)
    grads = tape.gradient(loss, [variables[n] for n in names])
    for n, g in zip(names, grads):
        init = 0.2 if n == "table_0" else 0.1
        keras.optimizers.Adagrad(0.3, initial_accumulator_value=init).apply([tf.convert_to_tensor(g)], [variables[n]])
    with tf.GradientTape() as tape:
        out = layer(ids, training=True)
        loss = sum(tf.reduce_sum(out[k] * target[k]) for k in target)
    sok.optimizers.SGD(1.0).apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
    for n, value in layer.get_embedding_tables().items():
        np.testing.assert_allclose(value, variables[n].numpy(), rtol=1e-5, atol=1e-6)
        assert not np.array_equal(value, start[n])


def test_model_fit_trains_each_table_with_its_own_optimizer_whatever_compile_is_given():
    """In model.fit a sok_tutorial optimizer hands each table to its TableConfig optimizer, and a Keras
    optimizer, which would update the tables itself, is refused; with fused=True each table is
    updated by its own optimizer in the backward pass, so the model may be compiled with a Keras
    optimizer, as Keras-RS's examples are: the same run (ours train the dense layers with Keras' maths)."""
    data = batch(seed=4)[0]
    x = {"item": data["item"].numpy(), "friends": data["context"][0].numpy()}
    y = np.random.default_rng(4).normal(size=(B, 1)).astype("float32")

    def fit(optimizer, fused=False):
        keras.utils.set_random_seed(4)
        items = TableConfig("items", 40, 4, optimizer=keras.optimizers.Adagrad(0.1))
        users = TableConfig("users", 30, 3, optimizer="ftrl")
        layer = from_keras_rs({"item": FeatureConfig("item", items, (B,), (B, 4)),
                               "friends": FeatureConfig("friends", users, (B, 5), (B, 3))}, fused=fused)
        inputs = {k: keras.Input(v.shape[1:], dtype="int64", name=k) for k, v in x.items()}
        out = layer(inputs)
        head = keras.layers.Dense(1)
        m = keras.Model(inputs, head(keras.ops.concatenate([out["item"], out["friends"]], 1)))
        m.compile(optimizer=optimizer, loss="mse")
        losses = m.fit(x, y, batch_size=4, epochs=1, verbose=0).history["loss"]
        return layer, head, losses

    layer, head, losses = fit(sok.optimizers.Adam(0.01))
    tables = layer.tables
    assert [type(tables[n].optimizer).__name__ for n in ("items", "users")] == ["Adagrad", "Ftrl"]
    assert [int(tables[n].optimizer.iterations) for n in ("items", "users")] == [2, 2]
    with pytest.raises(ValueError, match="has its own optimizer.*sok_tutorial.optimizers.*fused=True"):
        fit("adam")
    for optimizer in (keras.optimizers.Adam(0.01), sok.optimizers.Adam(0.01)):
        fused_layer, fused_head, fused_losses = fit(optimizer, fused=True)
        assert [int(fused_layer.tables[n].optimizer.iterations) for n in ("items", "users")] == [2, 2]
        np.testing.assert_allclose(fused_losses, losses, rtol=1e-6)
        for name, value in layer.get_embedding_tables().items():
            np.testing.assert_allclose(fused_layer.get_embedding_tables()[name], value, atol=1e-6)
        np.testing.assert_allclose(fused_head.get_weights()[0], head.get_weights()[0], atol=1e-6)


class Tower(keras.Model):
    """A model as Keras-RS's examples write one: the embedding layer, its activations concatenated, a
    dense head; no `build`, so Keras traces it for shapes first (in a stateless scope)."""

    def __init__(self, embedding):
        super().__init__()
        self.embedding, self.head = embedding, keras.layers.Dense(1, kernel_initializer="ones")

    def call(self, features):
        out = self.embedding(features)
        return self.head(keras.ops.concatenate([out[name] for name in sorted(out)], axis=1))


def test_placement_auto_shards_over_replicas_like_one_device(strategy_of):
    """placement="auto" goes to the planner: under 2 replicas and a budget that a whole copy exceeds,
    the big table is sharded, a "default_device" table stays whole on each replica; model.fit of a
    model never called before then trains both as one device does (tables start equal: initial
    values are drawn per key)."""
    def cfg():
        big = TableConfig("big", 2000, 8, combiner="sum", optimizer=keras.optimizers.Adagrad(0.1))
        small = TableConfig("small", 10, 4, optimizer="sgd", placement="default_device")
        return {"a": FeatureConfig("a", big, (16,), (16, 8)), "b": FeatureConfig("b", big, (16, 3), (16, 8)),
                "c": FeatureConfig("c", small, (16,), (16, 4))}

    rng = np.random.default_rng(5)
    x = {"a": rng.integers(0, 2000, 32), "b": rng.integers(0, 2000, (32, 3)), "c": rng.integers(0, 10, 32)}
    y = rng.normal(size=(32, 1)).astype("float32")

    def trained(layer, scope):
        with scope:
            model = Tower(layer)
            model.compile(optimizer=sok.optimizers.Adam(0.01), loss="mse")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
        return layer.get_embedding_tables()

    strategy = strategy_of(2)
    with strategy.scope():
        sharded = from_keras_rs(cfg(), memory_per_replica=100_000)
    assert {p.name: p.sharding for p in sharded.plan} == {"big": "row"}
    after = trained(sharded, strategy.scope())
    assert sharded.tables["big"].num_shards == 2 and sharded.tables["small"].num_shards == 1
    expected = trained(from_keras_rs(cfg()), tf.distribute.get_strategy().scope())
    start = from_keras_rs(cfg()).get_embedding_tables()
    for name in expected:
        np.testing.assert_allclose(after[name], expected[name], rtol=1e-5, atol=1e-6)
        assert not np.array_equal(after[name], start[name])
    with pytest.raises(ValueError, match="placed for 2 replicas"):  # built outside the strategy it was planned for
        with strategy.scope():
            layer = from_keras_rs(cfg(), memory_per_replica=100_000)
        layer.build(None)


class Ranker(keras.Model):
    def __init__(self, layer):
        super().__init__()
        self.embedding, self.head = layer, keras.layers.Dense(1)

    def call(self, x):
        out = self.embedding(x)
        return self.head(keras.ops.concatenate([out["user"], out["item"]], 1))


def test_our_options_dynamic_forgetting_tables_deltas_and_bfloat16(tmp_path):
    """What Keras-RS does not have, switched on by keyword: ids beyond vocabulary_size, LRU eviction with
    change tracking and delta exports, and (for one table) bfloat16 storage."""
    users = TableConfig("users", 100, 4, optimizer="adagrad")
    items = TableConfig("items", 50, 4, optimizer="sgd")
    layer = from_keras_rs({"user": FeatureConfig("user", users, (16,), (16, 4)),
                           "item": FeatureConfig("item", items, (16,), (16, 4))},
                          dynamic=True, capacity=64, eviction_policy="lru",
                          tables={"items": {"storage_dtype": "bfloat16"}})
    model = Ranker(layer)
    model.compile(optimizer=sok.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(6)
    x = {"user": rng.integers(0, 2**40, 16), "item": rng.integers(10**12, 10**12 + 40, 16)}
    model.fit(x, np.ones((16, 1), np.float32), batch_size=16, verbose=0)
    tables = layer.tables
    assert tables["users"].dynamic and tables["users"].lifecycle.eviction_policy == "lru"
    assert tables["users"].capacity == 64 and tables["items"].variable.dtype == "bfloat16"
    assert set(np.asarray(x["user"]).tolist()) <= set(tables["users"].export()["keys"].tolist())
    export_model_tables(model, tmp_path / "serving")
    for _ in range(5):  # new users: the table evicts to take them
        x2 = {"user": rng.integers(0, 2**40, 16), "item": x["item"]}
        model.fit(x2, np.ones((16, 1), np.float32), batch_size=16, verbose=0)
    assert tables["users"].evictions > 0
    export_delta(model, tmp_path / "delta", since=tmp_path / "serving")
    summary = apply_delta(tmp_path / "serving", tmp_path / "delta")
    users_summary = next(v for k, v in summary.items() if k.endswith("users"))
    assert users_summary["evicted"] > 0 and users_summary["changed"] > 0, summary
    with pytest.raises(ValueError, match="dynamic"):
        layer.get_embedding_tables()


# ------------------------------------------------------------------ bad input
def test_a_feature_naming_a_table_not_in_the_structure():
    items = TableConfig("items", 10, 2)
    ok = from_keras_rs({"a": FeatureConfig("a", items, (4,), (4, 2)), "b": FeatureConfig("b", "items", (4,), (4, 2))})
    assert list(ok.tables) == ["items"]  # a name where a TableConfig goes: the table of that name
    with pytest.raises(ValueError, match=r"feature 'b' \(at b\) names table 'users', which is not in the structure"):
        from_keras_rs({"a": FeatureConfig("a", items, (4,), (4, 2)), "b": FeatureConfig("b", "users", (4,), (4, 2))})
    with pytest.raises(TypeError, match="feature 'a' .*expected a TableConfig"):
        from_keras_rs({"a": FeatureConfig("a", None, (4,), (4, 2))})


def test_two_tables_with_one_name():
    with pytest.raises(ValueError, match=r"two tables are named 'items' \(features \['a'\] use one, 'b' the other"):
        from_keras_rs({"a": FeatureConfig("a", TableConfig("items", 10, 2), (4,), (4, 2)),
                       "b": FeatureConfig("b", TableConfig("items", 10, 2), (4,), (4, 2))})


@pytest.mark.parametrize("optimizer, message", [
    (keras.optimizers.RMSprop(), "optimizer=keras.src.optimizers.rmsprop.RMSprop is not supported"),
    (keras.optimizers.AdamW(), "AdamW is not supported"),
    (keras.optimizers.Adam(weight_decay=0.01), "weight_decay=0.01"),
    ("adamax", "optimizer='adamax' is not supported"),
    (tf.tpu.experimental.embedding.Adam(lazy_adam=False), "lazy_adam=False"),
    (tf.tpu.experimental.embedding.SGD(clip_weight_max=1.0), "clip_weight_max=1.0"),
    (tf.tpu.experimental.embedding.AdagradMomentum(0.1), "AdagradMomentum is not supported"),
])
def test_an_optimizer_they_allow_and_we_do_not(optimizer, message):
    with pytest.raises(ValueError, match=f"table 'items': .*{message}"):
        from_keras_rs(FeatureConfig("a", TableConfig("items", 10, 2, optimizer=optimizer), (4,), (4, 2)))


def test_a_combiner_or_initializer_without_an_equivalent():
    with pytest.raises(ValueError, match="table 'items': combiner='max' is not supported"):
        from_keras_rs([FeatureConfig("a", TableConfig("items", 10, 2, combiner="max"), (4,), (4, 2))])
    with pytest.raises(ValueError, match="table 'items': .*Orthogonal"):
        from_keras_rs([FeatureConfig("a", TableConfig("items", 10, 2, initializer="orthogonal"), (4,), (4, 2))])
    with pytest.raises(ValueError, match="table 'items': unknown option"):
        from_keras_rs([FeatureConfig("a", TableConfig("items", 10, 2), (4,), (4, 2))], evict="lru")
    with pytest.raises(ValueError, match=r"tables: no tables named \['users'\]"):
        from_keras_rs([FeatureConfig("a", TableConfig("items", 10, 2), (4,), (4, 2))], tables={"users": {}})


def test_input_shapes_that_do_not_match_the_declared_ones():
    items = TableConfig("items", 10, 2)
    layer = from_keras_rs({"a": FeatureConfig("a", items, (4,), (4, 2)),
                           "b": FeatureConfig("b", items, (4, 5), (4, 2))})
    with pytest.raises(ValueError, match=r"feature 'b' \(at b\): ids of shape \(4, 3\) do not match its input_shape"):
        layer({"a": tf.constant([1, 2, 3, 4]), "b": tf.zeros([4, 3], tf.int64)})
    assert not layer.built  # nothing half-made
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['c'\]"):
        layer({"a": tf.constant([1, 2, 3, 4]), "c": tf.zeros([4, 5], tf.int64)})
    with pytest.raises(ValueError, match="feature 'b' .*output_shape"):
        from_keras_rs({"b": FeatureConfig("b", items, (4, 5), (4, 3))})  # width 3, the table's is 2
    layer = from_keras_rs({"b": FeatureConfig("b", items, (4, 5), (4, 5, 2))})
    with pytest.raises(ValueError, match=r"feature 'b' \(at b\): ids of shape \(4, 5\) give activations of shape"):
        layer({"b": tf.zeros([4, 5], tf.int64)})
    layer = from_keras_rs({"b": FeatureConfig("b", items, (4, None), (4, 2))})
    with pytest.raises(TypeError, match="feature 'b' .*weights must be ragged like the ids"):
        layer({"b": tf.ragged.constant([[1], [2, 3]])}, {"b": tf.ones([2, 2])})
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table 'items' \(features \['b'\]\): an id lies outside"):
        layer({"b": tf.ragged.constant([[1], [12]])})


def test_without_keras_rs_the_library_imports_and_the_error_names_the_extra(monkeypatch):
    fc = FeatureConfig("a", TableConfig("items", 10, 2), (4,), (4, 2))
    monkeypatch.setitem(sys.modules, "keras_rs", None)  # `import keras_rs` now fails
    module = importlib.reload(importlib.import_module("sok_tutorial.embedding.keras_rs"))
    with pytest.raises(ImportError, match=r"pip install 'sok-tutorial\[keras-rs\]'"):
        module.from_keras_rs({"a": fc})
    tpu = tf.tpu.experimental.embedding  # TensorFlow's own configs need no Keras-RS
    layer = module.from_keras_rs({"a": tpu.FeatureConfig(tpu.TableConfig(10, 2, name="t"))})
    assert layer({"a": tf.constant([1, 2])})["a"].shape == (2, 2)
