"""Keys deduplicated in the input pipeline (`UniqueKeys`) train exactly as the keys themselves."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.embedding import UniqueKeys, unique_keys  # noqa: E402

ROWS, DIM, SLOTS, BATCH = 50, 4, 3, 16


def _batches(nnz: int | None) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    shape = (4 * BATCH, SLOTS) if nnz is None else (4 * BATCH, SLOTS, nnz)
    keys = (rng.zipf(1.3, size=shape) % ROWS).astype(np.int64)  # repeats within a batch
    labels = rng.integers(0, 2, size=(4 * BATCH, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((keys, labels)).batch(BATCH)


def _train(layer: keras.layers.Layer, optimizer: str, dataset: tf.data.Dataset) -> tuple[np.ndarray, list[float]]:
    """Table after one pass of a tf.function step over `dataset`, and the step's outputs' sums."""
    head = keras.layers.Dense(1, kernel_initializer="ones")
    opt = getattr(sok.optimizers, optimizer)(0.1)
    outputs = []

    @tf.function(reduce_retracing=True)
    def step(keys, labels):
        with tf.GradientTape() as tape:
            vectors = layer(keys, training=True)
            logits = head(tf.reshape(vectors, [tf.shape(labels)[0], -1]))
            loss = tf.reduce_mean(keras.losses.binary_crossentropy(labels, logits, from_logits=True))
        variables = layer.trainable_variables + head.trainable_variables
        opt.apply(tape.gradient(loss, variables), variables)
        return tf.reduce_sum(vectors)

    for keys, labels in dataset:
        outputs.append(float(step(keys, labels)))
    return layer.embedding_variable.numpy(), outputs


@pytest.mark.parametrize("optimizer", ["SGD", "Adagrad", "LazyAdam"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_keys_deduplicated_by_the_pipeline_train_the_same_table(optimizer, dynamic):
    def layer():
        return sok.DistributedEmbedding("sum", ROWS, DIM, slot_num=SLOTS, max_nnz=2, use_hashtable=dynamic,
                                        embedding_initializer=keras.initializers.RandomUniform(seed=3))

    plain, plain_out = _train(layer(), optimizer, _batches(None))
    ready = _batches(None).map(unique_keys).prefetch(2)
    assert isinstance(next(iter(ready))[0], UniqueKeys)
    deduped, deduped_out = _train(layer(), optimizer, ready)
    np.testing.assert_allclose(deduped_out, plain_out, rtol=1e-6)
    np.testing.assert_allclose(deduped, plain, rtol=1e-6, atol=1e-7)
    assert not np.allclose(plain, layer().embedding_variable.numpy())  # it trained


def test_bags_of_several_keys_and_the_dense_layer_take_deduplicated_keys():
    def layers():
        init = keras.initializers.RandomUniform(seed=5)
        return (sok.DistributedEmbedding("mean", ROWS, DIM, slot_num=SLOTS, max_nnz=2, use_hashtable=False,
                                         embedding_initializer=init),
                sok.All2AllDenseEmbedding(ROWS, DIM, slot_num=SLOTS, nnz_per_slot=2, embedding_initializer=init),
                sok.embedding.QREmbedding("sum", ROWS, DIM, slot_num=SLOTS, max_nnz=2))
    keys, _ = next(iter(_batches(2)))
    for plain, deduped in zip(layers(), layers()):
        np.testing.assert_allclose(deduped(unique_keys(keys), training=True).numpy(),
                                   plain(keys, training=True).numpy(), rtol=1e-6)


def test_unique_keys_refuses_keys_that_are_not_integers():
    with pytest.raises(TypeError, match="keys must be integers .* got float32"):
        unique_keys(tf.constant([1.0, 2.0]))
    with pytest.raises(TypeError, match="int32 positions"):
        UniqueKeys(tf.constant([1], tf.int64), tf.constant([0], tf.int64))
