from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.embedding import VocabularyExhausted, keyed_initial_values  # noqa: E402
from sok_tutorial.embedding.initializers import init_spec  # noqa: E402

EXTREME = [0, -1, 2**63 - 1, -(2**63), 2**40]


def row_of(layer, keys) -> dict:
    """{key: row} through the layer's table (rows of keys it holds)."""
    keys = np.asarray(list(keys), np.int64)
    rows, found = layer.table.rows(tf.constant(keys), insert=False)
    assert found is None or bool(tf.reduce_all(found))
    return dict(zip(keys.tolist(), rows.numpy().tolist()))


def random_bags(rng: np.random.Generator, batch: int, slots: int, max_nnz: int, keys: np.ndarray) -> list:
    """Nested lists [batch][slot][key]: empty slots and repeated keys within a bag included."""
    out = []
    for _ in range(batch):
        row = []
        for _ in range(slots):
            n = int(rng.integers(0, max_nnz + 1))
            bag = list(rng.choice(keys, n))
            if n >= 2 and rng.random() < 0.3:
                bag[1] = bag[0]  # a duplicate within the bag
            row.append([int(k) for k in bag])
        out.append(row)
    return out


def reference(bags: list, table: np.ndarray, row_of: dict, combiner: str) -> np.ndarray:
    out = np.zeros((len(bags), len(bags[0]), table.shape[1]))
    for b, row in enumerate(bags):
        for s, bag in enumerate(row):
            if bag:
                vecs = np.stack([table[row_of[k]] for k in bag])
                out[b, s] = vecs.sum(0) / DIVISOR[combiner](len(bag))
    return out


DIVISOR = {"sum": lambda n: 1.0, "mean": float, "sqrtn": np.sqrt}  # what a bag's sum of n vectors is divided by


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("use_hashtable", [True, False])
def test_forward_and_backward_match_numpy(combiner, use_hashtable):
    rng = np.random.default_rng(0)
    keys = np.array(EXTREME + list(rng.integers(-10**15, 10**15, 40)), np.int64) if use_hashtable \
        else np.arange(60, dtype=np.int64)
    bags = random_bags(rng, 16, 5, 4, keys)
    layer = sok.DistributedEmbedding(combiner, 200, 3, slot_num=5, max_nnz=4, use_hashtable=use_hashtable)
    ragged = tf.ragged.constant(bags, dtype=tf.int64, ragged_rank=2)
    with tf.GradientTape() as tape:
        out = layer(ragged, training=True)
        weights = tf.constant(rng.random(out.shape), tf.float32)
        loss = tf.reduce_sum(out * weights)
    grad = tape.gradient(loss, layer.embedding_variable)
    assert isinstance(grad, tf.IndexedSlices)
    table = layer.embedding_variable.numpy()
    rows = row_of(layer, {k for row in bags for bag in row for k in bag})
    np.testing.assert_allclose(out.numpy(), reference(bags, table, rows, combiner), rtol=1e-6, atol=1e-7)
    expected = np.zeros_like(table)
    w = weights.numpy()
    for b, row in enumerate(bags):
        for s, bag in enumerate(row):
            for k in bag:
                expected[rows[k]] += w[b, s] / DIVISOR[combiner](len(bag))
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_matches_tf_embedding_lookup_sparse(combiner):
    rng = np.random.default_rng(1)
    layer = sok.DistributedEmbedding(combiner, 50, 6, slot_num=1, max_nnz=5, use_hashtable=False)
    bags = [[[int(k) for k in rng.integers(0, 50, rng.integers(1, 6))]] for _ in range(32)]
    out = layer(tf.ragged.constant(bags, dtype=tf.int64, ragged_rank=2))[:, 0]
    sparse = tf.ragged.constant([b[0] for b in bags], dtype=tf.int64).to_sparse()
    ref = tf.nn.embedding_lookup_sparse(layer.embedding_variable.value, sparse, None, combiner=combiner)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)


def tf_lookup_sparse(table: tf.Variable, bags: list, row_of: dict, combiner: str) -> tf.Tensor:
    """``tf.nn.embedding_lookup_sparse`` over every (example, slot) bag, ``[batch, slots, dim]``.

    Its segment ids are the sparse row indices with no segment count, so a trailing empty bag would
    get no output row at all: only the non-empty bags go in (renumbered 0..m-1), and their vectors
    are scattered back into zeros, which is what an empty bag combines to."""
    flat = [bag for row in bags for bag in row]
    full = [i for i, bag in enumerate(flat) if bag]
    rows = [[row_of[k] for k in flat[i]] for i in full]
    sparse = tf.ragged.constant(rows, dtype=tf.int64).to_sparse()
    combined = tf.nn.embedding_lookup_sparse(table, sparse, None, combiner=combiner)
    out = tf.scatter_nd(tf.constant(full, tf.int64)[:, None], combined, [len(flat), table.shape[1]])
    return tf.reshape(out, [len(bags), len(bags[0]), table.shape[1]])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("use_hashtable", [False, True])
def test_forward_and_gradients_match_tf_embedding_lookup_sparse(combiner, use_hashtable):
    """Random ragged bags with empty slots (a whole empty last example too) and repeated keys; row ids
    without a hash table, extreme int64 keys mapped to rows through the layer's vocabulary with one."""
    rng = np.random.default_rng(7)
    keys = np.array(EXTREME + list(rng.integers(-(2**63), 2**63 - 1, 40, dtype=np.int64)), np.int64) \
        if use_hashtable else np.arange(0, 300, 7, dtype=np.int64)
    bags = random_bags(rng, 24, 4, 5, keys)
    bags[0][0] = [int(keys[1]), int(keys[2]), int(keys[1]), int(keys[1])]
    bags[-1] = [[] for _ in bags[-1]]
    assert sum(not bag for row in bags[:-1] for bag in row) > 0
    layer = sok.DistributedEmbedding(combiner, 300, 5, slot_num=4, max_nnz=5, use_hashtable=use_hashtable)
    weights = tf.constant(rng.normal(size=(24, 4, 5)), tf.float32)
    with tf.GradientTape() as tape:
        out = layer(tf.ragged.constant(bags, dtype=tf.int64, ragged_rank=2), training=True)
        loss = tf.reduce_sum(out * weights)
    grad = tape.gradient(loss, layer.embedding_variable)
    assert isinstance(grad, tf.IndexedSlices)

    table = tf.Variable(layer.embedding_variable.numpy())  # after the call: rows of new keys exist
    if use_hashtable:
        assert set(layer.table.export()["keys"].tolist()) == {k for row in bags for bag in row for k in bag}
        assert {0, -1, 2**63 - 1, -(2**63)} <= set(layer.table.export()["keys"].tolist())
    rows = row_of(layer, keys) if not use_hashtable else row_of(layer, {k for row in bags for bag in row for k in bag})
    with tf.GradientTape() as tape:
        ref = tf_lookup_sparse(table, bags, rows, combiner)
        ref_loss = tf.reduce_sum(ref * weights)
    ref_grad = tape.gradient(ref_loss, table)

    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out.numpy(), reference(bags, table.numpy(), rows, combiner), rtol=1e-6, atol=1e-7)
    assert np.all(out.numpy()[-1] == 0)
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), tf.convert_to_tensor(ref_grad).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_sparse_tensor_inputs_in_both_layouts():
    layer = sok.DistributedEmbedding("sum", 100, 2, slot_num=2, max_nnz=3, use_hashtable=False)
    ragged = tf.ragged.constant([[[1, 2], [3]], [[], [4, 5, 6]]], dtype=tf.int64, ragged_rank=2)
    expected = layer(ragged).numpy()
    sparse3 = ragged.to_sparse()
    np.testing.assert_allclose(layer(sparse3).numpy(), expected)
    sparse2 = tf.sparse.reshape(sparse3, [4, 3])
    np.testing.assert_allclose(layer(sparse2).numpy(), expected)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_dense_keys_equal_the_ragged_path(combiner):
    rng = np.random.default_rng(3)
    layer = sok.DistributedEmbedding(combiner, 300, 4, slot_num=3, max_nnz=2, use_hashtable=False)
    one = rng.integers(0, 300, (8, 3)).astype(np.int64)
    two = rng.integers(0, 300, (8, 3, 2)).astype(np.int64)
    for dense in (one, two):
        ragged = tf.RaggedTensor.from_tensor(tf.constant(dense if dense.ndim == 3 else dense[:, :, None]))
        with tf.GradientTape(persistent=True) as tape:
            a, b = layer(tf.constant(dense), training=True), layer(ragged, training=True)
            la, lb = tf.reduce_sum(a * a), tf.reduce_sum(b * b)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
        ga, gb = (tf.convert_to_tensor(tape.gradient(loss, layer.embedding_variable)) for loss in (la, lb))
        np.testing.assert_allclose(ga.numpy(), gb.numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="slot_num=3"):
        layer(tf.constant(rng.integers(0, 300, (8, 4)).astype(np.int64)))
    with pytest.raises(ValueError, match="max_nnz=2"):
        layer(tf.constant(rng.integers(0, 300, (8, 3, 5)).astype(np.int64)))


def test_dense_layer_equals_gather_and_dynamic_input():
    layer = sok.All2AllDenseEmbedding(1000, 5, slot_num=3, nnz_per_slot=2)
    keys = tf.constant(np.array(EXTREME + [7]).reshape(1, 3, 2), tf.int64)
    out = layer(keys, training=True)
    rows = row_of(layer, keys.numpy().ravel())
    np.testing.assert_array_equal(out.numpy().reshape(6, 5), layer.embedding_variable.numpy()[[rows[k] for k in
                                                                                               keys.numpy().ravel()]])
    flex = sok.All2AllDenseEmbedding(10, 3, slot_num=1, nnz_per_slot=1, dynamic_input=True, use_hashtable=False)
    assert flex(tf.constant([1, 2, 3, 4, 5], tf.int64)).shape == (5, 3)


def test_keys_alike_in_their_low_32_bits_keep_rows_of_their_own():
    """A step whose keys all lie in [0, 2**31) is deduplicated as int32; a step with any other key
    must not be, or 3 and 2**32 + 3 (and 2**31 and -2**31) would share a row."""
    layer = sok.All2AllDenseEmbedding(16, 3, slot_num=1, nnz_per_slot=6)
    spec = init_spec("random_uniform")
    for keys, size in (([3, 2**32 + 3, 2**31, -(2**31), 3, 2**31 - 1], 5), ([2**31 - 1, 3, 9, 3, 0, 9], 7)):
        out = layer(tf.constant([[keys]], tf.int64), training=True).numpy().reshape(6, 3)
        np.testing.assert_array_equal(out, keyed_initial_values(np.array(keys), 3, spec))
        assert layer.table.size == size


def test_any_width_and_key_seeded_initial_values():
    for dim in (1, 3, 17):
        layer = sok.All2AllDenseEmbedding(10, dim, slot_num=1, nnz_per_slot=1)
        vec = layer(tf.constant([[[123456789]]], tf.int64), training=True).numpy().reshape(dim)
        np.testing.assert_array_equal(vec, keyed_initial_values(np.array([123456789]), dim,
                                                                init_spec("random_uniform"))[0])
        assert np.all(np.abs(vec) <= 0.05)
    static = sok.All2AllDenseEmbedding(10, 4, slot_num=1, nnz_per_slot=1, use_hashtable=False,
                                       embedding_initializer=keras.initializers.RandomNormal(stddev=0.1, seed=3))
    static.build()
    np.testing.assert_array_equal(static.embedding_variable.numpy(),
                                  keyed_initial_values(np.arange(10), 4, init_spec(keras.initializers.RandomNormal(
                                      stddev=0.1, seed=3))))


def test_inference_never_grows_the_vocabulary():
    layer = sok.All2AllDenseEmbedding(10, 2, slot_num=1, nnz_per_slot=2)
    layer(tf.constant([[[5, 6]]], tf.int64), training=True)
    out = layer(tf.constant([[[5, 99]]], tf.int64), training=False).numpy()
    assert layer.table.size == 2 and np.all(out[0, 0, 1] == 0) and np.any(out[0, 0, 0] != 0)


@keras.saving.register_keras_serializable(package="tests")
class BagModel(keras.Model):
    """Ragged keys reach `call` unchanged in a subclassed model (functional models densify them)."""

    def __init__(self, hashtable: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.hashtable = hashtable
        self.embedding = sok.DistributedEmbedding("mean", 500, 4, slot_num=4, max_nnz=3, use_hashtable=hashtable)
        self.head = keras.layers.Dense(1, activation="sigmoid")

    def call(self, keys):
        return self.head(keras.ops.reshape(self.embedding(keys), [-1, 16]))

    def get_config(self):
        return {**super().get_config(), "hashtable": self.hashtable}

    def build_from_config(self, config):  # ragged inputs: build by calling on one example batch
        self(tf.ragged.constant([[[0]] * 4], dtype=tf.int64, ragged_rank=2), training=False)


def _model(hashtable: bool) -> keras.Model:
    return BagModel(hashtable)


def _data(n: int, seed: int, key_range: int = 400):
    rng = np.random.default_rng(seed)
    bags = random_bags(rng, n, 4, 3, rng.integers(0, key_range, 300))
    labels = np.array([[float(sum(map(len, row)) % 2)] for row in bags], np.float32)
    return tf.ragged.constant(bags, dtype=tf.int64, ragged_rank=2), labels


def test_model_fit_with_sparse_adam_lowers_the_loss():
    keys, labels = _data(512, 0)
    model = _model(True)
    model.compile(sok.optimizers.Adam(0.05), "binary_crossentropy")
    ds = tf.data.Dataset.from_tensor_slices((keys, labels)).batch(64)
    history = model.fit(ds, epochs=6, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] - 0.05


def test_custom_loop_in_tf_function_with_two_optimizers():
    keys, labels = _data(256, 1)
    model = _model(True)
    emb_opt, dense_opt = sok.optimizers.LazyAdam(0.05), keras.optimizers.Adam(0.05)
    loss_fn = keras.losses.BinaryCrossentropy()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        emb_vars, other_vars = sok.split_embedding_variable_from_others(model.trainable_variables)
        emb_grads, other_grads = tape.gradient(loss, [emb_vars, other_vars])
        with sok.OptimizerScope(emb_vars):
            emb_opt.apply(emb_grads, emb_vars)
        dense_opt.apply(other_grads, other_vars)
        return loss

    losses = [float(step(keys[i:i + 64], labels[i:i + 64])) for _ in range(5) for i in range(0, 256, 64)]
    emb_vars, others = sok.split_embedding_variable_from_others(model.trainable_variables)
    assert len(emb_vars) == 1 and len(others) == 2
    assert np.mean(losses[-4:]) < np.mean(losses[:4])


def _per_key(layer) -> dict:
    copies = [c.numpy() for c in getattr(layer.embedding_variable.value, "values", [layer.embedding_variable.value])]
    assert all(np.array_equal(copies[0], c) for c in copies[1:]), "replicas' tables differ"
    rows = layer.table.export()
    return dict(zip(rows["keys"].tolist(), rows["vectors"]))


def _assert_same_vectors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, vec in a.items():  # rows may be assigned differently; each key's vector must agree
        np.testing.assert_allclose(b[key], vec, rtol=1e-5, atol=1e-6)


def test_fit_under_mirrored_strategy_equals_one_device(strategy_of):
    rng = np.random.default_rng(2)
    x = rng.integers(-10**12, 10**12, (256, 4))
    y = (x[:, :1] % 3 == 0).astype("float32")
    results = []
    for n in (1, 2):
        keras.utils.set_random_seed(0)
        with strategy_of(n).scope():
            inp = keras.Input([4], dtype="int64")
            emb = sok.DistributedEmbedding("sum", 2000, 4, slot_num=4, max_nnz=1, name="emb")(inp)
            model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Reshape([16])(emb)))
            model.compile(sok.optimizers.SGD(0.5), "binary_crossentropy")
        history = model.fit(x, y, batch_size=64, epochs=2, verbose=0, shuffle=False)
        results.append((history.history["loss"], _per_key(model.get_layer("emb"))))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
    _assert_same_vectors(results[0][1], results[1][1])


def test_custom_loop_with_ragged_keys_under_mirrored_strategy(strategy_of):
    keys, labels = _data(256, 6)
    results = []
    for n in (1, 2):
        keras.utils.set_random_seed(0)
        strategy = strategy_of(n)
        with strategy.scope():
            model = _model(True)
            model(keys[:2])
            opt = sok.optimizers.LazyAdam(0.05)
            opt.build(model.trainable_variables)
        loss_fn = keras.losses.BinaryCrossentropy(reduction=None)

        @tf.function
        def step(x, y):
            def replica(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=64)
                opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
                return loss
            return strategy.reduce("SUM", strategy.run(replica, args=(x, y)), axis=None)

        data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((keys, labels)).batch(64))
        losses = [float(step(a, b)) for _ in range(2) for a, b in data]
        results.append((losses, _per_key(model.embedding)))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
    _assert_same_vectors(results[0][1], results[1][1])


def test_save_and_load_restore_table_and_vocabulary(tmp_path):
    keys, labels = _data(128, 3)
    model = _model(True)
    model.compile(sok.optimizers.Adam(0.05), "binary_crossentropy")
    model.fit(keys, labels, batch_size=32, epochs=1, verbose=0)
    before = model.predict(keys, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(keys, verbose=0), before)
    a, b = model.embedding.table.export(), loaded.embedding.table.export()
    assert np.array_equal(a["keys"], b["keys"]) and np.array_equal(a["vectors"], b["vectors"])
    model.save_weights(tmp_path / "w.weights.h5")
    fresh = _model(True)
    fresh(keys[:2], training=False)  # build
    fresh.load_weights(tmp_path / "w.weights.h5")
    np.testing.assert_array_equal(fresh.predict(keys, verbose=0), before)


def test_functional_models_take_sparse_keys():
    keys, labels = _data(128, 5)
    inp = keras.Input([4, None], dtype="int64", sparse=True)
    emb = sok.DistributedEmbedding("sum", 500, 4, slot_num=4, max_nnz=3)(inp)
    model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Reshape([16])(emb)))
    model.compile(sok.optimizers.Adagrad(0.1), "binary_crossentropy")
    history = model.fit(tf.data.Dataset.from_tensor_slices((keys.to_sparse(), labels)).batch(32), epochs=3, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_group_lookup_matches_separate_lookups():
    rng = np.random.default_rng(4)
    tables = [tf.Variable(rng.random((n, d)), dtype=tf.float32) for n, d in [(30, 4), (50, 4), (20, 2)]]
    ids = [tf.ragged.constant([list(rng.integers(0, t.shape[0], rng.integers(0, 4))) for _ in range(9)],
                              dtype=tf.int64) for t in tables]
    combiners = ["sum", "sqrtn", "mean"]
    fused = sok.group_embedding_lookup_sparse(tables, ids, combiners)
    loop = sok.group_embedding_lookup_sparse(tables, ids, combiners, fused=False)
    for t, i, c, f, lo in zip(tables, ids, combiners, fused, loop):
        np.testing.assert_allclose(f.numpy(), lo.numpy(), rtol=1e-6)
        ref = tf.nn.embedding_lookup_sparse(t, i.to_sparse(), None, combiner=c).numpy()
        ref = np.concatenate([ref, np.zeros((9 - len(ref), ref.shape[1]), ref.dtype)])  # TF drops trailing empty rows
        np.testing.assert_allclose(f.numpy(), ref, rtol=1e-6)
    with pytest.raises(ValueError, match="combiners\\[0\\]='max'"):
        sok.group_embedding_lookup_sparse(tables[:1], ids[:1], ["max"])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="combiner='max'"):
        sok.DistributedEmbedding("max", 10, 4, slot_num=1, max_nnz=1)
    with pytest.raises(ValueError, match="embedding_vec_size=0"):
        sok.All2AllDenseEmbedding(10, 0, slot_num=1, nnz_per_slot=1)
    with pytest.raises(ValueError, match="embedding_initializer=.*not supported"):
        sok.All2AllDenseEmbedding(10, 2, slot_num=1, nnz_per_slot=1, embedding_initializer="orthogonal")
    dist = sok.DistributedEmbedding("sum", 10, 2, slot_num=2, max_nnz=2)
    with pytest.raises(Exception, match="more keys than max_nnz=2"):
        dist(tf.ragged.constant([[[1, 2, 3], [4]]], dtype=tf.int64, ragged_rank=2))
    with pytest.raises(TypeError, match="keys must be integers"):
        dist(tf.ragged.constant([[[1.5], [2.0]]], dtype=tf.float32, ragged_rank=2))
    with pytest.raises(ValueError, match="dense keys must be"):
        dist(tf.constant([1, 2], tf.int64))
    with pytest.raises(Exception, match="every row needs slot_num=2"):
        dist(tf.ragged.constant([[[1], [2], [3]]], dtype=tf.int64, ragged_rank=2))
    dense = sok.All2AllDenseEmbedding(10, 2, slot_num=2, nnz_per_slot=1, use_hashtable=False)
    with pytest.raises(ValueError, match="expected \\[batch, 2, 1\\]"):
        dense(tf.zeros([1, 3, 1], tf.int64))
    with pytest.raises(Exception, match="key out of range \\[0, 10\\)"):
        dense(tf.constant([[[3], [10]]], tf.int64))
    with pytest.raises(Exception, match="negative key"):
        dense(tf.constant([[[3], [-1]]], tf.int64))
    for wraps in (2**32 + 3, -(2**32) + 3):  # row 3 once cast to int32 (the table deduplicates row ids so)
        with pytest.raises(Exception, match="key out of range \\[0, 10\\)"):
            dense(tf.constant([[[3], [wraps]]], tf.int64), training=True)
    small = sok.All2AllDenseEmbedding(3, 2, slot_num=1, nnz_per_slot=4)
    with pytest.raises(VocabularyExhausted, match="vocabulary exhausted: 4 distinct keys need rows but "
                                                  "max_vocabulary_size_per_gpu=3"):
        small(tf.constant([[[1, 2, 3, 4]]], tf.int64), training=True)
