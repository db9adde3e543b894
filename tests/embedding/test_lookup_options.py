"""Lookup options of `DistributedEmbedding` and `group_embedding_lookup_sparse`: the "sqrtn"
combiner, per-key weights (``sp_weights``), and ``combiner=None`` (each key's vector, ragged or
padded with a mask). References: NumPy, and ``tf.nn.embedding_lookup_sparse`` on a static table."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.embedding.combiners import COMBINERS  # noqa: E402

ROWS, DIM, SLOTS, NNZ = 60, 5, 3, 4


def bags_and_weights(seed: int, batch: int = 12, full: bool = False) -> tuple[list, list]:
    """Nested lists [batch][slot][key] of row ids (empty bags and repeated keys unless `full`) and
    weights of the same layout in [0.2, 2)."""
    rng = np.random.default_rng(seed)
    bags = [[[int(k) for k in rng.integers(0, ROWS, NNZ if full else rng.integers(0, NNZ + 1))]
             for _ in range(SLOTS)] for _ in range(batch)]
    if not full:
        bags[0][0] = [5, 5, 9]
        bags[-1] = [[] for _ in range(SLOTS)]  # a trailing empty sample
    weights = [[[float(w) for w in rng.uniform(0.2, 2.0, len(bag))] for bag in row] for row in bags]
    return bags, weights


def as_layout(bags: list, weights: list, layout: str) -> tuple:
    """(keys, weights) as ragged, sparse or dense tensors of the same structure."""
    keys = tf.ragged.constant(bags, dtype=tf.int64, ragged_rank=2)
    w = tf.ragged.constant(weights, dtype=tf.float32, ragged_rank=2)
    if layout == "sparse":
        return keys.to_sparse(), w.to_sparse()
    if layout == "dense":
        return keys.to_tensor(), w.to_tensor()
    return keys, w


def numpy_reference(bags: list, weights: list | None, table: np.ndarray, combiner: str,
                    upstream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(output [batch, slot, dim], gradient of sum(output * upstream) with respect to the table)."""
    out, grad = np.zeros((len(bags), SLOTS, table.shape[1])), np.zeros_like(table, np.float64)
    for b, row in enumerate(bags):
        for s, bag in enumerate(row):
            w = np.ones(len(bag)) if weights is None else np.asarray(weights[b][s], np.float64)
            divisor = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner] if bag else 1.0
            for k, wk in zip(bag, w):
                out[b, s] += wk * table[k] / divisor
                grad[k] += wk * upstream[b, s] / divisor
    return out, grad


def tf_reference(table: tf.Variable, bags: list, weights: list | None, combiner: str) -> tf.Tensor:
    """``tf.nn.embedding_lookup_sparse`` over every (sample, slot) bag, ``[batch, slot, dim]``: only
    non-empty bags go in (TF gives a trailing empty bag no row), scattered back into zeros."""
    flat = [bag for row in bags for bag in row]
    flat_w = None if weights is None else [w for row in weights for w in row]
    full = [i for i, bag in enumerate(flat) if bag]
    ids = tf.ragged.constant([flat[i] for i in full], dtype=tf.int64).to_sparse()
    sp_w = None if flat_w is None else tf.ragged.constant([flat_w[i] for i in full], tf.float32).to_sparse()
    combined = tf.nn.embedding_lookup_sparse(table, ids, sp_w, combiner=combiner)
    out = tf.scatter_nd(tf.constant(full, tf.int64)[:, None], combined, [len(flat), table.shape[1]])
    return tf.reshape(out, [len(bags), SLOTS, table.shape[1]])


def layer_and_gradient(layer, keys, weights, upstream) -> tuple[np.ndarray, np.ndarray]:
    with tf.GradientTape() as tape:
        out = layer(keys, training=True, sp_weights=weights)
        loss = tf.reduce_sum(out * upstream)
    grad = tape.gradient(loss, layer.embedding_variable)
    assert isinstance(grad, tf.IndexedSlices)
    return out.numpy(), tf.convert_to_tensor(grad).numpy()


@pytest.mark.parametrize("layout", ["ragged", "sparse", "dense"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_layer_matches_numpy_and_tf_embedding_lookup_sparse(combiner, weighted, layout):
    bags, weights = bags_and_weights(0, full=layout == "dense")
    weights = weights if weighted else None
    keys, sp_weights = as_layout(bags, weights or bags, layout)
    layer = sok.DistributedEmbedding(combiner, ROWS, DIM, slot_num=SLOTS, max_nnz=NNZ, use_hashtable=False)
    upstream = tf.constant(np.random.default_rng(1).normal(size=(len(bags), SLOTS, DIM)), tf.float32)
    out, grad = layer_and_gradient(layer, keys, sp_weights if weighted else None, upstream)

    table = tf.Variable(layer.embedding_variable.numpy())
    with tf.GradientTape() as tape:
        ref = tf_reference(table, bags, weights, combiner)
        ref_loss = tf.reduce_sum(ref * upstream)
    ref_grad = tf.convert_to_tensor(tape.gradient(ref_loss, table)).numpy()
    np_out, np_grad = numpy_reference(bags, weights, table.numpy(), combiner, upstream.numpy())
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, np_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, np_grad, rtol=1e-5, atol=1e-6)


def test_weights_of_zero_sum_give_zeros_and_dense_two_d_keys_take_weights():
    layer = sok.DistributedEmbedding("mean", ROWS, DIM, slot_num=2, max_nnz=2, use_hashtable=False)
    keys = tf.ragged.constant([[[1, 2], [3]]], dtype=tf.int64, ragged_rank=2)
    out = layer(keys, sp_weights=tf.ragged.constant([[[1.0, -1.0], [0.0]]], ragged_rank=2)).numpy()
    assert np.all(out == 0)
    table = layer.embedding_variable.numpy()
    sqrtn = sok.DistributedEmbedding("sqrtn", ROWS, DIM, slot_num=2, max_nnz=1, use_hashtable=False)
    sqrtn.build()
    sqrtn.embedding_variable.assign(table)
    out = sqrtn(tf.constant([[4, 7]], tf.int64), sp_weights=tf.constant([[-2.0, 0.5]])).numpy()
    np.testing.assert_allclose(out[0], [-table[4], table[7]], rtol=1e-6)  # w e / |w|


def test_weights_in_tf_function_and_model_fit():
    bags, weights = bags_and_weights(2, batch=64)
    keys, sp_weights = as_layout(bags, weights, "ragged")
    layer = sok.DistributedEmbedding("sqrtn", ROWS, DIM, slot_num=SLOTS, max_nnz=NNZ, use_hashtable=False)
    eager = layer(keys, sp_weights=sp_weights).numpy()
    graph = tf.function(lambda k, w: layer(k, sp_weights=w))(keys, sp_weights).numpy()
    np.testing.assert_allclose(graph, eager, rtol=1e-6)

    class Weighted(keras.Model):
        def __init__(self):
            super().__init__()
            self.embedding = sok.DistributedEmbedding("mean", ROWS, DIM, slot_num=SLOTS, max_nnz=NNZ)
            self.head = keras.layers.Dense(1)

        def call(self, inputs, training=None):
            keys, weights = inputs
            return self.head(tf.reshape(self.embedding(keys, training=training, sp_weights=weights), [-1, 15]))

    labels = np.array([[float(len(row[0]) % 2)] for row in bags], np.float32)
    model = Weighted()
    model.compile(sok.optimizers.Adam(0.05), keras.losses.BinaryCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensor_slices(((keys, sp_weights), labels)).batch(16)
    history = model.fit(data, epochs=4, verbose=0, shuffle=False)
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.parametrize("fused", [False, True])
def test_group_lookup_with_weights_matches_tf(fused):
    rng = np.random.default_rng(3)
    tables = [tf.Variable(rng.random((n, d)), dtype=tf.float32) for n, d in [(30, 4), (50, 4), (20, 2)]]
    ids = [tf.ragged.constant([list(rng.integers(0, t.shape[0], rng.integers(1, 4))) for _ in range(9)],
                              dtype=tf.int64) for t in tables]
    weights = [tf.ragged.constant([list(rng.uniform(0.2, 2.0, n)) for n in i.row_lengths().numpy()], tf.float32)
               for i in ids]
    combiners = ["sqrtn", "mean", "sum"]
    sp_ids = [ids[0].to_sparse(), ids[1], ids[2].to_sparse()]
    sp_weights = [weights[0].to_sparse(), weights[1], None]
    with tf.GradientTape(persistent=True) as tape:
        got = sok.group_embedding_lookup_sparse(tables, sp_ids, combiners, sp_weights=sp_weights, fused=fused)
        ref = [tf.nn.embedding_lookup_sparse(t, i.to_sparse(), None if w is None else w.to_sparse(), combiner=c)
               for t, i, w, c in zip(tables, ids, [weights[0], weights[1], None], combiners)]
        losses = [tf.reduce_sum(g * g) for g in got], [tf.reduce_sum(r * r) for r in ref]
    for t, g, r, lg, lr in zip(tables, got, ref, *losses):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5)
        np.testing.assert_allclose(tf.convert_to_tensor(tape.gradient(lg, t)).numpy(),
                                   tf.convert_to_tensor(tape.gradient(lr, t)).numpy(), rtol=1e-5, atol=1e-6)


def _weights_case(keys, weights):
    layer = sok.DistributedEmbedding("sum", ROWS, DIM, slot_num=2, max_nnz=3, use_hashtable=False, name="emb")
    return lambda: layer(keys, sp_weights=weights)


RAGGED = tf.ragged.constant([[[1, 2], [3]], [[4], []]], dtype=tf.int64, ragged_rank=2)
BAD_WEIGHTS = [
    ("ragged other splits", RAGGED, tf.ragged.constant([[[1.0], [1.0, 1.0]], [[1.0], []]], ragged_rank=2),
     ValueError, r"emb: sp_weights: row splits of ragged dimension 2 differ from the keys'"),
    ("ragged other rows", RAGGED, tf.ragged.constant([[[1.0, 1.0], [1.0]]], ragged_rank=2), ValueError,
     r"sp_weights: row splits of ragged dimension 1"),
    ("ragged vs dense", RAGGED, tf.ones([2, 2, 2]), TypeError, r"sp_weights must be a tf.RaggedTensor like the keys"),
    ("integer weights", RAGGED, tf.ragged.constant([[[1, 1], [1]], [[1], []]], ragged_rank=2), TypeError,
     r"sp_weights must be float.*int32"),
    ("sparse other indices", RAGGED.to_sparse(), tf.ragged.constant([[[1.0], [1.0, 1.0]], [[1.0], []]],
                                                                    ragged_rank=2).to_sparse(),
     ValueError, r"sp_weights: indices differ from the keys'"),
    ("sparse vs ragged", RAGGED.to_sparse(), tf.ragged.constant([[[1.0, 1.0], [1.0]], [[1.0], []]], ragged_rank=2),
     TypeError, r"sp_weights must be a tf.SparseTensor"),
    ("dense other shape", tf.ones([2, 2, 3], tf.int64), tf.ones([2, 2, 2]), ValueError,
     r"emb: sp_weights has shape \(2, 2, 2\), expected the keys' shape \(2, 2, 3\)"),
    ("dense other rank", tf.ones([2, 2], tf.int64), tf.ones([2, 2, 1]), ValueError, r"sp_weights has shape"),
]


@pytest.mark.parametrize("keys,weights,error,pattern", [c[1:] for c in BAD_WEIGHTS], ids=[c[0] for c in BAD_WEIGHTS])
def test_bad_weights_are_refused_by_name(keys, weights, error, pattern):
    with pytest.raises(error, match=pattern):
        _weights_case(keys, weights)()


def test_bad_weights_inside_tf_function_are_refused_when_run():
    layer = sok.DistributedEmbedding("sum", ROWS, DIM, slot_num=2, max_nnz=3, use_hashtable=False, name="emb")
    step = tf.function(lambda k, w: layer(k, sp_weights=w))
    other = tf.ragged.constant([[[1.0], [1.0, 1.0]], [[1.0], []]], ragged_rank=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"emb: sp_weights: row splits of ragged dimension 2"):
        step(RAGGED, other)


def test_bad_group_weights_and_combiners_are_named():
    table, ids = tf.zeros([5, 2]), tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
    with pytest.raises(ValueError, match=r"sp_weights is invalid: expected None or a list of 1 entries.*got a "
                                         r"RaggedTensor"):
        sok.group_embedding_lookup_sparse([table], [ids], ["sum"], sp_weights=tf.ragged.constant([[1.0, 1.0], [1.0]]))
    with pytest.raises(ValueError, match=r"list of 1 entries .* got a list of length 2"):
        sok.group_embedding_lookup_sparse([table], [ids], ["sum"], sp_weights=[None, None])
    with pytest.raises(ValueError, match=r"sp_weights\[0\]: row splits of ragged dimension 1"):
        sok.group_embedding_lookup_sparse([table], [ids], ["sum"], sp_weights=[tf.ragged.constant([[1.0], [1.0]])])
    with pytest.raises(ValueError, match=r"combiners\[0\]='max' is invalid: expected one of \('sum', 'mean', "
                                         r"'sqrtn'\)"):
        sok.group_embedding_lookup_sparse([table], [ids], ["max"])


def test_uniform_inner_ragged_keys_take_weights_and_keep_their_slot_count():
    """Keys ``[batch, (slots), nnz]`` (ragged_rank 1) equal the same keys with ragged inner lists;
    a sample with too few slots is refused, not padded with key 0."""
    layer = sok.DistributedEmbedding("mean", ROWS, DIM, slot_num=2, max_nnz=2, use_hashtable=False)
    keys = tf.RaggedTensor.from_row_lengths(tf.constant([[1, 2], [3, 4], [5, 6], [7, 8]], tf.int64), [2, 2])
    weights = tf.RaggedTensor.from_row_lengths(tf.constant([[1.0, 3.0], [2.0, 2.0], [1.0, 0.0], [0.5, 0.5]]),
                                               [2, 2])
    as_rank_two = keys.with_values(tf.RaggedTensor.from_tensor(keys.values))
    np.testing.assert_allclose(layer(keys, sp_weights=weights).numpy(),
                               layer(as_rank_two, sp_weights=weights.with_values(
                                   tf.RaggedTensor.from_tensor(weights.values))).numpy(), rtol=1e-6)
    short = tf.RaggedTensor.from_row_lengths(tf.constant([[1, 2], [3, 4], [5, 6]], tf.int64), [2, 1])
    with pytest.raises(Exception, match="every row needs slot_num=2"):
        layer(short)


def key_vectors(layer, bags: list) -> list:
    """Each key's vector through the layer's table, nested like `bags` ([batch][slot][key] -> [dim])."""
    flat = np.array([k for row in bags for bag in row for k in bag] or [0], np.int64)
    rows, _ = layer.table.rows(tf.constant(flat), insert=False)
    table, rows = layer.embedding_variable.numpy(), iter(rows.numpy().tolist())
    return [[[table[next(rows)] for _ in bag] for bag in row] for row in bags]


def shuffled_sparse(keys: tf.RaggedTensor, seed: int) -> tf.SparseTensor:
    """The keys as a tf.SparseTensor whose entries are out of order (a sequence must not care)."""
    sparse = keys.to_sparse()
    order = np.random.default_rng(seed).permutation(int(tf.shape(sparse.values)[0]))
    return tf.SparseTensor(tf.gather(sparse.indices, order), tf.gather(sparse.values, order), sparse.dense_shape)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("use_hashtable", [False, True])
def test_sequence_ragged_matches_numpy_forward_and_gradient(use_hashtable, weighted):
    bags, weights = bags_and_weights(4)
    if use_hashtable:
        bags = [[[k * 7919 - 2**40 for k in bag] for bag in row] for row in bags]
    keys, sp_weights = as_layout(bags, weights, "ragged")
    layer = sok.DistributedEmbedding(None, 200, DIM, slot_num=SLOTS, max_nnz=NNZ, use_hashtable=use_hashtable)
    n = sum(len(bag) for row in bags for bag in row)
    upstream = tf.constant(np.random.default_rng(5).normal(size=(n, DIM)), tf.float32)
    with tf.GradientTape() as tape:
        out = layer(keys, training=True, sp_weights=sp_weights if weighted else None)
        loss = tf.reduce_sum(out.flat_values * upstream)
    grad = tape.gradient(loss, layer.embedding_variable)
    assert isinstance(out, tf.RaggedTensor) and out.shape.as_list() == [len(bags), SLOTS, None, DIM]
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(out.row_lengths(axis=2).to_list(), [[len(b) for b in row] for row in bags])

    vecs = key_vectors(layer, bags)
    w = [w for row in weights for bag in row for w in bag] if weighted else [1.0] * n
    flat_vecs = np.array([v for row in vecs for bag in row for v in bag])
    np.testing.assert_allclose(out.flat_values.numpy(), flat_vecs * np.array(w)[:, None], rtol=1e-6)
    flat_keys = np.array([k for row in bags for bag in row for k in bag], np.int64)
    rows = layer.table.rows(tf.constant(flat_keys), insert=False)[0].numpy()
    expected = np.zeros(layer.embedding_variable.shape)
    np.add.at(expected, rows, upstream.numpy() * np.array(w)[:, None])
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), expected, rtol=1e-5, atol=1e-6)

    sparse_out = layer(shuffled_sparse(keys, 0), sp_weights=shuffled_sparse(sp_weights, 0) if weighted else None)
    np.testing.assert_allclose(sparse_out.flat_values.numpy(), out.flat_values.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(sparse_out.nested_row_splits[1].numpy(), out.nested_row_splits[1].numpy())


@pytest.mark.parametrize("layout", ["ragged", "sparse", "dense"])
def test_sequence_padded_has_a_mask_and_matches_numpy_gradient(layout):
    bags, weights = bags_and_weights(6, full=layout == "dense")
    if layout == "dense":
        bags = [[bag[:2] for bag in row] for row in bags]  # nnz=2 < max_nnz: padded all the same
        weights = [[w[:2] for w in row] for row in weights]
    keys, sp_weights = as_layout(bags, weights, layout)
    layer = sok.DistributedEmbedding(None, ROWS, DIM, slot_num=SLOTS, max_nnz=NNZ, use_hashtable=False,
                                     sequence_output="padded")
    upstream = tf.constant(np.random.default_rng(7).normal(size=(len(bags), SLOTS, NNZ, DIM)), tf.float32)
    with tf.GradientTape() as tape:
        vectors, mask = layer(keys, training=True, sp_weights=sp_weights)
        loss = tf.reduce_sum(vectors * upstream)
    grad = tf.convert_to_tensor(tape.gradient(loss, layer.embedding_variable)).numpy()
    assert vectors.shape == (len(bags), SLOTS, NNZ, DIM) and mask.dtype == tf.bool and mask.shape == vectors.shape[:3]

    table = layer.embedding_variable.numpy()
    want, want_mask, want_grad = np.zeros(vectors.shape), np.zeros(mask.shape, bool), np.zeros_like(table)
    for b, row in enumerate(bags):
        for s, bag in enumerate(row):
            for j, k in enumerate(bag):
                want[b, s, j] = weights[b][s][j] * table[k]
                want_mask[b, s, j] = True
                want_grad[k] += weights[b][s][j] * upstream.numpy()[b, s, j]
    np.testing.assert_allclose(vectors.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(mask.numpy(), want_mask)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


def test_sequence_of_dense_keys_is_dense():
    layer = sok.DistributedEmbedding(None, ROWS, DIM, slot_num=2, max_nnz=3, use_hashtable=False)
    keys = tf.constant([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], tf.int64)
    out = layer(keys)
    assert not isinstance(out, tf.RaggedTensor) and out.shape == (2, 2, 2, DIM)
    np.testing.assert_array_equal(out.numpy(), layer.embedding_variable.numpy()[keys.numpy()])
    assert layer(keys[:, :, 0]).shape == (2, 2, 1, DIM)
    assert layer.compute_output_shape((None, 2, 2)) == (None, 2, 2, DIM)


SEQUENCE_OPTIONS = [dict(combiner="sqrtn"), dict(combiner=None), dict(combiner=None, sequence_output="padded")]


@pytest.mark.parametrize("options", SEQUENCE_OPTIONS, ids=["sqrtn", "ragged", "padded"])
def test_config_round_trip_and_tf_function(options):
    layer = sok.DistributedEmbedding(max_vocabulary_size_per_gpu=ROWS, embedding_vec_size=DIM, slot_num=SLOTS,
                                     max_nnz=NNZ, use_hashtable=False, name="emb", **options)
    config = layer.get_config()
    assert config["combiner"] == options["combiner"]
    assert config["sequence_output"] == options.get("sequence_output", "ragged")
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is sok.DistributedEmbedding and clone.get_config() == config
    bags, weights = bags_and_weights(8)
    keys, sp_weights = as_layout(bags, weights, "ragged")
    eager = layer(keys, sp_weights=sp_weights)
    graph = tf.function(lambda k, w: layer(k, sp_weights=w))(keys, sp_weights)
    for a, b in zip(tf.nest.flatten(eager, expand_composites=True), tf.nest.flatten(graph, expand_composites=True)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    shapes = layer.compute_output_shape((None, SLOTS, None))
    assert shapes == {"sqrtn": (None, SLOTS, DIM), None: (None, SLOTS, None, DIM)}[options["combiner"]] \
        if "sequence_output" not in options else shapes == ((None, SLOTS, NNZ, DIM), (None, SLOTS, NNZ))


@keras.saving.register_keras_serializable(package="tests")
class MaskedMean(keras.layers.Layer):
    """The mean of each slot's vectors where the mask is True: (B, S, N, D), (B, S, N) -> (B, S, D)."""

    def call(self, inputs):
        vectors, mask = inputs
        mask = keras.ops.cast(mask, vectors.dtype)[..., None]  # (B, S, N, 1)
        return keras.ops.sum(vectors * mask, axis=2) / keras.ops.maximum(keras.ops.sum(mask, axis=2), 1.0)


def test_padded_sequence_in_a_functional_model_fits_saves_and_loads(tmp_path):
    bags, _ = bags_and_weights(9, batch=128)
    keys = tf.ragged.constant(bags, dtype=tf.int64, ragged_rank=2).to_sparse()
    labels = np.array([[float(sum(map(len, row)) % 2)] for row in bags], np.float32)
    inp = keras.Input([SLOTS, None], dtype="int64", sparse=True)
    vectors, mask = sok.DistributedEmbedding(None, ROWS, DIM, slot_num=SLOTS, max_nnz=NNZ, use_hashtable=False,
                                             sequence_output="padded", name="emb")(inp)
    pooled = MaskedMean()([vectors, mask])
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Reshape([SLOTS * DIM])(pooled)))
    model.compile(sok.optimizers.Adam(0.05), keras.losses.BinaryCrossentropy(from_logits=True))
    history = model.fit(tf.data.Dataset.from_tensor_slices((keys, labels)).batch(32), epochs=4, verbose=0,
                        shuffle=False)
    assert history.history["loss"][-1] < history.history["loss"][0]
    before = model.predict(keys, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded.predict(keys, verbose=0), before, rtol=1e-6)
    assert loaded.get_layer("emb").get_config()["sequence_output"] == "padded"


class SequenceModel(keras.Model):
    """Ragged sequences reach a subclassed model's own pooling (max over each slot's keys)."""

    def __init__(self):
        super().__init__()
        self.embedding = sok.DistributedEmbedding(None, 500, DIM, slot_num=SLOTS, max_nnz=NNZ)
        self.head = keras.layers.Dense(1)

    def call(self, keys, training=None):
        sequences = self.embedding(keys, training=training)  # (B, S, None, D)
        return self.head(tf.reshape(tf.reduce_max(sequences, axis=2), [-1, SLOTS * DIM]))


def test_ragged_sequence_trains_with_model_fit():
    bags, _ = bags_and_weights(10, batch=128)
    bags = [[bag or [0] for bag in row] for row in bags]  # max over no keys would be -inf
    keys = tf.ragged.constant(bags, dtype=tf.int64, ragged_rank=2)
    labels = np.array([[float(row[0][0] % 2)] for row in bags], np.float32)
    model = SequenceModel()
    model.compile(sok.optimizers.Adam(0.05), keras.losses.BinaryCrossentropy(from_logits=True))
    history = model.fit(tf.data.Dataset.from_tensor_slices((keys, labels)).batch(32), epochs=4, verbose=0,
                        shuffle=False)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_bad_combiner_and_sequence_output_are_named():
    with pytest.raises(ValueError, match=r"combiner='max' is invalid: expected one of \('sum', 'mean', 'sqrtn', "
                                         r"None\)"):
        sok.DistributedEmbedding("max", ROWS, DIM, slot_num=1, max_nnz=1)
    with pytest.raises(ValueError, match=r"sequence_output='dense' is invalid: expected one of \('ragged', "
                                         r"'padded'\)"):
        sok.DistributedEmbedding(None, ROWS, DIM, slot_num=1, max_nnz=1, sequence_output="dense")
    with pytest.raises(ValueError, match=r"sequence_output='padded' is invalid with combiner='sum'"):
        sok.DistributedEmbedding("sum", ROWS, DIM, slot_num=1, max_nnz=1, sequence_output="padded")
    layer = sok.DistributedEmbedding(None, ROWS, DIM, slot_num=2, max_nnz=2, use_hashtable=False,
                                     sequence_output="padded")
    with pytest.raises(Exception, match="more keys than max_nnz=2"):
        layer(tf.ragged.constant([[[1, 2, 3], [4]]], dtype=tf.int64, ragged_rank=2))
    with pytest.raises(ValueError, match=r"sp_weights has shape"):
        layer(tf.ones([1, 2, 2], tf.int64), sp_weights=tf.ones([1, 2, 3]))


def _sharded(strategy, sharding: str, keys: tf.RaggedTensor, weights: tf.RaggedTensor) -> list[np.ndarray]:
    """sqrtn with weights, and weighted padded sequences with their mask, per replica's share of the batch."""
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        layers = [sok.DistributedEmbedding(combiner, 64 // n, DIM, slot_num=SLOTS, max_nnz=NNZ, sharding=sharding,
                                           sequence_output=output, name=f"t{i}")
                  for i, (combiner, output) in enumerate([("sqrtn", "ragged"), (None, "padded")])]
        for layer in layers:
            layer.build()
    batch = int(keys.nrows())

    @tf.function
    def run():
        def replica():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            part = slice(r * (batch // n), (r + 1) * (batch // n))
            with tf.GradientTape():  # as in a training step: new keys get rows
                return [tf.nest.flatten(layer(keys[part], sp_weights=weights[part])) for layer in layers]
        return strategy.run(replica)
    out = tf.nest.flatten(run())
    return [np.concatenate([t.numpy() for t in strategy.experimental_local_results(o)]) for o in out]


@pytest.mark.parametrize("sharding", ["row", "table"])
def test_weights_and_sequences_over_sharded_tables_equal_one_device(strategy_of, sharding):
    bags, weights = bags_and_weights(11, batch=8)
    bags = [[[s * 1000 + k for k in bag] for s, bag in enumerate(row)] for row in bags]  # disjoint keys per slot
    keys, sp_weights = as_layout(bags, weights, "ragged")
    one, two = _sharded(strategy_of(1), sharding, keys, sp_weights), _sharded(strategy_of(2), sharding, keys,
                                                                              sp_weights)
    assert [a.shape for a in one] == [(8, SLOTS, DIM), (8, SLOTS, NNZ, DIM), (8, SLOTS, NNZ)]
    for a, b in zip(one, two):
        np.testing.assert_allclose(b, a, atol=1e-7)
