from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from sok_tutorial import optimizers  # noqa: E402
from sok_tutorial.embedding import EmbeddingTable  # noqa: E402
from sok_tutorial.embedding.dedup import PARTS_FROM  # noqa: E402
from sok_tutorial.embedding.optimizers.base import touched  # noqa: E402

ROWS, DIM = 40, 3
TOUCHED = np.array([3, 7, 7, 12, 39])  # row 7 twice in one step: its gradients add up


def _grad(rng: np.random.Generator) -> tf.IndexedSlices:
    return tf.IndexedSlices(tf.constant(rng.normal(size=(len(TOUCHED), DIM)), tf.float32), tf.constant(TOUCHED),
                            dense_shape=tf.constant([ROWS, DIM]))


def _dense(g: tf.IndexedSlices) -> tf.Tensor:
    return tf.convert_to_tensor(g)


def _table(start: np.ndarray, marks: bool = False) -> EmbeddingTable:
    """A table of row ids holding `start`; with `marks`, the per-row fresh marks a table that evicts
    keys keeps (`EmbeddingTable.fresh_rows`), added by hand: a table of row ids never evicts."""
    table = EmbeddingTable(*start.shape, dynamic=False)
    if marks:  # before build: a built layer takes no new state
        table.state.row_fresh = table.add_weight(name="row_fresh", shape=(start.shape[0],), dtype="bool",
                                                 trainable=False, initializer="zeros")
    table.build()
    table.variable.assign(start)
    return table


def _variable(start: np.ndarray, table: bool) -> tuple:
    """(variable, its owner): a table's variable (Adam keeps a table's moments in one fused slot) or
    a plain Keras variable. Keep the owner alive: a variable belongs to a table while the table lives."""
    if not table:
        return keras.Variable(start), None
    owner = _table(start)
    return owner.variable, owner


CASES = [
    (optimizers.SGD, keras.optimizers.SGD, {"learning_rate": 0.1}),
    (optimizers.SGD, keras.optimizers.SGD, {"learning_rate": 0.1, "momentum": 0.9}),
    (optimizers.SGD, keras.optimizers.SGD, {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    (optimizers.Adagrad, keras.optimizers.Adagrad, {"learning_rate": 0.1}),
    (optimizers.Adam, keras.optimizers.Adam, {"learning_rate": 0.01}),
    (optimizers.Adam, keras.optimizers.Adam, {"learning_rate": 0.01, "amsgrad": True}),
    (optimizers.Ftrl, keras.optimizers.Ftrl, {"learning_rate": 0.1}),
    (optimizers.Ftrl, keras.optimizers.Ftrl, {"learning_rate": 0.1, "learning_rate_power": -0.3,
                                              "initial_accumulator_value": 0.5, "l1_regularization_strength": 0.01,
                                              "l2_regularization_strength": 0.02, "beta": 0.3,
                                              "l2_shrinkage_regularization_strength": 0.05}),
    (optimizers.Ftrl, keras.optimizers.Ftrl, {"learning_rate": 0.1, "learning_rate_power": 0.0}),
]


@pytest.mark.parametrize("num_rows", [ROWS, PARTS_FROM, None], ids=["one-unique", "in-parts", "unknown"])
def test_a_gradient_is_summed_per_distinct_row_on_small_and_large_variables_alike(num_rows):
    """`touched` takes one tf.unique below PARTS_FROM rows and `distinct`'s parts from there (or when
    the size is not known): the same rows and sums either way."""
    rng = np.random.default_rng(1)
    indices = rng.integers(0, ROWS, 300)
    values = rng.normal(size=(300, DIM)).astype(np.float32)
    rows, sums = touched(tf.IndexedSlices(tf.constant(values), tf.constant(indices)), tf.float32, num_rows)
    expected = np.zeros((ROWS, DIM), np.float32)
    np.add.at(expected, indices, values)
    assert sorted(rows.numpy().tolist()) == np.unique(indices).tolist()
    np.testing.assert_allclose(sums.numpy(), expected[rows.numpy()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("table", [True, False], ids=["embedding-table", "plain-variable"])
@pytest.mark.parametrize("ours, theirs, kwargs", CASES)
def test_touched_rows_follow_keras_untouched_rows_and_slots_stay_identical(ours, theirs, kwargs, table):
    rng = np.random.default_rng(0)
    start = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    (sparse_var, _), dense_var = _variable(start, table), keras.Variable(start)
    sparse_opt, dense_opt = ours(**kwargs), theirs(**kwargs)
    sparse_opt.build([sparse_var])
    slots_before = [v.numpy().copy() for v in sparse_opt.variables[1:]]
    untouched = np.setdiff1d(np.arange(ROWS), TOUCHED)
    for _ in range(4):
        g = _grad(rng)
        sparse_opt.apply([g], [sparse_var])
        dense_opt.apply([_dense(g)], [dense_var])
    rows = np.unique(TOUCHED)
    np.testing.assert_allclose(sparse_var.numpy()[rows], dense_var.numpy()[rows], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(sparse_var.numpy()[untouched], start[untouched])  # bit-identical
    for before, slot in zip(slots_before, sparse_opt.variables[1:]):
        if len(slot.shape) and slot.shape[0] == ROWS:
            np.testing.assert_array_equal(slot.numpy()[untouched], before[untouched])


@pytest.mark.parametrize("ours, theirs, kwargs", CASES)
def test_dense_gradients_take_the_keras_path_unchanged(ours, theirs, kwargs):
    rng = np.random.default_rng(1)
    start = rng.normal(size=(5, 4)).astype(np.float32)
    a, b = keras.Variable(start), keras.Variable(start)
    opt_a, opt_b = ours(**kwargs), theirs(**kwargs)
    for _ in range(3):
        g = tf.constant(rng.normal(size=(5, 4)), tf.float32)
        opt_a.apply([g], [a])
        opt_b.apply([g], [b])
    np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("table", [True, False], ids=["embedding-table", "plain-variable"])
def test_lazy_adam_corrects_each_row_by_its_own_step_count(table):
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-7
    var, owner = _variable(np.zeros((4, 2), np.float32), table)
    opt = optimizers.LazyAdam(learning_rate=lr, beta_1=b1, beta_2=b2, epsilon=eps)
    steps = [([0, 1], [[1.0, 2.0], [0.5, -1.0]]), ([0], [[-1.0, 0.25]]), ([0, 2], [[2.0, 1.0], [1.0, 1.0]])]
    m, v, count, ref = np.zeros((4, 2)), np.zeros((4, 2)), np.zeros(4), np.zeros((4, 2))
    for rows, grads in steps:
        opt.apply([tf.IndexedSlices(tf.constant(grads, tf.float32), tf.constant(rows))], [var])
        for r, g in zip(rows, np.array(grads)):
            count[r] += 1
            m[r] = m[r] + (g - m[r]) * (1 - b1)
            v[r] = v[r] + (g * g - v[r]) * (1 - b2)
            alpha = lr * np.sqrt(1 - b2 ** count[r]) / (1 - b1 ** count[r])
            ref[r] -= m[r] * alpha / (np.sqrt(v[r]) + eps)
    np.testing.assert_allclose(var.numpy(), ref, rtol=1e-5)
    assert var.numpy()[3].tolist() == [0.0, 0.0]
    # row 2 was updated once, at the optimizer's third step: its first update has magnitude lr
    np.testing.assert_allclose(np.abs(ref[2]), lr, rtol=1e-4)


def test_lazy_adam_equals_adam_for_rows_touched_every_step():
    rng = np.random.default_rng(2)
    start = rng.normal(size=(10, 2)).astype(np.float32)
    a, b = keras.Variable(start), keras.Variable(start)
    opt_a, opt_b = optimizers.LazyAdam(0.01), optimizers.Adam(0.01)
    for _ in range(5):
        g = tf.IndexedSlices(tf.constant(rng.normal(size=(3, 2)), tf.float32), tf.constant([1, 4, 8]))
        opt_a.apply([g], [a])
        opt_b.apply([g], [b])
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


def test_weight_decay_spares_embedding_tables():
    import sok_tutorial as sok

    layer = sok.All2AllDenseEmbedding(20, 2, slot_num=1, nnz_per_slot=1, use_hashtable=False)
    layer.build()
    dense = keras.Variable(np.ones((2, 2), np.float32))
    opt = optimizers.SGD(0.1, weight_decay=0.5)
    before = layer.embedding_variable.numpy().copy()
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3]))
    opt.apply([grad, tf.zeros([2, 2])], [layer.embedding_variable, dense])
    changed = np.flatnonzero((layer.embedding_variable.numpy() != before).any(1))
    assert changed.tolist() == [3] and float(dense.numpy()[0, 0]) < 1.0


FRESH_CASES = [(ours, kwargs) for ours, _, kwargs in CASES] + [(optimizers.LazyAdam, {"learning_rate": 0.01}),
                                                              (optimizers.RowWiseAdagrad, {"learning_rate": 0.1})]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf-function"])
@pytest.mark.parametrize("ours, kwargs", FRESH_CASES)
def test_a_row_given_to_a_new_key_starts_with_fresh_slots(ours, kwargs, graph):
    rng = np.random.default_rng(3)
    start = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    table, control = _table(start, marks=True), _table(start)  # the control has no marks (fresh_rows: None)
    opt, control_opt = ours(**kwargs), ours(**kwargs)
    for _ in range(2):  # rows 3, 7, 12 and 39 build up optimizer state
        g = _grad(rng)
        opt.apply([g], [table.variable])
        control_opt.apply([g], [control.variable])
    before = table.variable.numpy()
    table.state.row_fresh.assign(np.isin(np.arange(ROWS), [7, 20]))  # rows 7 and 20 went to new keys
    values = rng.normal(size=(2, DIM)).astype(np.float32)
    last = tf.IndexedSlices(tf.constant(values), tf.constant([3, 7]))  # row 20 is not touched: it stays marked

    def last_step() -> None:
        opt.apply([last], [table.variable])

    (tf.function(last_step) if graph else last_step)()
    control_opt.apply([last], [control.variable])

    # row 7 moves as it would under a fresh optimizer at the same step, on a table holding the same rows
    fresh, fresh_opt = _table(before), ours(**kwargs)
    fresh_opt.build([fresh.variable])
    fresh_opt.iterations.assign(int(opt.iterations) - 1)  # Adam's bias correction counts the optimizer's steps
    fresh_opt.apply([tf.IndexedSlices(tf.constant(values[1:]), tf.constant([7]))], [fresh.variable])
    np.testing.assert_allclose(table.variable.numpy()[7], fresh.variable.numpy()[7], rtol=1e-6, atol=1e-7)
    slots, control_slots = table.optimizer_slots(opt), control.optimizer_slots(control_opt)
    for slot, fresh_slot in zip(slots, fresh.optimizer_slots(fresh_opt), strict=True):
        np.testing.assert_allclose(slot.numpy()[7], fresh_slot.numpy()[7], rtol=1e-6, atol=1e-7)
    if slots:  # the test means something: without the reset, row 7's state would differ
        assert any(not np.allclose(s.numpy()[7], c.numpy()[7]) for s, c in zip(slots, control_slots))
    # every other row and slot row is exactly what it would be without marks
    others = np.arange(ROWS) != 7
    np.testing.assert_array_equal(table.variable.numpy()[others], control.variable.numpy()[others])
    for slot, control_slot in zip(slots, control_slots, strict=True):
        np.testing.assert_array_equal(slot.numpy()[others], control_slot.numpy()[others])
    marked = [20] if slots else [7, 20]  # row 7's mark is cleared, row 20's kept (plain SGD, no state: both kept)
    assert np.flatnonzero(table.state.row_fresh.numpy()).tolist() == marked


def test_each_optimizer_declares_the_slots_it_makes_for_a_table():
    """An optimizer's SlotLayout (what the planner prices and column sharding slices) matches the slot
    variables it really creates for a table: their widths per element and per row."""
    from sok_tutorial.embedding.optimizers import LAYOUTS, slot_layout

    cases = {name: cls(0.1) for name, cls in LAYOUTS.items()}
    cases.update(sgd_momentum=optimizers.SGD(0.1, momentum=0.9), adam_amsgrad=optimizers.Adam(0.1, amsgrad=True))
    assert set(LAYOUTS) == {"sgd", "adam", "lazyadam", "adagrad", "ftrl", "rowwise_adagrad"}
    for name, opt in cases.items():
        table = EmbeddingTable(ROWS, DIM, dynamic=False, name=f"t_{name}")
        table.build()
        opt.build([table.variable])
        layout = slot_layout(opt)
        made = {}
        for slot in table.optimizer_slots(opt):
            width = int(slot.shape[1]) if len(slot.shape) == 2 else 0
            per_element, per_row = layout.of(slot.name)
            made[slot.name] = (width, 1 if len(slot.shape) == 1 else 0)
            assert (per_element * DIM + per_row if width else per_row) == (width or 1), (name, slot.name)
        assert len(made) == len(layout.slots), (name, made)
        floats = sum(int(np.prod(s.shape)) for s in table.optimizer_slots(opt))
        assert floats == ROWS * (layout.per_element * DIM + layout.per_row), name
    assert slot_layout("lazyadam").per_row == 1 and not slot_layout("rowwise_adagrad").splits_by_column
    with pytest.raises(ValueError, match="optimizer='nadam' is invalid: expected one of"):
        slot_layout("nadam")


@pytest.mark.parametrize("name", ["SGD", "Adagrad", "RowWiseAdagrad", "LazyAdam", "Ftrl"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_training_step_reads_each_touched_row_of_the_table_once(name, dynamic):
    """The optimizer updates from the rows the lookup read (`UniqueRowsGradient.read`): one gather
    of the table's variable per step, and the same update as a step whose optimizer gathers them again."""
    keys = tf.constant([[3, 7], [7, 12]], tf.int64)

    def run(reuse: bool) -> tuple[np.ndarray, int]:
        table = EmbeddingTable(ROWS, DIM, dynamic=dynamic, initializer=keras.initializers.RandomUniform(seed=1))
        table.build()
        opt = getattr(optimizers, name)(0.1)
        opt.build([table.variable])

        @tf.function
        def step() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(table(keys, training=True) - 0.5))
            gradient = tape.gradient(loss, [table.variable])[0]
            if not reuse:  # the same gradient without the lookup's rows: the optimizer reads them itself
                gradient = tf.IndexedSlices(gradient.values, gradient.indices, gradient.dense_shape)
            opt.apply([gradient], [table.variable])
            return loss

        for _ in range(3):
            step()
        graph = step.get_concrete_function().graph
        handle = table.variable.value.handle
        inside = [internal for external, internal in graph.captures if external is handle]
        reads = sum(1 for op in graph.get_operations() if op.type == "ResourceGatherNd" and op.inputs[0] is inside[0])
        return table.variable.numpy(), reads

    once, reads_once = run(True)
    twice, reads_twice = run(False)
    np.testing.assert_allclose(once, twice, rtol=1e-6, atol=1e-7)
    assert (reads_once, reads_twice) == (1, 2)
