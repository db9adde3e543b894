"""`make_sok_step`: one training step for custom loops, equal to ``model.fit`` on one device and to
one device on N replicas."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.models import EmbeddingMLP
from sok_tutorial.training import StepsBySize, make_sok_step
from sok_tutorial.training.callbacks import StepLosses

BATCH, STEPS = 64, 6


def data(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    users, items = rng.integers(0, 40, BATCH * STEPS), rng.integers(0, 30, BATCH * STEPS)
    labels = ((users + items) % 3 == 0).astype("float32")[:, None]
    return {"user": users, "item": items}, labels


def batches() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    x, y = data()
    return [({k: v[i:i + BATCH] for k, v in x.items()}, y[i:i + BATCH]) for i in range(0, BATCH * STEPS, BATCH)]


def model_of(l2: float = 0.0) -> keras.Model:
    keras.utils.set_random_seed(7)
    model = EmbeddingMLP({"user": 40, "item": 30}, dims=4, hidden=[8], l2=l2)
    model({"user": np.zeros(2, np.int64), "item": np.zeros(2, np.int64)})
    return model


def weights_of(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(v) for v in model.weights]


@pytest.mark.parametrize("l2", [0.0, 0.01])
def test_on_one_device_it_is_model_fit(l2):
    """Same losses, same weights as ``model.fit`` with one sparse optimizer over the same batches,
    the model's own loss terms (an L2 penalty) included."""
    fitted = model_of(l2)
    fitted.compile(optimizer=sok.optimizers.Adam(0.02), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    x, y = data()
    per_step = StepLosses()
    fitted.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[per_step])
    stepped = model_of(l2)
    step = make_sok_step(stepped, sok.optimizers.Adam(0.02), global_batch_size=BATCH)
    losses = [float(step(*b)) for b in batches()]
    np.testing.assert_allclose(losses, per_step.losses, rtol=1e-5)
    for a, b in zip(weights_of(fitted), weights_of(stepped)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_two_optimizers_update_their_own_variables():
    """The tables go to the sparse optimizer and the dense layers to the dense one: a dense
    optimizer with a zero rate leaves every dense weight as it was and the tables still train."""
    model = model_of()
    before = {v.path: np.asarray(v) for v in model.trainable_variables}
    step = make_sok_step(model, sok.optimizers.SGD(0.5), keras.optimizers.SGD(0.0), global_batch_size=BATCH)
    for b in batches():
        step(*b)
    tables, others = sok.split_embedding_variable_from_others(model.trainable_variables)
    assert tables and others
    assert all(np.array_equal(before[v.path], np.asarray(v)) for v in others)
    assert all(not np.array_equal(before[v.path], np.asarray(v)) for v in tables)


@pytest.mark.parametrize("replicas", [2, 4])
def test_n_replicas_train_as_one_device(strategy_of, replicas):
    """A global batch split over N replicas, each averaging over the global batch: the same losses
    and weights as one device, with a sparse and a dense optimizer and an L2 term."""
    one = model_of(l2=0.01)
    step_one = make_sok_step(one, sok.optimizers.Adam(0.02), keras.optimizers.Adam(0.02), global_batch_size=BATCH)
    losses_one = [float(step_one(*b)) for b in batches()]
    strategy = strategy_of(replicas)
    with strategy.scope():
        many = model_of(l2=0.01)
        sparse, dense = sok.optimizers.Adam(0.02), keras.optimizers.Adam(0.02)
    step = make_sok_step(many, sparse, dense, global_batch_size=BATCH, strategy=strategy)
    assert step.num_replicas == replicas
    losses = [float(step(*b)) for b in batches()]
    np.testing.assert_allclose(losses, losses_one, rtol=1e-5)
    for a, b in zip(weights_of(one), weights_of(many)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_distributed_datasets_are_taken_as_they_are(strategy_of):
    strategy = strategy_of(2)
    with strategy.scope():
        model = model_of()
    step = make_sok_step(model, sok.optimizers.SGD(0.1), global_batch_size=BATCH, strategy=strategy)
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    losses = [float(step(f, lab)) for f, lab in strategy.experimental_distribute_dataset(dataset)]
    assert len(losses) == STEPS and all(np.isfinite(losses))


def test_bad_arguments_are_named_before_anything_trains():
    model = model_of()
    before = weights_of(model)
    with pytest.raises(ValueError, match="global_batch_size=0"):
        make_sok_step(model, sok.optimizers.SGD(0.1), global_batch_size=0)
    with pytest.raises(TypeError, match="sparse_optimizer=None is invalid"):
        make_sok_step(model, None, global_batch_size=BATCH)
    with pytest.raises(TypeError, match="dense_optimizer='adam' is invalid"):
        make_sok_step(model, sok.optimizers.SGD(0.1), "adam", global_batch_size=BATCH)
    with pytest.raises(ValueError, match="build it before"):
        make_sok_step(EmbeddingMLP({"user": 4}, dims=2, hidden=[2]), sok.optimizers.SGD(0.1), global_batch_size=BATCH)
    step = make_sok_step(model, sok.optimizers.SGD(0.1), global_batch_size=BATCH)
    x, y = batches()[0]
    with pytest.raises(ValueError, match=r"labels has 32 rows, expected global_batch_size=64"):
        step({k: v[:32] for k, v in x.items()}, y[:32])
    assert all(np.array_equal(a, b) for a, b in zip(before, weights_of(model)))


def test_a_batch_that_does_not_split_over_the_replicas_is_refused(strategy_of):
    strategy = strategy_of(4)
    with strategy.scope():
        model = model_of()
    with pytest.raises(ValueError, match=r"global_batch_size=66 does not split over 4 replicas"):
        make_sok_step(model, sok.optimizers.SGD(0.1), global_batch_size=66, strategy=strategy)


def test_steps_by_size_train_a_short_last_batch_as_model_fit_does():
    """A pass of 6.5 batches: the short batch gets a step of its own size, and the whole pass equals
    ``model.fit`` over the same rows."""
    x, y = data()
    rows = BATCH * STEPS - BATCH // 2
    fitted = model_of()
    fitted.compile(optimizer=sok.optimizers.Adam(0.02), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    fitted.fit({k: v[:rows] for k, v in x.items()}, y[:rows], batch_size=BATCH, shuffle=False, verbose=0)
    stepped = model_of()
    steps = StepsBySize(stepped, sok.optimizers.Adam(0.02))
    for i in range(0, rows, BATCH):
        steps({k: v[i:min(i + BATCH, rows)] for k, v in x.items()}, y[i:min(i + BATCH, rows)])
    assert sorted(steps.steps) == [BATCH // 2, BATCH]
    for a, b in zip(weights_of(fitted), weights_of(stepped)):
        np.testing.assert_allclose(a, b, atol=1e-6)
