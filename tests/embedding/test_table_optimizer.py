"""A table with its own optimizer: the model's optimizer hands its variable over, in model.fit,
in a custom tf.function loop and under MirroredStrategy, and checkpoints keep its state."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from sok_tutorial import optimizers  # noqa: E402
from sok_tutorial.embedding import EmbeddingTable, QREmbedding  # noqa: E402
from sok_tutorial.training.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

ROWS, DIM, BATCH, STEPS = 30, 4, 16, 5


class TwoTables(keras.Model):
    """``wide`` (its own optimizer, if given) and ``deep`` (the model's), then a dense head."""

    def __init__(self, wide_optimizer=None, **kwargs):
        super().__init__(**kwargs)
        self.wide = EmbeddingTable(ROWS, DIM, dynamic=False, optimizer=wide_optimizer, name="wide")
        self.deep = EmbeddingTable(ROWS, DIM, dynamic=False, name="deep")
        self.head = keras.layers.Dense(1, name="head")

    def call(self, keys):
        keys = tf.cast(keys, tf.int64)  # Keras' symbolic build under a strategy traces with float inputs
        return self.head(tf.concat([self.wide(keys[:, 0]), self.deep(keys[:, 1])], 1))


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, ROWS, (BATCH * STEPS, 2)).astype(np.int64)
    return x, rng.normal(size=(BATCH * STEPS, 1)).astype(np.float32)


def _ftrl() -> optimizers.Ftrl:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=1, decay_rate=0.8)
    return optimizers.Ftrl(schedule, l1_regularization_strength=0.001)


def _twin(model: TwoTables, x: np.ndarray) -> TwoTables:
    """A model without table optimizers, holding `model`'s weights."""
    twin = TwoTables()
    twin(x[:1])
    twin.set_weights(model.get_weights())
    return twin


def _reference(twin: TwoTables, x: np.ndarray, y: np.ndarray) -> tuple[optimizers.Ftrl, optimizers.Adam]:
    """Train `twin` with two separate optimizers: Ftrl alone on wide's gradients, Adam on the rest."""
    ftrl, adam, mse = _ftrl(), optimizers.Adam(0.05), keras.losses.MeanSquaredError()
    for i in range(0, len(x), BATCH):
        with tf.GradientTape() as tape:
            loss = mse(y[i:i + BATCH], twin(x[i:i + BATCH], training=True))
        variables = twin.trainable_variables
        grads = tape.gradient(loss, variables)
        wide = [j for j, v in enumerate(variables) if v is twin.wide.variable]
        ftrl.apply([grads[j] for j in wide], [variables[j] for j in wide])
        adam.apply([g for j, g in enumerate(grads) if j not in wide], [v for j, v in enumerate(variables)
                                                                       if j not in wide])
    return ftrl, adam


def _train_loop(model: TwoTables, adam: optimizers.Adam, x: np.ndarray, y: np.ndarray, steps: range) -> None:
    mse = keras.losses.MeanSquaredError()

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = mse(yb, model(xb, training=True))
        adam.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    for i in steps:
        step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])


def _assert_same(model: TwoTables, twin: TwoTables) -> None:
    for ours, theirs in zip(model.get_weights(), twin.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("how", ["fit", "tf-function-loop"])
def test_a_table_with_its_own_ftrl_trains_as_ftrl_alone_and_the_other_as_adam(how):
    x, y = _data()
    ftrl, adam = _ftrl(), optimizers.Adam(0.05)
    model = TwoTables(wide_optimizer=ftrl)
    model(x[:1])
    twin, start = _twin(model, x), model.wide.variable.numpy().copy()
    if how == "fit":
        model.compile(optimizer=adam, loss="mse")
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    else:
        _train_loop(model, adam, x, y, range(STEPS))
    ref_ftrl, _ = _reference(twin, x, y)
    _assert_same(model, twin)
    assert int(ftrl.iterations) == int(adam.iterations) == STEPS  # its own count drives its own schedule
    assert not np.allclose(model.wide.variable.numpy(), start)
    # the wide table's state lives in its Ftrl only: Adam keeps moments for the deep table alone
    assert all(any(s is v for v in ftrl.variables) for s in model.wide.optimizer_slots(adam))
    moments = [v.name for v in adam.variables if v.name.endswith("_moments")]
    assert len(moments) == 1 and moments[0].endswith("deep_embedding_variable_moments")
    for ours, theirs in zip(model.wide.optimizer_slots(adam), twin.wide.optimizer_slots(ref_ftrl), strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=2e-5, atol=2e-6)


def test_a_checkpoint_keeps_the_table_optimizers_slots_and_step_count(tmp_path):
    x, y = _data(1)
    model, adam = TwoTables(wide_optimizer=_ftrl()), optimizers.Adam(0.05)
    model(x[:1])
    _train_loop(model, adam, x, y, range(3))
    save_checkpoint(tmp_path / "ckpt", model, adam)

    restored, restored_ftrl, restored_adam = None, _ftrl(), optimizers.Adam(0.05)
    restored = TwoTables(wide_optimizer=restored_ftrl)
    restored(x[:1])
    restored_adam.build(restored.trainable_variables)  # builds the table's Ftrl too
    load_checkpoint(tmp_path / "ckpt", restored, restored_adam)
    assert int(restored_ftrl.iterations) == 3  # the schedule resumes where it was
    for ours, theirs in zip(restored.wide.optimizer_slots(restored_adam), model.wide.optimizer_slots(adam),
                            strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    _train_loop(model, adam, x, y, range(3, STEPS))
    _train_loop(restored, restored_adam, x, y, range(3, STEPS))
    for ours, theirs in zip(restored.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("table_optimizer, error, message", [
    (lambda: keras.optimizers.Adam(0.1), TypeError,
     r"table 'wide': optimizer=keras\.src\.optimizers\.adam\.Adam is invalid: expected one of sok_tutorial"),
    (lambda: optimizers.Ftrl(0.1, loss_scale_factor=128.0), ValueError,
     "table 'wide': its optimizer has loss_scale_factor=128.0, expected None"),
], ids=["keras-adam", "own-loss-scale"])
@pytest.mark.parametrize("how", ["fit", "apply"])
def test_a_wrong_table_optimizer_fails_before_any_variable_changes(table_optimizer, error, message, how):
    x, y = _data(2)
    model, adam = TwoTables(wide_optimizer=table_optimizer()), optimizers.Adam(0.05)
    model(x[:1])
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(error, match=message):
        if how == "fit":
            model.compile(optimizer=adam, loss="mse")
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        else:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x[:BATCH], training=True) - y[:BATCH]))
            adam.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    for ours, start in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(ours, start)
    assert int(adam.iterations) == 0


def test_table_optimizers_under_mirrored_strategy_train_as_on_one_device(strategy_of):
    x, y = _data(3)
    with strategy_of(2).scope():
        ftrl, adam = _ftrl(), optimizers.Adam(0.05)
        model = TwoTables(wide_optimizer=ftrl)
        model(x[:1])
        model.compile(optimizer=adam, loss="mse")
    twin = _twin(model, x)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # each replica gets half a batch
    _reference(twin, x, y)
    _assert_same(model, twin)
    assert int(ftrl.iterations.numpy()) == int(adam.iterations.numpy()) == STEPS


def test_the_sok_layers_optimizer_argument_gives_their_table_its_own():
    import sok_tutorial as sok

    layer = sok.All2AllDenseEmbedding(20, 2, slot_num=1, nnz_per_slot=1, use_hashtable=False,
                                      optimizer=optimizers.Ftrl(0.1))
    layer.build()
    alone = EmbeddingTable(20, 2, dynamic=False)
    alone.build()
    alone.variable.assign(layer.embedding_variable.numpy())
    grad = tf.IndexedSlices(tf.constant([[0.5, -1.0]]), tf.constant([3]))
    optimizers.SGD(1.0).apply([grad], [layer.embedding_variable])
    optimizers.Ftrl(0.1).apply([grad], [alone.variable])
    np.testing.assert_array_equal(layer.embedding_variable.numpy(), alone.variable.numpy())


def test_a_tables_own_optimizer_survives_get_config():
    """Saved with its layer's config (its hyperparameters and schedule, as Keras serialises an
    optimizer), it comes back as an optimizer of the same kind for the clone's table."""
    import sok_tutorial as sok

    layers = [EmbeddingTable(ROWS, DIM, dynamic=False, optimizer=_ftrl()),
              sok.DistributedEmbedding("sum", 50, 4, slot_num=2, max_nnz=1, optimizer=optimizers.Adam(0.05)),
              QREmbedding("sum", 50, 4, slot_num=2, max_nnz=1, optimizer=optimizers.Adagrad(0.3))]
    for layer in layers:
        config = layer.get_config()
        clone = type(layer).from_config(config)
        mine = layer.optimizer if isinstance(layer, EmbeddingTable) else layer.table_optimizer
        theirs = clone.optimizer if isinstance(clone, EmbeddingTable) else clone.table_optimizer
        assert type(theirs) is type(mine) and theirs is not mine
        assert theirs.get_config() == mine.get_config()
        assert clone.get_config() == config
    assert EmbeddingTable.from_config(EmbeddingTable(ROWS, DIM).get_config()).optimizer is None
    unknown = {**config, "optimizer": {"module": "sok_tutorial.optimizers", "class_name": "Nadam2",
                                       "config": {}, "registered_name": "sok_tutorial>Nadam2"}}
    with pytest.raises(TypeError, match=r"optimizer='Nadam2' could not be rebuilt.*import sok_tutorial.optimizers"):
        type(layer).from_config(unknown)


def _fit_row_sharded(strategy, own: bool) -> dict[int, np.ndarray]:
    import sok_tutorial as sok

    rng = np.random.default_rng(4)
    x = rng.integers(-10**12, 10**12, (128, 4))
    y = (x[:, :1] % 3 == 0).astype("float32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inp = keras.Input([4], dtype="int64")
        layer = sok.DistributedEmbedding("sum", 500, 4, slot_num=4, max_nnz=1, sharding="row", name="emb",
                                         optimizer=optimizers.Adam(0.05) if own else None)
        out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Reshape([16])(layer(inp)))
        model = keras.Model(inp, out)
        model.compile(optimizers.Adam(0.05), "binary_crossentropy")
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
    if own:  # two steps, taken by the table's own Adam
        assert int(layer.table.optimizer.iterations.numpy()) == 2 and layer.table.num_shards == 2
    rows = layer.table.export()
    return dict(zip(rows["keys"].tolist(), rows["vectors"]))


def test_a_row_sharded_table_with_its_own_optimizer_trains_as_with_the_models(strategy_of):
    own, shared = _fit_row_sharded(strategy_of(2), True), _fit_row_sharded(strategy_of(2), False)
    assert own.keys() == shared.keys()
    np.testing.assert_allclose(np.stack([own[k] for k in shared]), np.stack(list(shared.values())), rtol=1e-6)
