"""Every public entry point of `sok_tutorial.embedding` (and the sparse optimizers) fed bad input:
the error type, and a message naming the argument and what was expected."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.embedding import (
    All2AllDenseEmbedding,
    DistributedEmbedding,
    EmbeddingTable,
    TableSpec,
    VocabularyExhausted,
    group_embedding_lookup_sparse,
    mixed_dimensions,
    plan,
)


def _built(capacity: int = 4, dim: int = 2, dynamic: bool = True) -> EmbeddingTable:
    table = EmbeddingTable(capacity, dim, dynamic=dynamic, name="t")
    table.build()
    return table


CASES = [
    ("table capacity 0", lambda: EmbeddingTable(0, 4), ValueError, r"capacity=0"),
    ("lifecycle ttl_seconds inf", lambda: EmbeddingTable(8, 2, eviction_policy="ttl", ttl_seconds=float("inf")),
     ValueError, r"ttl_seconds=inf is invalid"),
    ("lifecycle track_changes 'no'", lambda: EmbeddingTable(8, 2, track_changes="no"), ValueError,
     r"track_changes='no' is invalid"),
    ("restore short marks", lambda: _built().restore({"keys": np.arange(2), "vectors": np.zeros((2, 2)),
                                                      "marks": np.zeros(1, np.int64)}),
     ValueError, r"marks has shape \(1,\), expected \(2,\)"),
    ("plan shardings a str", lambda: plan([TableSpec("t", 10, 2)], 2, 1 << 20, global_batch=8,
                                              shardings="row"), ValueError, r"shardings='row' is invalid"),
    ("plan link_gbps 0", lambda: plan([TableSpec("t", 10, 2)], 2, 1 << 20, global_batch=8, link_gbps=0),
     ValueError, r"link_gbps=0 is invalid"),
    ("mixed_dimensions min above base", lambda: mixed_dimensions([4, 4], 2, min_dim=3), ValueError,
     r"min_dim=3 is invalid"),
    ("table capacity float", lambda: EmbeddingTable(2.5, 4), ValueError, r"capacity=2\.5"),
    ("table dim negative", lambda: EmbeddingTable(4, -1), ValueError, r"dim=-1"),
    ("table unknown initializer", lambda: EmbeddingTable(4, 2, initializer="orthogonal"), ValueError,
     r"initializer"),
    ("table float keys", lambda: _built()(tf.constant([1.5])), TypeError, r"keys must be integers"),
    ("table string keys", lambda: _built()(tf.constant(["a"])), TypeError, r"keys must be integers"),
    ("table ragged keys", lambda: _built()(tf.ragged.constant([[1], [2, 3]], tf.int64)), TypeError,
     r"t: keys must be a dense tensor, got a RaggedTensor"),
    ("table sparse keys", lambda: _built().lookup(tf.sparse.from_dense(tf.constant([[1, 0]], tf.int64))), TypeError,
     r"t: keys must be a dense tensor, got a SparseTensor"),
    ("table list of floats", lambda: _built().lookup([1.5]), TypeError, r"keys must be integers .*got float64"),
    ("table restore 2-D keys", lambda: _built().restore({"keys": np.zeros((2, 2), np.int64),
                                                          "vectors": np.zeros((2, 2), np.float32)}),
     ValueError, r"keys must be a 1-D integer array"),
    ("table restore wrong width", lambda: _built().restore({"keys": np.arange(2), "vectors": np.zeros((2, 3))}),
     ValueError, r"vectors has shape \(2, 3\), expected \(2, 2\)"),
    ("table restore too many keys", lambda: _built().restore({"keys": np.arange(9), "vectors": np.zeros((9, 2))}),
     ValueError, r"9 keys .*4"),
    ("table restore repeated keys", lambda: _built().restore({"keys": np.array([3, 1, 3]),
                                                               "vectors": np.zeros((3, 2))}),
     ValueError, r"keys repeat"),
    ("table restore without vectors", lambda: _built().restore({"keys": np.arange(2)}), ValueError,
     r"t: rows by key need vectors, got the arrays \['keys'\]"),
    ("table restore without keys", lambda: _built().restore({"vectors": np.zeros((2, 2))}), ValueError,
     r"t: rows by key need keys"),
    ("table restore string vectors", lambda: _built().restore({"keys": np.arange(2), "vectors": np.full((2, 2), "a")}),
     ValueError, r"vectors must hold real numbers, got dtype <U1"),
    ("table restore uint64 key past int64", lambda: _built().restore({"keys": np.array([2**64 - 1], np.uint64),
                                                                       "vectors": np.zeros((1, 2))}),
     ValueError, r"keys must fit in int64"),
    ("table dynamic 'False'", lambda: EmbeddingTable(4, 2, dynamic="False"), ValueError,
     r"dynamic='False' is invalid: expected True or False"),
    ("table export since float", lambda: _built().export(since=1.5), TypeError, r"since=1.5 is invalid"),
    ("lifecycle lfu_halflife 2**63", lambda: EmbeddingTable(8, 2, eviction_policy="lfu", lfu_halflife=2**63),
     ValueError, r"lfu_halflife=9223372036854775808 is invalid: expected fewer than"),
    ("lifecycle sketch_width 2**40", lambda: EmbeddingTable(8, 2, min_count=2, sketch_width=2**40), ValueError,
     r"sketch_width=1099511627776 is invalid: expected at most 2147483648"),
    ("lifecycle eviction_log 2**40", lambda: EmbeddingTable(8, 2, eviction_policy="lru", eviction_log=2**40),
     ValueError, r"eviction_log=1099511627776 is invalid"),
    ("static restore out of range", lambda: _built(dynamic=False).restore({"keys": np.array([7]),
                                                                            "vectors": np.zeros((1, 2))}),
     ValueError, r"\[0, 4\)"),
    ("layer unknown combiner", lambda: DistributedEmbedding("max", 10, 4, slot_num=2, max_nnz=1), ValueError,
     r"combiner='max'"),
    ("layer slot_num 0", lambda: DistributedEmbedding("sum", 10, 4, slot_num=0, max_nnz=1), ValueError,
     r"slot_num=0"),
    ("layer max_nnz 0", lambda: DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=0), ValueError,
     r"max_nnz=0"),
    ("layer key_dtype float", lambda: DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, key_dtype="float32"),
     ValueError, r"key_dtype='float32'"),
    ("layer unknown sharding", lambda: DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, sharding="diagonal"),
     ValueError, r"sharding='diagonal'"),
    ("layer unknown exchange", lambda: All2AllDenseEmbedding(10, 4, 1, 1, exchange="broadcast"), ValueError,
     r"exchange='broadcast'"),
    ("layer use_hashtable 'no'", lambda: DistributedEmbedding("sum", 10, 4, slot_num=1, max_nnz=1, use_hashtable="no"),
     ValueError, r"use_hashtable='no' is invalid: expected True or False"),
    ("layer vocabulary 0", lambda: All2AllDenseEmbedding(0, 4, 1, 1), ValueError, r"max_vocabulary_size_per_gpu=0"),
    ("dense layer ragged keys", lambda: All2AllDenseEmbedding(10, 4, 1, 1)(tf.ragged.constant([[1]], tf.int64)),
     TypeError, r"takes dense keys"),
    ("dense layer wrong shape", lambda: All2AllDenseEmbedding(10, 4, 2, 1)(tf.constant([[[1], [2], [3]]], tf.int64)),
     ValueError, r"slot_num, nnz_per_slot"),
    ("sparse layer wrong slots", lambda: DistributedEmbedding("sum", 10, 4, slot_num=2, max_nnz=1)(
        tf.constant([[1, 2, 3]], tf.int64)), ValueError, r"slot_num=2"),
    ("group lookup lengths", lambda: group_embedding_lookup_sparse([tf.zeros([3, 2])], [], ["sum"]), ValueError,
     r"params"),
    ("lazyadam negative rate", lambda: sok.optimizers.LazyAdam(-1.0), ValueError, r"learning_rate"),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_by_name(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_a_list_of_python_ints_is_looked_up_as_int64_keys():
    table = _built(capacity=8)
    assert table.lookup([1, 2**40], training=True).shape == (2, 2) and table.size == 2


def test_numpy_numbers_are_taken_where_python_ones_are():
    table = EmbeddingTable(8, 2, eviction_policy="ttl", ttl_seconds=np.float32(1.5), admit_probability=np.float32(0.5))
    assert table.lifecycle.ttl_seconds == 1.5 and table.lifecycle.admit_probability == 0.5
    assert type(EmbeddingTable(8, 2, eviction_policy="ttl", ttl=np.int64(5)).get_config()["ttl"]) is int


def test_a_full_table_without_a_policy_names_table_capacity_and_keys():
    table = _built(capacity=3)
    table(tf.constant([1, 2], tf.int64), training=True)
    with pytest.raises(VocabularyExhausted, match=r"t: .*4 distinct keys.*max_vocabulary_size_per_gpu=3"):
        table(tf.constant([5, 6], tf.int64), training=True)
    assert table.size == 2


def test_an_out_of_range_key_inside_fit_gets_the_tables_message():
    """A static table inside model.fit: the range check runs before the gather, so the error is
    the layer's own (table, range), not TensorFlow's gather error."""
    layer = DistributedEmbedding("sum", 10, 2, slot_num=1, max_nnz=1, use_hashtable=False, name="items")
    model = keras.Sequential([keras.Input([1], dtype="int64"), layer, keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=sok.optimizers.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    keys = np.array([[1], [2], [12], [3]], np.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"items: .*key out of range \[0, 10\)") as info:
        model.fit(keys, np.ones((4, 1), np.float32), batch_size=4, epochs=1, verbose=0)
    assert not any(op in str(info.value) for op in ("GatherV2", "GatherNd", "ResourceGather"))


def test_too_many_keys_in_a_sample_or_a_slot_get_the_layers_message():
    """The per-sample and per-slot limits hold inside a graph too, where the keys' shape is not known
    while tracing: an Assert with the layer's name and the limit."""
    layer = DistributedEmbedding("sum", 10, 2, slot_num=2, max_nnz=3, max_feature_num=4, use_hashtable=False,
                                 name="bags")
    ragged = tf.ragged.constant([[[1], [2, 3]], [[1, 2, 3], [4, 5]]], dtype=tf.int64)  # sample 2 holds 5 keys
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bags: a sample holds more keys than max_feature_num=4"):
        layer(ragged)
    assert layer(ragged[:1]).shape == (1, 2, 2)  # 3 keys: within the limits
    dense = tf.function(lambda k: layer(k), input_signature=[tf.TensorSpec([None, 2, None], tf.int64)])
    assert dense(tf.zeros([1, 2, 2], tf.int64)).shape == (1, 2, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bags: dense keys hold more keys per slot than max_nnz"):
        dense(tf.zeros([1, 2, 3], tf.int64))
