"""`bytes_per_device`: what each replica holds, read from the copies of the variables themselves."""
from __future__ import annotations

import numpy as np
import pytest

import sok_tutorial as sok
from sok_tutorial.embedding import DistributedEmbedding, MixedDimensionEmbedding, QREmbedding, rows_per_replica
from sok_tutorial.embedding.device_bytes import bytes_per_device
from sok_tutorial.embedding.placement import replica_bytes


def layers_of_every_kind(n: int) -> list:
    return [
        DistributedEmbedding("sum", 100, 8, slot_num=1, max_nnz=1, use_hashtable=False, name="replicated"),
        DistributedEmbedding("sum", rows_per_replica(1000, n), 8, slot_num=1, max_nnz=1, use_hashtable=False,
                             sharding="row", name="rows"),
        DistributedEmbedding("sum", 500, 8, slot_num=1, max_nnz=1, use_hashtable=False, sharding="column",
                             storage_dtype="bfloat16", name="columns"),
        QREmbedding("sum", 300, 8, num_collisions=4, name="qr"),
        MixedDimensionEmbedding("sum", [10, 290], 8, block_dims=[8, 2], name="mixed"),
    ]


@pytest.mark.parametrize("replicas", [2, 4])
def test_every_replica_holds_what_the_shapes_say(strategy_of, replicas):
    """Each replica's copies of the tables, Adam's slots and the projections add up to
    `replica_bytes`, layer by layer, on every replica."""
    strategy = strategy_of(replicas)
    with strategy.scope():
        layers = layers_of_every_kind(replicas)
        for layer in layers:
            layer.build()
        optimizer = sok.optimizers.Adam(0.01)
        optimizer.build([v for layer in layers for v in layer.trainable_variables])
    held = bytes_per_device(layers, optimizer)
    assert len(held) == replicas and all(d.endswith(f"CPU:{i}") for i, d in enumerate(held))
    assert set(held.values()) == {replica_bytes(layers, optimizer)}
    for layer in layers:
        assert set(bytes_per_device([layer], optimizer).values()) == {replica_bytes([layer], optimizer)}


def test_a_sharded_table_holds_a_shard_on_each_replica_a_replicated_one_all_of_it(strategy_of):
    with strategy_of(2).scope():
        rows = DistributedEmbedding("sum", rows_per_replica(1000, 2), 4, slot_num=1, max_nnz=1, use_hashtable=False,
                                    sharding="row")
        whole = DistributedEmbedding("sum", 1000, 4, slot_num=1, max_nnz=1, use_hashtable=False)
        rows.build(), whole.build()
    assert list(bytes_per_device([rows]).values()) == [500 * 4 * 4] * 2
    assert list(bytes_per_device([whole]).values()) == [1000 * 4 * 4] * 2


def test_only_the_slots_of_the_layers_given_count():
    a = DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, use_hashtable=False, name="a")
    b = DistributedEmbedding("sum", 30, 4, slot_num=1, max_nnz=1, use_hashtable=False, name="b")
    a.build(), b.build()
    optimizer = sok.optimizers.Adam(0.01)
    assert list(bytes_per_device([a], optimizer).values()) == [10 * 4 * 4]  # not built: no slots yet
    optimizer.build(a.trainable_variables + b.trainable_variables)
    (one,) = bytes_per_device([a], optimizer).values()
    assert one == replica_bytes([a], optimizer) == 10 * 4 * 4 * 3  # rows and Adam's two moments
    assert list(bytes_per_device([a, b], optimizer).values()) == [int(np.sum([one, 30 * 4 * 4 * 3]))]
