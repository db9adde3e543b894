"""The contract of `EmbeddingTable` on its own: keys -> rows, growth, rows by key out and in,
gradients, and the state a graph and a SavedModel carry."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.embedding import EmbeddingTable, UniqueRowsGradient, VocabularyExhausted, tables_of  # noqa: E402
from sok_tutorial.training import load_checkpoint, save_checkpoint  # noqa: E402

EXTREME = [0, -1, 1, 2**63 - 1, -(2**63), 2**40, -(2**40)]
CALLBACKS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


def _rows(table: EmbeddingTable, keys) -> list[int]:
    rows, found = table.rows(tf.constant(np.asarray(keys, np.int64)), insert=False)
    return np.where(found.numpy(), rows.numpy(), -1).tolist() if found is not None else rows.numpy().tolist()


def test_new_keys_take_rows_in_order_of_first_sight_and_start_from_their_own_vectors():
    table = EmbeddingTable(20, 3, name="items")
    batch = [[EXTREME[3], 5, EXTREME[3]], [EXTREME[4], 0, 5]]
    out = table(tf.constant(batch, tf.int64), training=True).numpy()
    assert out.shape == (2, 3, 3)
    assert _rows(table, [2**63 - 1, 5, -(2**63), 0, 6]) == [0, 1, 2, 3, -1] and table.size == 4
    np.testing.assert_array_equal(out[0, 0], out[0, 2])  # a repeated key: one row
    np.testing.assert_array_equal(out.reshape(-1, 3), table.initial_values(np.array(batch).ravel()))
    table(tf.constant(EXTREME, tf.int64), training=True)
    assert _rows(table, EXTREME) == [3, 4, 5, 0, 2, 6, 7] and table.size == 8
    exported = table.export()
    assert exported["keys"].tolist() == [2**63 - 1, 5, -(2**63), 0, -1, 1, 2**40, -(2**40)]


@pytest.mark.parametrize("options", [{}, {"track_changes": True}, {"eviction_policy": "lru", "bucket_capacity": 4}])
def test_two_training_lookups_in_one_function_see_each_others_new_keys(options):
    """A step that looks one table up twice (two features sharing it) gives a key new to both lookups
    one row, as two steps one after the other would: the second lookup reads the index after the
    first one's writes, which the first lookup's rows do not wait for."""
    first, second = tf.constant([1, 2, 3, 4], tf.int64), tf.constant([3, 4, 5, 6, 1], tf.int64)
    together, apart = EmbeddingTable(64, 2, **options), EmbeddingTable(64, 2, **options)
    out = tf.function(lambda: (together(first, training=True), together(second, training=True)))()
    expected = (apart(first, training=True), apart(second, training=True))
    for got, want in zip(out, expected):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    keys = [1, 2, 3, 4, 5, 6]
    assert _rows(together, keys) == _rows(apart, keys) and len(set(_rows(together, keys))) == 6
    assert together.size == apart.size == 6


def test_empty_batches_and_inference_leave_the_table_alone():
    table = EmbeddingTable(8, 2)
    assert table(tf.zeros([0, 3], tf.int64), training=True).shape == (0, 3, 2) and table.size == 0
    table(tf.constant([4, 9], tf.int64), training=True)
    for training in (False, None):  # Keras calls with training=None for inference too (model.export)
        unseen = table(tf.constant([9, 77], tf.int64), training=training).numpy()
        assert table.size == 2 and not unseen[1].any() and unseen[0].any()
    static = EmbeddingTable(8, 2, dynamic=False)
    assert static(tf.zeros([0], tf.int32)).shape == (0, 2)


def test_a_full_table_names_itself_its_capacity_and_the_keys_asked_for_and_changes_nothing():
    table = EmbeddingTable(3, 2, name="users")
    table(tf.constant([1, 2], tf.int64), training=True)
    before = [v.numpy().copy() for v in table.variables]
    with pytest.raises(VocabularyExhausted, match="users: vocabulary exhausted: 4 distinct keys need rows but "
                                                  r"max_vocabulary_size_per_gpu=3 \(2 held, 2 new"):
        table(tf.constant([1, 3, 4], tf.int64), training=True)
    step = tf.function(lambda k: table(k, training=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="users: vocabulary exhausted: 5 distinct keys"):
        step(tf.constant([3, 4, 5], tf.int64))
    for v, b in zip(table.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_keys_of_another_dtype_are_refused_by_name():
    table = EmbeddingTable(4, 2, name="items")
    with pytest.raises(TypeError, match="items: keys must be integers .* got <dtype: 'float32'>"):
        table(tf.constant([1.0]))
    with pytest.raises(TypeError, match="items: keys must be integers .* got <dtype: 'string'>"):
        table(tf.constant(["a"]))


@pytest.mark.parametrize("dynamic", [True, False])
def test_export_restore_round_trip_and_checks_before_writing(dynamic):
    keys = np.array([7, -3, 2**62, 0], np.int64) if dynamic else np.array([7, 3, 0], np.int64)
    source = EmbeddingTable(10, 4, dynamic=dynamic)
    source(tf.constant(keys), training=True)
    saved = source.export()
    target = EmbeddingTable(12 if dynamic else 10, 4, dynamic=dynamic)
    target.build()
    target.restore(saved)
    restored = target.export()
    by_key = dict(zip(restored["keys"].tolist(), restored["vectors"]))
    for key, vector in zip(saved["keys"].tolist(), saved["vectors"]):
        np.testing.assert_array_equal(by_key[key], vector)
    if dynamic:  # rows 0..n-1 in the order given; new keys continue from n
        assert _rows(target, saved["keys"]) == list(range(len(saved["keys"])))
        target(tf.constant([123], tf.int64), training=True)
        assert _rows(target, [123]) == [len(saved["keys"])]
    before = [v.numpy().copy() for v in target.variables]
    bad = [({**saved, "vectors": saved["vectors"][:, :3]}, "vectors has shape .* expected"),
           ({**saved, "keys": saved["keys"].astype(np.float32)}, "keys must be a 1-D integer array")]
    bad.append(({"keys": np.arange(13), "vectors": np.zeros((13, 4), np.float32)}, "13 keys do not fit") if dynamic
               else ({"keys": np.array([10]), "vectors": np.zeros((1, 4), np.float32)}, r"span \[10, 10\]"))
    for arrays, message in bad:
        with pytest.raises(ValueError, match=message):
            target.restore(arrays)
    for v, b in zip(target.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_the_gradient_holds_distinct_rows_and_the_optimizer_gets_the_same_update_either_way():
    rng = np.random.default_rng(0)
    keys = tf.constant(rng.integers(0, 40, (64, 3)), tf.int64)
    weights = tf.constant(rng.normal(size=(64, 3, 4)), tf.float32)
    results = []
    for plain in (False, True):
        table = EmbeddingTable(100, 4)
        table(keys, training=True)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table(keys, training=True) * weights)
        grad = tape.gradient(loss, table.variable)
        assert isinstance(grad, UniqueRowsGradient) and len(np.unique(grad.indices)) == len(grad.indices)
        dense = tf.convert_to_tensor(grad).numpy()
        if plain:  # the same gradient as any other IndexedSlices: repeated rows, deduplicated by the optimizer
            grad = tf.IndexedSlices(tf.concat([grad.values / 2, grad.values / 2], 0),
                                    tf.concat([grad.indices, grad.indices], 0), grad.dense_shape)
        optimizer = sok.optimizers.Adagrad(0.1)
        optimizer.apply([grad], [table.variable])
        results.append((dense, table.variable.numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6, atol=1e-7)


def _model(capacity: int = 600) -> keras.Model:
    keras.utils.set_random_seed(0)  # every model starts from the same dense weights
    inp = keras.Input([3], dtype="int64")
    emb = sok.DistributedEmbedding("sum", capacity, 4, slot_num=3, max_nnz=1, name="items")(inp)
    return keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(emb)))


def _batches(seed: int, n: int, key_range: int = 10**12):
    rng = np.random.default_rng(seed)
    return [(rng.integers(-key_range, key_range, (32, 3)), rng.random((32, 1)).astype("float32")) for _ in range(n)]


def test_the_traced_training_step_has_no_python_callback():
    model = _model()
    model.compile(sok.optimizers.LazyAdam(0.01), "mse")
    x, y = _batches(0, 1)[0]
    model.fit(x, y, verbose=0)
    step = tf.function(model.train_step)  # the step model.fit runs, traced on its own
    graph = step.get_concrete_function((tf.TensorSpec([None, 3], tf.int64), tf.TensorSpec([None, 1], tf.float32))).graph
    ops = {op.type for op in graph.get_operations()}
    for function in graph._functions.values():
        ops |= {node.op for node in function.definition.node_def}
    assert "Unique" in ops and "ResourceScatterUpdate" in ops  # the lookup and the index are in the graph
    assert not ops & CALLBACKS


def test_a_saved_model_keeps_the_index_and_serves_unseen_keys_as_zeros(tmp_path):
    model = _model()
    model.compile(sok.optimizers.Adagrad(0.1), "mse")
    for x, y in _batches(1, 3):
        model.fit(x, y, verbose=0)
    seen = _batches(1, 1)[0][0][:4]
    unseen = np.array([[11, 12, 13]], np.int64)
    model.export(str(tmp_path / "saved"), verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    served = loaded.serve
    np.testing.assert_allclose(served(tf.constant(seen)).numpy(), model(seen, training=False).numpy(), rtol=1e-6)
    bias = model.layers[-1].bias.numpy()
    np.testing.assert_allclose(served(tf.constant(unseen)).numpy(), bias[None, :], rtol=1e-6)  # zero vectors


def test_restore_then_continue_assigns_rows_as_a_run_that_never_stopped(tmp_path):
    batches = _batches(2, 6, key_range=500)  # later batches bring old and new keys
    straight = _model()
    straight.compile(sok.optimizers.LazyAdam(0.05), "mse")
    for x, y in batches:  # shuffle=False: rows follow the order keys are first seen in
        straight.fit(x, y, verbose=0, shuffle=False)
    first = _model()
    first.compile(sok.optimizers.LazyAdam(0.05), "mse")
    for x, y in batches[:3]:
        first.fit(x, y, verbose=0, shuffle=False)
    save_checkpoint(tmp_path / "ckpt", first, first.optimizer)
    resumed = _model(capacity=800)  # another capacity: rows by key, not by position
    resumed.compile(sok.optimizers.LazyAdam(0.05), "mse")
    resumed.fit(*batches[0], epochs=0, verbose=0)  # builds the model and its optimizer
    resumed.optimizer.build(resumed.trainable_variables)
    load_checkpoint(tmp_path / "ckpt", resumed, resumed.optimizer)
    for x, y in batches[3:]:
        resumed.fit(x, y, verbose=0, shuffle=False)
    a, b = (tables_of(m)[0].export() for m in (straight, resumed))
    np.testing.assert_array_equal(a["keys"], b["keys"])  # keys in row order: the same rows
    np.testing.assert_allclose(a["vectors"], b["vectors"], rtol=1e-6, atol=1e-7)


def test_replicas_of_a_dynamic_table_assign_the_same_rows(strategy_of):
    strategy = strategy_of(2)
    with strategy.scope():
        table = EmbeddingTable(50, 2, name="shared")
        table.build()

    @tf.function
    def step(keys):
        return strategy.run(lambda k: table(k, training=True), args=(keys,))

    data = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([[5, 9], [2**62, 9]][ctx.replica_id_in_sync_group], tf.int64))
    step(data)
    copies = [c.numpy() for v in table.variables for c in strategy.experimental_local_results(v.value)]
    for a, b in zip(copies[0::2], copies[1::2]):
        np.testing.assert_array_equal(a, b)
    assert table.size == 3 and sorted(table.export()["keys"].tolist()) == [5, 9, 2**62]


def test_a_checkpoint_that_does_not_fit_is_refused_before_anything_changes(tmp_path):
    from sok_tutorial.training import CheckpointMismatch

    source = _model()
    source.compile(sok.optimizers.Adam(0.05), "mse")
    for x, y in _batches(3, 2):
        source.fit(x, y, verbose=0, shuffle=False)
    save_checkpoint(tmp_path / "ckpt", source, source.optimizer)
    small = _model(capacity=100)  # 192 keys saved: they do not fit 100 rows
    momentum = _model()  # momentum SGD keeps one [rows, 4] slot where Adam kept a [rows, 8] one
    for model, optimizer, message in ((small, sok.optimizers.Adam(0.05), "192 keys do not fit .*=100 rows"),
                                      (momentum, sok.optimizers.SGD(0.1, momentum=0.9),
                                       r"slot_0 has shape \(192, 8\), expected \(192, 4\)")):
        model.compile(optimizer, "mse")
        model.fit(*_batches(4, 1)[0], verbose=0)
        before = [v.numpy().copy() for v in model.variables + model.optimizer.variables]
        with pytest.raises(CheckpointMismatch, match=f"table items/items: items: {message}"):
            load_checkpoint(tmp_path / "ckpt", model, model.optimizer)
        for v, b in zip(model.variables + model.optimizer.variables, before):
            np.testing.assert_array_equal(v.numpy(), b)


@pytest.mark.parametrize("policy", [None, "lru"])
def test_a_table_not_built_yet_exports_empty_and_restores(policy):
    """Restoring into a fresh table is how a served copy starts: it builds itself first."""
    assert EmbeddingTable(16, 2, eviction_policy=policy).export()["keys"].tolist() == []
    table = EmbeddingTable(16, 2, eviction_policy=policy, name="served")
    table.restore({"keys": np.array([5, 9]), "vectors": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)})
    np.testing.assert_array_equal(table(tf.constant([9, 5, 7], tf.int64)).numpy(), [[3, 4], [1, 2], [0, 0]])
