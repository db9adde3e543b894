"""RowWiseAdagrad against a NumPy twin; Adagrad and Ftrl are checked against Keras in test_optimizers.py."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial import optimizers  # noqa: E402
from sok_tutorial.embedding import EmbeddingTable  # noqa: E402

ROWS, DIM = 40, 3
TOUCHED = np.array([3, 7, 7, 12, 39])  # row 7 twice in one step: its gradients add up


def row_wise_adagrad(w: np.ndarray, acc: np.ndarray, rows: np.ndarray, grads: np.ndarray, lr: float,
                     eps: float) -> None:
    """The specification, in place: ``acc[r] += mean(g ** 2); w[r] -= lr * g / (sqrt(acc[r]) + eps)``
    for each distinct row ``r`` with ``g`` the sum of its gradients."""
    for r in np.unique(rows):
        g = grads[rows == r].sum(0).astype(np.float64)
        acc[r] += np.mean(g * g)
        w[r] -= lr * g / (np.sqrt(acc[r]) + eps)


def _table(start: np.ndarray) -> EmbeddingTable:
    table = EmbeddingTable(*start.shape, dynamic=False)
    table.build()
    table.variable.assign(start)
    return table


@pytest.mark.parametrize("via", ["indexed-slices", "table-lookup"])
def test_row_wise_adagrad_follows_its_numpy_twin_with_one_accumulator_per_row(via):
    lr, eps, init = 0.1, 1e-7, 0.1
    rng = np.random.default_rng(0)
    start = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    table = _table(start)
    opt = optimizers.RowWiseAdagrad(learning_rate=lr, initial_accumulator_value=init, epsilon=eps)
    w, acc = start.astype(np.float64), np.full(ROWS, init)
    for _ in range(4):
        grads = rng.normal(size=(len(TOUCHED), DIM)).astype(np.float32)
        if via == "indexed-slices":
            gradient = tf.IndexedSlices(tf.constant(grads), tf.constant(TOUCHED))
        else:  # the table's own UniqueRowsGradient: d sum(lookup * grads) / d row = grads summed per key
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(table(tf.constant(TOUCHED), training=True) * grads)
            gradient = tape.gradient(loss, table.variable)
        opt.apply([gradient], [table.variable])
        row_wise_adagrad(w, acc, TOUCHED, grads, lr, eps)
    (slot,) = table.optimizer_slots(opt)
    assert tuple(slot.shape) == (ROWS,)
    np.testing.assert_allclose(table.variable.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(slot.numpy(), acc, rtol=1e-5)
    untouched = np.setdiff1d(np.arange(ROWS), TOUCHED)
    np.testing.assert_array_equal(table.variable.numpy()[untouched], start[untouched])  # bit-identical
    assert (slot.numpy()[untouched] == np.float32(init)).all()


def test_row_wise_adagrad_gives_other_variables_plain_adagrad():
    rng = np.random.default_rng(1)
    start = rng.normal(size=(6, 2)).astype(np.float32)
    ours, keras_dense, ours_sparse, adagrad_sparse = (keras.Variable(start) for _ in range(4))
    row_wise, reference = optimizers.RowWiseAdagrad(0.1), keras.optimizers.Adagrad(0.1)
    row_wise_s, reference_s = optimizers.RowWiseAdagrad(0.1), optimizers.Adagrad(0.1)
    for _ in range(3):
        dense = tf.constant(rng.normal(size=(6, 2)), tf.float32)
        sparse = tf.IndexedSlices(tf.constant(rng.normal(size=(2, 2)), tf.float32), tf.constant([1, 4]))
        row_wise.apply([dense], [ours])
        reference.apply([dense], [keras_dense])
        row_wise_s.apply([sparse], [ours_sparse])
        reference_s.apply([sparse], [adagrad_sparse])
    np.testing.assert_array_equal(ours.numpy(), keras_dense.numpy())
    np.testing.assert_array_equal(ours_sparse.numpy(), adagrad_sparse.numpy())
    assert [tuple(v.shape) for v in row_wise.variables[2:]] == [(6, 2)]  # per element, not per row


def test_row_wise_adagrad_is_public_serializable_and_its_slot_travels_by_key():
    assert sok.optimizers.RowWiseAdagrad is optimizers.RowWiseAdagrad
    assert {"Ftrl", "RowWiseAdagrad"} <= set(optimizers.__all__)
    opt = optimizers.RowWiseAdagrad(learning_rate=0.05, initial_accumulator_value=0.2, epsilon=1e-6)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(opt))
    assert type(again) is optimizers.RowWiseAdagrad and again.get_config() == opt.get_config()

    source = EmbeddingTable(50, 4, name="source")
    source(tf.constant([10, 2**40, -3], tf.int64), training=True)
    opt.apply([tf.IndexedSlices(tf.ones([2, 4]), tf.constant([0, 2]))], [source.variable])
    saved = source.export(opt)
    assert saved["slot_0"].shape == (3,)
    target, target_opt = EmbeddingTable(80, 4, name="target"), optimizers.RowWiseAdagrad(0.05)
    target.build()
    target_opt.build([target.variable])
    target.restore(saved, target_opt)
    back = target.read(saved["keys"], target_opt)
    np.testing.assert_array_equal(back["slot_0"], saved["slot_0"])
    np.testing.assert_array_equal(back["vectors"], saved["vectors"])


def test_row_wise_adagrad_trains_a_table_of_a_model_built_by_its_first_call():
    """Keras builds a subclassed model's layers in a symbolic pass and makes their TensorFlow
    variables afterwards: the table still owns the variable the optimizer receives, so its
    accumulator stays one value per row."""
    from sok_tutorial.embedding import table_of
    from sok_tutorial.models import DLRM
    from sok_tutorial.training.step import make_sok_step

    model = DLRM([10, 20, 30], ["a", "b", "c"], ["x"], embedding_dim=4)
    features = {"categorical": tf.constant([[1, 2, 3], [4, 5, 6]], tf.int64), "continuous": tf.ones([2, 1])}
    model(features)
    variable = model.embedding.embedding_variable
    assert table_of(variable.value) is model.embedding.table
    step = make_sok_step(model, optimizers.RowWiseAdagrad(0.1), global_batch_size=2)
    before = variable.numpy().copy()
    step(features, tf.constant([[1.0], [0.0]]))
    changed = np.flatnonzero(np.any(variable.numpy() != before, axis=1))
    assert changed.tolist() == [1, 4, 10 + 2, 10 + 5, 30 + 3, 30 + 6]  # the keys plus their table offsets
