"""`TablesDLRM`: DLRM over table layers made outside it; the same model as `DLRM`, and N replicas
with sharded tables train as one device."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.embedding import DistributedEmbedding, QREmbedding, rows_per_replica
from sok_tutorial.models import DLRM
from sok_tutorial.models.tables_dlrm import TablesDLRM
from sok_tutorial.training import make_sok_step

CARDS, NAMES, CONT, DIM, BATCH = [50, 70, 30], ["a", "b", "c"], ["x", "y"], 4, 32


def batch(size: int = BATCH, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {n: rng.integers(0, c, size) for n, c in zip(NAMES, CARDS)}
    out["continuous"] = rng.exponential(5.0, (size, len(CONT))).astype("float32")
    return out


def table(name: str, rows: int, **options) -> DistributedEmbedding:
    return DistributedEmbedding("sum", rows, DIM, slot_num=1, max_nnz=1, use_hashtable=False, name=name, **options)


def copy_dense(source, target) -> None:
    for a, b in zip([*source.bottom, *source.top, source.logit], [*target.bottom, *target.top, target.logit]):
        b.set_weights(a.get_weights())


def test_with_dlrm_s_rows_and_weights_it_is_dlrm():
    dlrm = DLRM(CARDS, NAMES, CONT, embedding_dim=DIM, bottom_mlp=[8], top_mlp=[8, 4])
    x = batch()
    expected = dlrm(x).numpy()
    model = TablesDLRM({n: table(n, c) for n, c in zip(NAMES, CARDS)}, bottom_mlp=[8], top_mlp=[8, 4])
    model(x)
    rows, start = dlrm.embedding.table.variable.numpy(), 0  # one table: the features' rows one after another
    for name, cardinality in zip(NAMES, CARDS):
        model.tables[name].table.variable.assign(rows[start:start + cardinality])
        start += cardinality
    copy_dense(dlrm, model)
    np.testing.assert_allclose(model(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    separate = {**{n: tf.constant(v) for n, v in x.items() if n != "continuous"},
                **{n: tf.constant(x["continuous"][:, i]) for i, n in enumerate(CONT)}}
    named = TablesDLRM(model.tables, cont_names=CONT, bottom_mlp=[8], top_mlp=[8, 4])  # features one by one
    named(separate)
    copy_dense(dlrm, named)
    np.testing.assert_allclose(named(separate).numpy(), expected, rtol=1e-5, atol=1e-6)
    sliced = TablesDLRM(model.tables, bottom_mlp=[8], top_mlp=[8, 4], interaction_slice=BATCH // 3)  # 3 slices
    sliced(x)
    copy_dense(dlrm, sliced)
    np.testing.assert_allclose(sliced(x).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_sharded_tables_on_two_replicas_train_as_one_device(strategy_of):
    """Built in the strategy's scope (the tables for real, each replica its shard), a row- and a
    column-sharded table and a replicated QR table train with `make_sok_step` as on one device."""
    def make(n: int) -> TablesDLRM:
        keras.utils.set_random_seed(3)
        tables = {"a": table("a", rows_per_replica(CARDS[0], n), sharding="row"),
                  "b": table("b", CARDS[1], sharding="column"),
                  "c": QREmbedding("sum", CARDS[2], DIM, num_collisions=4, name="c")}
        model = TablesDLRM(tables, bottom_mlp=[8], top_mlp=[8])
        model.build({"continuous": (None, len(CONT))})
        return model

    one = make(1)
    step_one = make_sok_step(one, sok.optimizers.Adam(0.05), global_batch_size=BATCH)
    strategy = strategy_of(2)
    with strategy.scope():
        two = make(2)
        optimizer = sok.optimizers.Adam(0.05)
    copy_dense(one, two)
    step_two = make_sok_step(two, optimizer, global_batch_size=BATCH, strategy=strategy)
    batches = [batch(seed=s) for s in range(4)]
    labels = [(b["a"] % 2).astype("float32")[:, None] for b in batches]
    losses_one = [float(step_one(b, y)) for b, y in zip(batches, labels)]
    losses_two = [float(step_two(b, y)) for b, y in zip(batches, labels)]
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5)
    assert losses_one[-1] < losses_one[0]
    np.testing.assert_allclose(two(batches[0]).numpy(), one(batches[0]).numpy(), rtol=1e-4, atol=1e-5)


def test_remap_looks_each_id_up_as_the_key_it_maps_to():
    remap = np.random.default_rng(0).permutation(CARDS[1])
    x = batch()
    remapped = TablesDLRM({n: table(n, c) for n, c in zip(NAMES, CARDS)}, remap={"b": remap}, bottom_mlp=[8])
    plain = TablesDLRM({n: table(n, c) for n, c in zip(NAMES, CARDS)}, bottom_mlp=[8])
    remapped(x), plain(x)
    copy_dense(remapped, plain)  # the tables' rows are seeded by key: the same in both
    np.testing.assert_allclose(remapped(x).numpy(), plain({**x, "b": remap[x["b"]]}).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make, message", [
    (lambda: TablesDLRM({}), r"tables=\{\} is invalid"),
    (lambda: TablesDLRM({"a": table("a", 5), "b": DistributedEmbedding("sum", 5, 3, slot_num=1, max_nnz=1)}),
     r"every layer must have one embedding_vec_size.*'a': 4, 'b': 3"),
    (lambda: TablesDLRM({"a": table("a", 5)}, remap={"z": [0]}), r"remap: \['z'\] are not among"),
    (lambda: TablesDLRM({"a": table("a", 5)}, interaction_slice=0), r"interaction_slice"),
])
def test_bad_arguments_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()
