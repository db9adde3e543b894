"""Keys deduplicated in the input pipeline (`UniqueKeys`), and a dynamic table's rows looked up there
(`lookup_ahead`), train exactly as the keys themselves."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.embedding import EmbeddingTable, UniqueKeys, lookup_ahead, unique_keys  # noqa: E402
from sok_tutorial.embedding.dedup import PARTS_FROM, distinct, row_position_pairs, sum_by_position  # noqa: E402
from sok_tutorial.embedding.ops import WRITE_PARTS_FROM, write_rows  # noqa: E402

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


def _keys_like(pattern: str) -> np.ndarray:
    rng = np.random.default_rng(1)
    if pattern == "empty":
        return np.zeros(0, np.int64)
    if pattern == "int32":
        pool = rng.integers(-2**31, 2**31 - 1, 700).astype(np.int32)
    else:
        pool = rng.integers(-2**62, 2**62, 700)
        pool = {"random": pool, "multiples_of_4": pool * 4,
                "extremes": np.r_[pool, -2**63, 2**63 - 1, 0, -1]}[pattern]
    return rng.choice(pool, 3000)  # repeats


@pytest.mark.parametrize("pattern", ["random", "multiples_of_4", "int32", "extremes", "empty"])
@pytest.mark.parametrize("shape", ["static", "unknown"])
def test_distinct_in_parts_gives_each_key_its_place_among_the_distinct_keys(pattern, shape):
    keys = _keys_like(pattern)
    if shape == "static":  # four parts from the first key on
        unique, position = distinct(tf.constant(keys), parts_from=1)
    else:  # the size is known only when the function runs: parts from 1,000 keys on (3,000 here)
        run = tf.function(lambda k: distinct(k, parts_from=1000), input_signature=[tf.TensorSpec([None], keys.dtype)])
        unique, position = run(tf.constant(keys))
    assert unique.dtype == keys.dtype and position.dtype == tf.int32
    np.testing.assert_array_equal(np.sort(unique.numpy()), np.unique(keys))  # each key once
    np.testing.assert_array_equal(tf.gather(unique, position).numpy(), keys)


def test_distinct_of_a_size_unknown_while_tracing_keeps_the_order_of_the_keys_unless_any_order():
    """A lookup's order (a dynamic table's rows) depends on the keys alone: small batches come out as
    tf.unique gives them, whatever was known while tracing. An optimizer's (`any_order`) takes the
    parts with no tf.cond in its graph."""
    keys = tf.constant([7, 3, 7, 8, 3, 5], tf.int64)
    spec = [tf.TensorSpec([None], tf.int64)]
    ordered = tf.function(lambda k: distinct(k), input_signature=spec)
    any_order = tf.function(lambda k: distinct(k, any_order=True), input_signature=spec)
    assert [t.numpy().tolist() for t in ordered(keys)] == [[7, 3, 8, 5], [0, 1, 0, 2, 1, 3]]
    unique, position = any_order(keys)
    assert sorted(unique.numpy().tolist()) == [3, 5, 7, 8] and tf.gather(unique, position).numpy().tolist() == \
        keys.numpy().tolist()
    def branches(fn):
        return [op.type for op in fn.get_concrete_function().graph.get_operations() if "If" in op.type]
    assert branches(ordered) and not branches(any_order)


@pytest.mark.parametrize("start", [0, 7])
def test_row_position_pairs_are_the_stacked_pairs(start):
    """The bitcast pairs equal ``stack([start + k, position[k]], 1)``, the largest int32 position
    included (its high half must not spill into the low one), with a start known or a tensor."""
    position = np.array([0, 2**31 - 1, 5, 0, 123_456_789], np.int32)
    expected = np.stack([start + np.arange(5), position], 1)
    for first in (start, tf.constant(start)):
        out = row_position_pairs(tf.constant(position), first)
        assert out.dtype == tf.int32 and out.numpy().tolist() == expected.tolist()
    assert row_position_pairs(tf.zeros([0], tf.int32)).shape == (0, 2)


@pytest.mark.parametrize("rows", [0, 1, 1000, PARTS_FROM + 1])  # two products over halves, one of them empty
def test_sum_by_position_sums_the_rows_of_each_position_alike_however_traced(rows):
    """The same sums, to the bit, whether the number of rows is known while tracing or not, and with
    the product's indices made ahead (`UniqueKeys.pairs`)."""
    rng = np.random.default_rng(3)
    count = 300
    position = rng.integers(0, count, rows).astype(np.int32)
    values = rng.normal(size=(rows, 2, 3)).astype(np.float32)
    expected = np.zeros((count, 2, 3), np.float64)
    np.add.at(expected, position, values)
    unknown = tf.function(lambda v, p: sum_by_position(v, p, count), input_signature=[
        tf.TensorSpec([None, 2, 3], tf.float32), tf.TensorSpec([None], tf.int32)])
    pairs = tf.constant(np.stack([np.arange(rows), position], 1).reshape(rows, 2), tf.int64)
    known = tf.constant(values), tf.constant(position), count
    outs = [sum_by_position(*known).numpy(), unknown(values, position).numpy(), sum_by_position(*known, pairs).numpy()]
    assert outs[0].shape == (count, 2, 3)
    np.testing.assert_allclose(outs[0], expected, rtol=1e-4, atol=1e-4)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_sum_by_position_on_a_big_endian_host_sums_alike(monkeypatch):
    """The stacked pairs a big-endian host builds give the sums the bitcast pairs give, to the bit."""
    import sys

    rng = np.random.default_rng(5)
    position = tf.constant(rng.integers(0, 40, 101).astype(np.int32))
    values = tf.constant(rng.normal(size=(101, 3)).astype(np.float32))
    little = sum_by_position(values, position, 40).numpy()
    monkeypatch.setattr(sys, "byteorder", "big")
    np.testing.assert_array_equal(sum_by_position(values, position, 40).numpy(), little)


@pytest.mark.parametrize("count", [0, 1, 5, WRITE_PARTS_FROM + 3])
@pytest.mark.parametrize("how", ["eager", "unknown", "static"])
@pytest.mark.parametrize("row_shape", [(), (3,)])
def test_write_rows_writes_exactly_the_given_rows(count, how, row_shape):
    rng = np.random.default_rng(4)
    size = 2 * WRITE_PARTS_FROM + 10
    before = rng.normal(size=(size, *row_shape)).astype(np.float32)
    rows = rng.choice(size, count, replace=False).astype(np.int64)
    values = rng.normal(size=(count, *row_shape)).astype(np.float32)
    variable = tf.Variable(before)
    if how == "eager":
        write_rows(variable, tf.constant(rows), tf.constant(values))
    else:  # in a step that returns nothing of the write, whose rows are known while tracing or not
        shape = [None] if how == "unknown" else [count]
        spec = [tf.TensorSpec(shape, tf.int64), tf.TensorSpec(shape + list(row_shape), tf.float32)]

        @tf.function(input_signature=spec)
        def step(r, v):
            write_rows(variable, r, v)

        step(rows, values)
    expected = before.copy()
    expected[rows] = values
    np.testing.assert_array_equal(variable.numpy(), expected)


def test_a_step_reads_what_write_rows_wrote_and_writes_before_it_land_first():
    variable = tf.Variable(tf.zeros([WRITE_PARTS_FROM * 2, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(rows):
        variable.assign(tf.fill(tf.shape(variable), 5.0))  # before: overwritten where the rows are
        write_rows(variable, rows, tf.ones([tf.size(rows), 2]) * tf.cast(rows % 7, tf.float32)[:, None])
        return tf.gather(variable, rows), tf.reduce_sum(variable)  # after: sees every row written

    rows = np.arange(0, WRITE_PARTS_FROM * 2, 3, dtype=np.int64)
    read, total = step(rows)
    np.testing.assert_array_equal(read.numpy(), np.repeat(rows[:, None] % 7, 2, 1).astype(np.float32))
    assert float(total) == 2 * ((rows % 7).sum() + 5 * (WRITE_PARTS_FROM * 2 - len(rows)))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_batch_deduplicated_in_parts_trains_a_table_as_its_numpy_reference(dynamic):
    rng = np.random.default_rng(2)
    # PARTS_FROM keys: in parts (a table of row ids from PARTS_FROM rows: below, one tf.unique does)
    capacity, rate = 6000 if dynamic else 2 * PARTS_FROM, 0.5
    keys = (rng.zipf(1.2, (PARTS_FROM // 4, 4)) % capacity).astype(np.int64)
    if dynamic:
        keys = keys * 7919 - 10**9
    weights = rng.normal(size=(*keys.shape, DIM)).astype(np.float32)
    table = EmbeddingTable(capacity, DIM, dynamic=dynamic)
    table.build()
    before = dict(zip(keys.ravel().tolist(), (table.initial_values(keys.ravel()) if dynamic else
                                              table.variable.numpy()[keys.ravel()])))
    with tf.GradientTape() as tape:
        vectors = table(tf.constant(keys), training=True)
        loss = tf.reduce_sum(vectors * weights)
    sok.optimizers.SGD(rate).apply(tape.gradient(loss, [table.variable]), [table.variable])
    np.testing.assert_array_equal(vectors.numpy(), np.array([before[k] for k in keys.ravel()]).reshape(vectors.shape))
    expected = {k: v.astype(np.float64) for k, v in before.items()}  # (float32 sums of ~10k terms differ by ~1e-5)
    for k, w in zip(keys.ravel().tolist(), weights.reshape(-1, DIM)):
        expected[k] -= rate * w
    if dynamic:
        out = table.export()
        assert sorted(out["keys"].tolist()) == sorted(expected)
        got = dict(zip(out["keys"].tolist(), out["vectors"]))
    else:
        trained = table.variable.numpy()
        got = {k: trained[k] for k in expected}
    for k, v in expected.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-4)


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


def _dynamic_layer() -> keras.layers.Layer:
    layer = sok.DistributedEmbedding("sum", ROWS, DIM, slot_num=SLOTS, max_nnz=1, use_hashtable=True)
    layer(tf.zeros([1, SLOTS], tf.int64))  # built: its index exists (an inference call gives no key a row)
    return layer


@pytest.mark.parametrize("optimizer", ["SGD", "Adagrad"])
def test_rows_looked_up_ahead_train_the_same_dynamic_table(optimizer):
    plain, plain_out = _train(_dynamic_layer(), optimizer, _batches(None))
    layer = _dynamic_layer()
    ahead = _batches(None).map(lookup_ahead(layer)).prefetch(3)  # looked up before the steps before give rows
    found, out = _train(layer, optimizer, ahead)
    np.testing.assert_allclose(out, plain_out, rtol=1e-6)
    np.testing.assert_allclose(found, plain, rtol=1e-6, atol=1e-7)
    rows = np.concatenate([ready.rows.numpy() for ready, _ in _batches(None).map(lookup_ahead(layer))])
    assert (rows >= 0).all()  # once trained, the pipeline finds every key


def test_a_table_checks_the_rows_it_is_given_and_looks_up_the_others():
    table = EmbeddingTable(64, DIM)
    table.lookup(tf.constant([5, 6, 7], tf.int64), training=True)  # rows 0, 1, 2
    keys = tf.constant([7, 5, 9, 6], tf.int64)  # 9 is new
    expected = table.lookup(keys).numpy()  # (9: zeros, no row)
    for hints in ([2, 0, -1, 1],  # right
                  [0, 2, 1, -1],  # wrong rows, a row held by another key
                  [40, 0, 3, 63],  # rows not in use
                  [-1, -1, -1, -1]):
        ready = UniqueKeys(keys, tf.range(4), rows=tf.constant(hints, tf.int64))
        np.testing.assert_array_equal(table.lookup(ready).numpy(), expected, err_msg=str(hints))
    vectors = table.lookup(UniqueKeys(keys, tf.range(4), rows=tf.constant([0, 0, 0, 0], tf.int64)), training=True)
    assert int(table.size) == 4 and np.abs(vectors.numpy()[2]).sum() > 0  # 9 got a row and its initial vector
    np.testing.assert_array_equal(vectors.numpy()[[0, 1, 3]], expected[[0, 1, 3]])


def test_rows_looked_up_before_a_restore_are_not_trusted():
    table = EmbeddingTable(64, DIM)
    keys = tf.constant([11, 12, 13], tf.int64)
    table.lookup(keys, training=True)
    ready = table.rows_ahead(unique_keys(keys))
    assert ready.rows.numpy().tolist() == [0, 1, 2]
    saved = table.export()
    table.restore({name: value[::-1] for name, value in saved.items()})  # the same keys in other rows
    np.testing.assert_array_equal(table.lookup(ready).numpy(), table.lookup(keys).numpy())
    np.testing.assert_array_equal(table.lookup(ready).numpy(), saved["vectors"])


def test_the_pipeline_looks_keys_up_only_once_nearly_all_have_rows():
    table = EmbeddingTable(64, DIM)
    table.lookup(tf.range(9, dtype=tf.int64), training=True)  # keys 0..8 in rows 0..8
    nine_in_ten = table.rows_ahead(unique_keys(tf.range(10, dtype=tf.int64))).rows.numpy().tolist()
    assert nine_in_ten == [*range(9), -1]
    assert table.rows_ahead(unique_keys(tf.range(1, 11, dtype=tf.int64))).rows.numpy().tolist() == [-1] * 10
    assert table.rows_ahead(unique_keys(tf.zeros([0], tf.int64))).rows.numpy().tolist() == []


def test_tables_whose_rows_move_take_no_rows_ahead():
    for table in (EmbeddingTable(64, DIM, eviction_policy="lru"), EmbeddingTable(64, DIM, track_changes=True),
                  EmbeddingTable(64, DIM, dynamic=False)):
        table.build()
        assert not table.takes_rows_ahead and lookup_ahead(table)(tf.constant([1, 2], tf.int64)).rows is None


def test_lookup_ahead_needs_a_built_layer_or_table():
    with pytest.raises(ValueError, match="not built yet"):
        lookup_ahead(sok.DistributedEmbedding("sum", ROWS, DIM, slot_num=SLOTS, max_nnz=1, use_hashtable=True))
    with pytest.raises(TypeError, match="needs an embedding layer or table, got int"):
        lookup_ahead(3)
