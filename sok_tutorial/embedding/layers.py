"""Keras 3 layers with SOK's API: `DistributedEmbedding` (sparse keys, combined per slot) and
`All2AllDenseEmbedding` (dense ``[batch, slot, nnz]`` keys, one vector per key).

The table is an ordinary trainable variable (``embedding_variable``), so the layers work in
``model.fit``, custom loops, ``tf.function`` and under ``tf.distribute``; its gradient is a
``tf.IndexedSlices`` over the rows a step used (see `sok_tutorial.optimizers`).

``use_hashtable=True`` (SOK's default): any int64 key is welcome; a `DynamicVocabulary` gives it a
row on first sight and the row starts from the key's own initial vector. ``use_hashtable=False``:
keys are row ids in ``[0, max_vocabulary_size_per_gpu)`` and any other key is an error, never a
silent wrong row. Either way initial values are drawn per key (see `keyed_initial_values`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding.lookup import COMBINERS, combine, flatten_bags
from sok_tutorial.embedding.sharding import EXCHANGES, SHARDINGS, ShardedTable, local_components
from sok_tutorial.embedding.initializers import InitSpec, KeyedInitializer, init_spec, keyed_initial_values
from sok_tutorial.embedding.vocabulary import DynamicVocabulary

def is_embedding_variable(variable: Any) -> bool:
    return bool(getattr(variable, "_sok_embedding", False))


def is_sharded_variable(variable: Any) -> bool:
    """A table whose replicas hold different rows (``sharding="row"`` or ``"table"``): its
    gradients are per-replica and must not be all-reduced. Takes the Keras or the tf variable."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return bool(getattr(variable, "_sok_sharded", False))


class _EmbeddingBase(keras.layers.Layer):
    def __init__(self, max_vocabulary_size_per_gpu: int, embedding_vec_size: int, *, use_hashtable: bool = True,
                 key_dtype: Any = "int64", embedding_initializer: Any = "random_uniform",
                 sharding: str = "replicated", exchange: str = "all_gather", slot_sizes: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.sharding = checks.one_of("sharding", sharding, SHARDINGS)
        self.exchange = checks.one_of("exchange", exchange, EXCHANGES)
        self.slot_sizes = None if slot_sizes is None else [int(s) for s in slot_sizes]
        self._sharded: ShardedTable | None = None
        self.max_vocabulary_size_per_gpu = checks.positive_int("max_vocabulary_size_per_gpu",
                                                               max_vocabulary_size_per_gpu)
        self.embedding_vec_size = checks.positive_int("embedding_vec_size", embedding_vec_size)
        self.use_hashtable = bool(use_hashtable)
        self.key_dtype = tf.as_dtype(key_dtype).name
        checks.one_of("key_dtype", self.key_dtype, ("int64", "int32"))
        self.init = init_spec(embedding_initializer)
        self.vocabulary = (DynamicVocabulary(self.max_vocabulary_size_per_gpu, name=self.name)
                           if self.use_hashtable else None)
        self._frozen: tf.lookup.StaticHashTable | None = None

    def build(self, input_shape: Any = None) -> None:
        sharded = self.sharding != "replicated" and tf.distribute.get_strategy().num_replicas_in_sync > 1
        self.embedding_variable = self.add_weight(
            name="embedding_variable", shape=(self.max_vocabulary_size_per_gpu, self.embedding_vec_size),
            initializer=KeyedInitializer(**dataclasses.asdict(self.init), dynamic=self.use_hashtable or sharded),
            trainable=True)
        self.embedding_variable._sok_embedding = True
        if sharded:
            self._sharded = ShardedTable(self, self.sharding, self.exchange, self.slot_sizes)
            self._sharded.build(self.embedding_variable)
            self.embedding_variable.value._sok_sharded = True
            self.vocabulary = None  # each shard has its own (ShardedTable.vocabularies)
        super().build(input_shape)

    @property
    def num_shards(self) -> int:
        """Replicas the table is spread over (1: the whole table on every replica)."""
        return self._sharded.num_shards if self._sharded is not None else 1

    @property
    def capacity(self) -> int:
        """Rows of the whole table: ``max_vocabulary_size_per_gpu`` times the shards."""
        return self.max_vocabulary_size_per_gpu * self.num_shards

    # ------------------------------------------------------------------ keys -> rows
    def _check_keys(self, keys: Any) -> tf.Tensor:
        dtype = keys.dtype if hasattr(keys, "dtype") else None
        if dtype is None or not dtype.is_integer:
            raise TypeError(f"{self.name}: keys must be integers ({self.key_dtype}), got {dtype}")
        return tf.cast(keys, tf.int64)

    def _rows(self, flat_keys: tf.Tensor, training: Any) -> tuple[tf.Tensor, tf.Tensor | None]:
        """(rows for the gather, mask of keys that have a row or None if all do)."""
        if not self.use_hashtable:
            rows = self.capacity
            tf.debugging.assert_non_negative(flat_keys, message=f"{self.name}: negative key with use_hashtable=False")
            tf.debugging.assert_less(flat_keys, tf.constant(rows, tf.int64),
                                     message=f"{self.name}: key out of range [0, {rows}) with use_hashtable=False "
                                             "(max_vocabulary_size_per_gpu)")
            return flat_keys, None
        if self._frozen is not None:  # exported: a static table, no Python in the graph
            rows = self._frozen.lookup(flat_keys)
            return tf.maximum(rows, 0), rows >= 0
        if training is False:  # inference: never grow the vocabulary; unseen keys embed to zeros
            rows = tf.py_function(lambda k: self.vocabulary.lookup(k.numpy()), [flat_keys], tf.int64)
            rows.set_shape(flat_keys.shape)
            return tf.maximum(rows, 0), rows >= 0
        rows = tf.py_function(self._lookup_or_insert, [flat_keys], tf.int64)
        rows.set_shape(flat_keys.shape)
        return rows, None

    def freeze_vocabulary(self) -> None:
        """Map keys through a static lookup table of the current vocabulary from now on (no new
        keys; unseen ones embed to zeros): what a SavedModel for serving needs."""
        if self._sharded is not None:
            raise NotImplementedError(f"{self.name}: export a sharded table from a model built without a strategy "
                                      "(load the checkpoint there first)")
        if self.vocabulary is None:
            return
        keys, rows = self.vocabulary.export()
        init = tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.int64), tf.constant(rows, tf.int64))
        self._frozen = tf.lookup.StaticHashTable(init, default_value=-1)

    def _lookup_or_insert(self, keys: tf.Tensor) -> np.ndarray:
        """Runs eagerly (tf.py_function), possibly from several replicas at once: new rows get
        their keys' initial vectors in every copy of the table before any replica reads them."""
        with self.vocabulary.lock:
            rows, fresh_rows, fresh_keys = self.vocabulary.lookup_or_insert(keys.numpy())
            if len(fresh_rows):
                values = keyed_initial_values(fresh_keys, self.embedding_vec_size, self.init)
                update = tf.IndexedSlices(tf.constant(values), tf.constant(fresh_rows))
                for component in local_components(self.embedding_variable):
                    component.scatter_update(update)
        return rows

    def _vectors(self, flat_keys: tf.Tensor, training: Any, slots: Any = None) -> tf.Tensor:
        if self._sharded is not None:
            if not self.use_hashtable:
                self._rows(flat_keys, training)  # the range checks
            slot_ids = slots() if self.sharding == "table" and slots is not None else None
            return self._sharded.vectors(flat_keys, slot_ids, training)
        rows, found = self._rows(flat_keys, training)
        # The read of the table must follow the py_function that initialises new rows. Gather from
        # the tf.Variable (a resource gather, not a snapshot of the whole table), created under an
        # explicit dependency: a distributed variable's read would otherwise be free to run first.
        # No forward dedupe: the sparse optimizers merge repeated rows once, and a tf.unique here
        # (plus the segment sum in its gradient) measured 10-25% slower per step on CPU.
        with tf.control_dependencies([rows]):
            vectors = tf.gather(self.embedding_variable.value, rows)
        if found is not None:
            vectors = vectors * tf.cast(found, vectors.dtype)[:, None]
        return vectors

    # ----------------------------------------------------------- saving and config
    def save_own_variables(self, store: Any) -> None:
        if self._sharded is not None:
            raise NotImplementedError(f"{self.name}: save a sharded table with sok_tutorial.training.save_checkpoint "
                                      "(it writes every shard and restores onto any number of replicas)")
        store["0"] = self.embedding_variable.numpy()
        if self.vocabulary is not None:
            keys, rows = self.vocabulary.export()
            store["vocabulary_keys"], store["vocabulary_rows"] = keys, rows

    def load_own_variables(self, store: Any) -> None:
        self.embedding_variable.assign(np.asarray(store["0"]))
        if self.vocabulary is not None:
            self.vocabulary.restore(np.asarray(store["vocabulary_keys"]), np.asarray(store["vocabulary_rows"]))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "max_vocabulary_size_per_gpu": self.max_vocabulary_size_per_gpu,
                "embedding_vec_size": self.embedding_vec_size, "use_hashtable": self.use_hashtable,
                "key_dtype": self.key_dtype, "sharding": self.sharding, "exchange": self.exchange,
                "slot_sizes": self.slot_sizes,
                "embedding_initializer": {"class_name": "KeyedInitializer",
                                          "config": KeyedInitializer(**dataclasses.asdict(self.init)).get_config()}}


def _slot_ids(keys: tf.Tensor) -> tf.Tensor:
    """The slot of every key of dense ``[batch, slot, nnz]`` keys, flattened."""
    slots = tf.range(tf.shape(keys, out_type=tf.int64)[1])[None, :, None]
    return tf.reshape(tf.broadcast_to(slots, tf.shape(keys, out_type=tf.int64)), [-1])


def _spec_from_config(value: Any) -> Any:
    """Accept the dict `get_config` writes back as an initializer."""
    if isinstance(value, dict) and value.get("class_name") == "KeyedInitializer":
        c = value["config"]
        return InitSpec(c["kind"], c["a"], c["b"], c["seed"])
    return value


@keras.saving.register_keras_serializable(package="sok_tutorial")
class DistributedEmbedding(_EmbeddingBase):
    """Sparse keys ``[batch, slot_num, <= max_nnz]`` -> one combined vector per slot ``[batch, slot_num, dim]``.

    Keys come as a ``tf.RaggedTensor`` ``[batch, slot_num, None]``, a ``tf.SparseTensor`` (SOK's
    layout), or a dense tensor ``[batch, slot_num]`` / ``[batch, slot_num, nnz]`` when every slot
    holds the same number of keys. Functional Keras models pass ragged inputs on densified, so
    declare ``keras.Input([slot_num, None], sparse=True)`` there, or subclass ``keras.Model``;
    ``model.fit`` under a tf.distribute strategy accepts dense keys only (a Keras limitation), so
    variable-length keys under a strategy train in a custom loop with ``strategy.run``.

    Args:
        combiner: ``"sum"`` or ``"mean"`` over the keys of a slot (an empty slot gives zeros).
        max_vocabulary_size_per_gpu: rows of the table (per replica, once tables are sharded).
        embedding_vec_size: width of a vector, any ``>= 1``.
        slot_num: feature fields per sample.
        max_nnz: most keys in one slot; more is an error.
        max_feature_num: most keys in one sample (default ``slot_num * max_nnz``); more is an error.
        use_hashtable: dynamic vocabulary (any int64 key) or row ids.
        key_dtype: ``int64`` or ``int32``.
        embedding_initializer: a Keras initializer (uniform, normal, truncated normal, constant).

    Example:
        >>> layer = DistributedEmbedding("sum", 100, 4, slot_num=2, max_nnz=3)
        >>> keys = tf.ragged.constant([[[10, 2**40], []], [[10], [7, 7, 7]]], dtype=tf.int64, ragged_rank=2)
        >>> layer(keys).shape
        TensorShape([2, 2, 4])
    """

    def __init__(self, combiner: str, max_vocabulary_size_per_gpu: int, embedding_vec_size: int, slot_num: int,
                 max_nnz: int, max_feature_num: int | None = None, use_hashtable: bool = True,
                 key_dtype: Any = "int64", embedding_initializer: Any = "random_uniform", **kwargs: Any):
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable=use_hashtable,
                         key_dtype=key_dtype, embedding_initializer=_spec_from_config(embedding_initializer), **kwargs)
        self.combiner = checks.one_of("combiner", combiner, COMBINERS)
        self.slot_num = checks.positive_int("slot_num", slot_num)
        self.max_nnz = checks.positive_int("max_nnz", max_nnz)
        self.max_feature_num = (slot_num * max_nnz if max_feature_num is None
                                else checks.positive_int("max_feature_num", max_feature_num))

    def call(self, inputs: Any, training: Any = None) -> tf.Tensor:
        if not isinstance(inputs, (tf.RaggedTensor, tf.SparseTensor)):
            return self._call_dense(tf.convert_to_tensor(inputs), training)
        flat, segments, num_bags = flatten_bags(inputs, self.slot_num, max_nnz=self.max_nnz, layer=self.name)
        flat = self._check_keys(flat)
        batch = num_bags // self.slot_num
        per_sample = tf.math.bincount(tf.cast(segments // self.slot_num, tf.int32), minlength=tf.cast(batch, tf.int32))
        tf.debugging.assert_less_equal(tf.reduce_max(tf.concat([per_sample, [0]], 0)), self.max_feature_num,
                                       message=f"{self.name}: a sample holds more keys than "
                                               f"max_feature_num={self.max_feature_num}")
        vectors = self._vectors(flat, training, slots=lambda: segments % self.slot_num)
        bags = combine(vectors, segments, num_bags, self.combiner)
        return tf.cast(tf.reshape(bags, [-1, self.slot_num, self.embedding_vec_size]), self.compute_dtype)

    def _call_dense(self, keys: tf.Tensor, training: Any) -> tf.Tensor:
        """Every slot holds the same number of keys: bags are a reshape, no segment reduction."""
        if keys.shape.rank == 2:
            keys = keys[:, :, None]
        if keys.shape.rank != 3 or keys.shape[1] != self.slot_num:
            raise ValueError(f"{self.name}: dense keys must be [batch, slot_num={self.slot_num}] or "
                             f"[batch, slot_num={self.slot_num}, nnz], got shape {keys.shape}")
        nnz = keys.shape[2]
        if nnz is not None and (nnz > self.max_nnz or nnz * self.slot_num > self.max_feature_num):
            raise ValueError(f"{self.name}: dense keys hold {nnz} keys per slot, more than max_nnz={self.max_nnz} "
                             f"or max_feature_num={self.max_feature_num} allow")
        vectors = self._vectors(self._check_keys(tf.reshape(keys, [-1])), training, slots=lambda: _slot_ids(keys))
        if nnz == 1:
            bags = tf.reshape(vectors, [-1, self.slot_num, self.embedding_vec_size])
        else:
            bags = tf.reshape(vectors, [-1, self.slot_num, tf.shape(keys)[2], self.embedding_vec_size])
            bags = tf.reduce_sum(bags, axis=2) if self.combiner == "sum" else tf.reduce_mean(bags, axis=2)
        return tf.cast(bags, self.compute_dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (input_shape[0], self.slot_num, self.embedding_vec_size)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "combiner": self.combiner, "slot_num": self.slot_num,
                "max_nnz": self.max_nnz, "max_feature_num": self.max_feature_num}


@keras.saving.register_keras_serializable(package="sok_tutorial")
class All2AllDenseEmbedding(_EmbeddingBase):
    """Dense keys ``[batch, slot_num, nnz_per_slot]`` -> one vector per key ``[batch, slot_num, nnz_per_slot, dim]``.

    With ``dynamic_input=True`` keys may have any shape (say the 1-D output of ``tf.unique``)
    and the output is ``keys.shape + [dim]``.

    Example:
        >>> layer = All2AllDenseEmbedding(1000, 8, slot_num=3, nnz_per_slot=2, use_hashtable=False)
        >>> layer(tf.constant([[[1, 2], [3, 4], [5, 6]]], dtype=tf.int64)).shape
        TensorShape([1, 3, 2, 8])
    """

    def __init__(self, max_vocabulary_size_per_gpu: int, embedding_vec_size: int, slot_num: int, nnz_per_slot: int,
                 dynamic_input: bool = False, use_hashtable: bool = True, key_dtype: Any = "int64",
                 embedding_initializer: Any = "random_uniform", **kwargs: Any):
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable=use_hashtable,
                         key_dtype=key_dtype, embedding_initializer=_spec_from_config(embedding_initializer), **kwargs)
        self.slot_num = checks.positive_int("slot_num", slot_num)
        self.nnz_per_slot = checks.positive_int("nnz_per_slot", nnz_per_slot)
        self.dynamic_input = bool(dynamic_input)

    def call(self, inputs: Any, training: Any = None) -> tf.Tensor:
        if isinstance(inputs, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(f"{self.name}: All2AllDenseEmbedding takes dense keys [batch, slot_num, nnz_per_slot]; "
                            "read lists with sparse_as_dense=True, or use DistributedEmbedding for ragged keys")
        keys = self._check_keys(tf.convert_to_tensor(inputs))
        if not self.dynamic_input:
            if keys.shape.rank is not None and keys.shape.rank != 3:
                raise ValueError(f"{self.name}: keys must be [batch, slot_num, nnz_per_slot], got rank "
                                 f"{keys.shape.rank} (dynamic_input=True takes any shape)")
            expected = [self.slot_num, self.nnz_per_slot]
            if keys.shape[1:].is_fully_defined() and keys.shape[1:].as_list() != expected:
                raise ValueError(f"{self.name}: keys have shape {keys.shape.as_list()}, expected "
                                 f"[batch, {expected[0]}, {expected[1]}] (slot_num, nnz_per_slot)")
        flat = tf.reshape(keys, [-1])
        if self.dynamic_input and self.sharding == "table":
            raise ValueError(f"{self.name}: sharding='table' places slots, so keys must be "
                             "[batch, slot_num, nnz_per_slot] (dynamic_input=False)")
        vectors = self._vectors(flat, training, slots=lambda: _slot_ids(keys))
        shape = tf.concat([tf.shape(keys, out_type=tf.int64), [self.embedding_vec_size]], 0)
        return tf.cast(tf.reshape(vectors, shape), self.compute_dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*input_shape, self.embedding_vec_size)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "slot_num": self.slot_num, "nnz_per_slot": self.nnz_per_slot,
                "dynamic_input": self.dynamic_input}
