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
