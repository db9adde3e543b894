"""Keras 3 layers with SOK's API: `DistributedEmbedding` (sparse keys, combined per slot) and
`All2AllDenseEmbedding` (dense ``[batch, slot, nnz]`` keys, one vector per key).

Each layer holds one `EmbeddingTable` (``layer.table``; a `ShardedTable` when it is built with
``sharding="row"``, ``"table"``, ``"column"`` or ``"row_column"`` under a strategy of several
replicas; ``column_shards`` sets the grid of ``"row_column"``, see
`sok_tutorial.embedding.layouts`) and does what SOK's layers do around it: check and
flatten the keys, ask the table for their vectors, combine them per slot.
``layer.embedding_variable`` is the table's variable (SOK's name). The layers work in
``model.fit``, custom loops, ``tf.function`` and under ``tf.distribute``, and the table's
gradient covers only the rows a step used (see `sok_tutorial.optimizers`).

``use_hashtable=True`` (SOK's default): any int64 key is welcome; in a training call
(``training=True``, or any call a gradient tape records, as in ``model.fit``) the table's index
gives a new key a row, which starts from the key's own initial vector, and other calls (serving,
``predict``) embed keys never seen to zeros. ``use_hashtable=False``:
keys are row ids in ``[0, max_vocabulary_size_per_gpu)``, and any other key is an error, never a
silent wrong row. Either way initial values are drawn per key (see `keyed_initial_values`).

The table's eviction, admission and tracking options (``eviction_policy="lru"``, ``min_count=2``,
``track_changes=True``... see `sok_tutorial.embedding.lifecycle`), its precision
(``storage_dtype="bfloat16"``, ``stochastic_rounding``, ``slot_dtype``: see
`sok_tutorial.embedding.precision`) and its own ``optimizer`` are keyword arguments of both
layers, handed to the table.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import lifecycle, precision
from sok_tutorial.embedding.combiners import (
    COMBINERS,
    SEQUENCE_OUTPUTS,
    combine,
    combine_dense,
    dense_sequence,
    flat_weights,
    sequence,
    weigh,
)
from sok_tutorial.embedding.initializers import KeyedInitializer, init_spec
from sok_tutorial.embedding.layouts import layout_of
from sok_tutorial.embedding.lookup import flatten_bags
from sok_tutorial.embedding.ops import counts_at_most
from sok_tutorial.embedding.placement import EXCHANGES, SHARDINGS
from sok_tutorial.embedding.sharding import ShardedTable
from sok_tutorial.embedding.table import EmbeddingTable, optimizer_config, optimizer_from_config
from sok_tutorial.embedding.unique_keys import UniqueKeys, like_keys


class _EmbeddingBase(keras.layers.Layer):
    def __init__(self, max_vocabulary_size_per_gpu: int, embedding_vec_size: int, *, use_hashtable: bool = True,
                 key_dtype: Any = "int64", embedding_initializer: Any = "random_uniform",
                 sharding: str = "replicated", exchange: str = "all_gather", slot_sizes: Any = None,
                 column_shards: int | None = None, optimizer: Any = None, **kwargs: Any):
        lifecycle.refuse_removed(kwargs.get("name", type(self).__name__), kwargs)
        self.table_options = {name: kwargs.pop(name) for name in (*lifecycle.OPTIONS, *precision.OPTIONS)
                              if name in kwargs}
        super().__init__(**kwargs)
        self.table_optimizer = optimizer_from_config(optimizer)
        self.sharding = checks.one_of("sharding", sharding, SHARDINGS)
        self.exchange = checks.one_of("exchange", exchange, EXCHANGES)
        self.slot_sizes = None if slot_sizes is None else [int(s) for s in slot_sizes]
        if column_shards is not None and sharding != "row_column":
            raise ValueError(f"{self.name}: column_shards={column_shards} sets the grid of sharding='row_column'; "
                             f"got sharding={sharding!r}")
        self.column_shards = None if column_shards is None else checks.positive_int("column_shards", column_shards)
        self.max_vocabulary_size_per_gpu = checks.positive_int("max_vocabulary_size_per_gpu",
                                                               max_vocabulary_size_per_gpu)
        self.embedding_vec_size = checks.positive_int("embedding_vec_size", embedding_vec_size)
        self.use_hashtable = checks.flag("use_hashtable", use_hashtable)
        self.key_dtype = tf.as_dtype(key_dtype).name
        checks.one_of("key_dtype", self.key_dtype, ("int64", "int32"))
        self.init = init_spec(embedding_initializer)
        self.table: EmbeddingTable | None = None

    def build(self, input_shape: Any = None) -> None:
        if self.table is None:
            common = {"dynamic": self.use_hashtable, "initializer": self.init, "name": self.name,
                      "optimizer": self.table_optimizer, **self.table_options}
            if self.sharding != "replicated" and tf.distribute.get_strategy().num_replicas_in_sync > 1:
                self.table = ShardedTable(self.max_vocabulary_size_per_gpu, self.embedding_vec_size,
                                          sharding=self.sharding, exchange=self.exchange,
                                          slot_num=getattr(self, "slot_num", 1), slot_sizes=self.slot_sizes,
                                          column_shards=self.column_shards, **common)
            else:
                self.table = EmbeddingTable(self.max_vocabulary_size_per_gpu, self.embedding_vec_size, **common)
            self.table.build()
        super().build(input_shape)

    @property
    def embedding_variable(self) -> Any:
        """The table's variable ``[max_vocabulary_size_per_gpu, embedding_vec_size]`` (SOK's name)."""
        if self.table is None:
            self.build()
        return self.table.variable

    @property
    def num_shards(self) -> int:
        """Replicas the table is spread over (1: the whole table on every replica)."""
        return self.table.num_shards if self.table is not None else 1

    @property
    def capacity(self) -> int:
        """Rows of the whole table: ``max_vocabulary_size_per_gpu`` times the row-wise shards (a
        column-wise table holds every row on every replica, a grid's on every replica of a row group)."""
        if isinstance(self.table, ShardedTable):
            return self.table.total_rows
        return self.max_vocabulary_size_per_gpu * self.num_shards

    def _vectors(self, flat_keys: tf.Tensor, training: Any, slots: Any = None) -> tf.Tensor:
        """Vectors of flat keys; `slots` (a callable) gives each key's slot, for table-wise shards."""
        if not self.built:
            self.build()
        routed = isinstance(self.table, ShardedTable) and self.table.needs_slots
        return self.table.lookup(flat_keys, training, slots=slots() if routed and slots is not None else None)

    def _check_keys(self, keys: Any) -> Any:
        dtype = keys.dtype if hasattr(keys, "dtype") else None
        if dtype is None or not dtype.is_integer:
            raise TypeError(f"{self.name}: keys must be integers ({self.key_dtype}), got {dtype}")
        return keys if isinstance(keys, UniqueKeys) else tf.cast(keys, tf.int64)  # (UniqueKeys: int64 already)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "max_vocabulary_size_per_gpu": self.max_vocabulary_size_per_gpu,
                "embedding_vec_size": self.embedding_vec_size, "use_hashtable": self.use_hashtable,
                "key_dtype": self.key_dtype, "sharding": self.sharding, "exchange": self.exchange,
                "slot_sizes": self.slot_sizes, "column_shards": self.column_shards, **self.table_options,
                "optimizer": optimizer_config(self.table_optimizer),
                "embedding_initializer": {"class_name": "KeyedInitializer",
                                          "config": KeyedInitializer(self.init.kind, self.init.a, self.init.b,
                                                                     self.init.seed).get_config()}}


def _flat(keys: Any) -> Any:
    """Keys (a tensor or a `UniqueKeys`) as one flat list."""
    return keys.reshape([-1]) if isinstance(keys, UniqueKeys) else tf.reshape(keys, [-1])


def _slot_ids(keys: tf.Tensor) -> tf.Tensor:
    """The slot of every key of dense ``[batch, slot, nnz]`` keys, flattened."""
    slots = tf.range(tf.shape(keys, out_type=tf.int64)[1])[None, :, None]
    return tf.reshape(tf.broadcast_to(slots, tf.shape(keys, out_type=tf.int64)), [-1])


@keras.saving.register_keras_serializable(package="sok_tutorial")
class DistributedEmbedding(_EmbeddingBase):
    """Sparse keys ``[batch, slot_num, <= max_nnz]`` -> one combined vector per slot ``[batch, slot_num, dim]``,
    or (``combiner=None``) the sequence of each slot's vectors.

    Keys come as a ``tf.RaggedTensor`` ``[batch, slot_num, None]``, a ``tf.SparseTensor`` (SOK's
    layout), or a dense tensor ``[batch, slot_num]`` / ``[batch, slot_num, nnz]`` when every slot
    holds the same number of keys. Functional Keras models pass ragged inputs on densified, so
    declare ``keras.Input([slot_num, None], sparse=True)`` there, or subclass ``keras.Model``;
    ``model.fit`` under a tf.distribute strategy accepts dense keys only (a Keras limitation), so
    variable-length keys under a strategy train in a custom loop with ``strategy.run``.

    Args:
        combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"`` (sum over ``sqrt(n)``) over the ``n`` keys of a
            slot, as ``tf.nn.embedding_lookup_sparse`` defines them; an empty slot gives zeros.
            With ``sp_weights`` (a `call` argument: float weights shaped like the keys, a
            ``tf.RaggedTensor`` with their row splits, a ``tf.SparseTensor`` with their indices, a
            dense tensor of their shape) they are ``sum(w e)``, ``sum(w e) / sum(w)`` and
            ``sum(w e) / sqrt(sum(w^2))`` (`sok_tutorial.embedding.combiners`). ``None``: no
            combining, for sequence models: each key's vector (times its weight, if any) as
            `sequence_output` says.
        max_vocabulary_size_per_gpu: rows of the table (per replica, once tables are sharded).
        embedding_vec_size: width of a vector, any ``>= 1``.
        slot_num: feature fields per sample.
        max_nnz: most keys in one slot; more is an error.
        max_feature_num: most keys in one sample (default ``slot_num * max_nnz``); more is an error.
        use_hashtable: dynamic vocabulary (any int64 key) or row ids.
        key_dtype: ``int64`` or ``int32``.
        embedding_initializer: a Keras initializer (uniform, normal, truncated normal, constant).
        sequence_output: with ``combiner=None``: ``"ragged"`` gives a ``tf.RaggedTensor``
            ``[batch, slot_num, None, dim]`` for ragged or sparse keys (dense keys
            ``[batch, slot_num, nnz]`` give a dense ``[batch, slot_num, nnz, dim]``);
            ``"padded"`` gives a tuple ``(vectors, mask)``: vectors ``[batch, slot_num, max_nnz,
            dim]`` zero-padded and a bool ``mask`` ``[batch, slot_num, max_nnz]``, True where a key
            is (Keras's ``mask`` convention), for any keys. Drawn in `sok_tutorial.embedding.combiners`.

    Example:
        >>> layer = DistributedEmbedding("sum", 100, 4, slot_num=2, max_nnz=3)
        >>> keys = tf.ragged.constant([[[10, 2**40], []], [[10], [7, 7, 7]]], dtype=tf.int64, ragged_rank=2)
        >>> layer(keys).shape
        TensorShape([2, 2, 4])
        >>> layer(keys, sp_weights=tf.ragged.constant([[[0.5, 2.0], []], [[1.0], [1.0, 1.0, 3.0]]])).shape
        TensorShape([2, 2, 4])
        >>> DistributedEmbedding(None, 100, 4, slot_num=2, max_nnz=3)(keys).shape
        TensorShape([2, 2, None, 4])
        >>> vectors, mask = DistributedEmbedding(None, 100, 4, 2, 3, sequence_output="padded")(keys)
        >>> vectors.shape, mask.numpy().astype(int).tolist()
        (TensorShape([2, 2, 3, 4]), [[[1, 1, 0], [0, 0, 0]], [[1, 0, 0], [1, 1, 1]]])
    """

    def __init__(self, combiner: str | None, max_vocabulary_size_per_gpu: int, embedding_vec_size: int,
                 slot_num: int, max_nnz: int, max_feature_num: int | None = None, use_hashtable: bool = True,
                 key_dtype: Any = "int64", embedding_initializer: Any = "random_uniform",
                 sequence_output: str = "ragged", **kwargs: Any):
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable=use_hashtable,
                         key_dtype=key_dtype, embedding_initializer=embedding_initializer, **kwargs)
        self.combiner = checks.one_of("combiner", combiner, (*COMBINERS, None))
        self.sequence_output = checks.one_of("sequence_output", sequence_output, SEQUENCE_OUTPUTS)
        if combiner is not None and sequence_output != "ragged":
            raise ValueError(f"sequence_output={sequence_output!r} is invalid with combiner={combiner!r}: it shapes "
                             "the uncombined vectors of combiner=None")
        self.slot_num = checks.positive_int("slot_num", slot_num)
        self.max_nnz = checks.positive_int("max_nnz", max_nnz)
        self.max_feature_num = (slot_num * max_nnz if max_feature_num is None
                                else checks.positive_int("max_feature_num", max_feature_num))

    def call(self, inputs: Any, training: Any = None, sp_weights: Any = None) -> Any:
        if isinstance(inputs, UniqueKeys):  # dense keys, deduplicated in the input pipeline
            return self._call_dense(inputs, training, sp_weights)
        if not isinstance(inputs, (tf.RaggedTensor, tf.SparseTensor)):
            return self._call_dense(tf.convert_to_tensor(inputs), training, sp_weights)
        if self.combiner is None and isinstance(inputs, tf.SparseTensor):  # a sequence keeps the keys' order
            inputs = tf.sparse.reorder(inputs)
            sp_weights = tf.sparse.reorder(sp_weights) if isinstance(sp_weights, tf.SparseTensor) else sp_weights
        weights = None if sp_weights is None else flat_weights(inputs, sp_weights, name=f"{self.name}: sp_weights")
        flat, segments, num_bags = flatten_bags(inputs, self.slot_num, max_nnz=self.max_nnz, layer=self.name)
        flat = self._check_keys(flat)
        batch = num_bags // self.slot_num
        per_sample = tf.math.bincount(tf.cast(segments // self.slot_num, tf.int32), minlength=tf.cast(batch, tf.int32))
        counts_at_most(per_sample, self.max_feature_num,
                       f"{self.name}: a sample holds more keys than max_feature_num={self.max_feature_num}")
        vectors = self._vectors(flat, training, slots=lambda: segments % self.slot_num)
        if self.combiner is None:
            return sequence(tf.cast(weigh(vectors, weights), self.compute_dtype), segments, num_bags, self.slot_num,
                            self.max_nnz, self.sequence_output)
        bags = combine(vectors, segments, num_bags, self.combiner, weights)
        return tf.cast(tf.reshape(bags, [-1, self.slot_num, self.embedding_vec_size]), self.compute_dtype)

    def _call_dense(self, keys: Any, training: Any, sp_weights: Any) -> Any:
        """Every slot holds the same number of keys: bags are a reshape, no segment reduction.
        (`keys`: a tensor, or a `UniqueKeys`, whose positions have the keys' shape.)"""
        weights = None if sp_weights is None else flat_weights(like_keys(keys), sp_weights,
                                                               name=f"{self.name}: sp_weights")
        if keys.shape.rank == 2:
            keys = UniqueKeys(keys.unique, keys.position[:, :, None], keys.pairs, keys.rows) \
                if isinstance(keys, UniqueKeys) else keys[:, :, None]
        if keys.shape.rank != 3 or keys.shape[1] != self.slot_num:
            raise ValueError(f"{self.name}: dense keys must be [batch, slot_num={self.slot_num}] or "
                             f"[batch, slot_num={self.slot_num}, nnz], got shape {keys.shape}")
        nnz, most = keys.shape[2], min(self.max_nnz, self.max_feature_num // self.slot_num)
        if nnz is not None and nnz > most:
            raise ValueError(f"{self.name}: dense keys hold {nnz} keys per slot, more than max_nnz={self.max_nnz} "
                             f"or max_feature_num={self.max_feature_num} allow")
        shaped = like_keys(keys)  # (B, S, N): the keys, or their positions among the distinct keys
        if nnz is None:  # (a known nnz was checked above)
            counts_at_most(tf.shape(shaped)[2:3], most, f"{self.name}: dense keys hold more keys per slot than "
                                                         f"max_nnz={self.max_nnz} or max_feature_num allow")
        vectors = self._vectors(self._check_keys(_flat(keys)), training, slots=lambda: _slot_ids(shaped))
        # (B, S, N, D); a known N keeps the shape a constant (no ops to read it, in every table's trace)
        vectors = tf.reshape(vectors, [-1, self.slot_num, tf.shape(shaped)[2] if nnz is None else nnz,
                                       self.embedding_vec_size])
        weights = None if weights is None else tf.reshape(weights, tf.shape(shaped))  # (B, S, N)
        if self.combiner is None:
            return dense_sequence(tf.cast(weigh(vectors, weights), self.compute_dtype), self.max_nnz,
                                  self.sequence_output)
        if nnz == 1 and weights is None:  # one key per bag: the bag is its vector (a reshape, no slice to backprop)
            bags = tf.reshape(vectors, [-1, self.slot_num, self.embedding_vec_size])
        else:
            bags = combine_dense(vectors, self.combiner, weights)
        return tf.cast(bags, self.compute_dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        batch, dim = input_shape[0], self.embedding_vec_size
        if self.combiner is not None:
            return (batch, self.slot_num, dim)
        if self.sequence_output == "padded":
            return ((batch, self.slot_num, self.max_nnz, dim), (batch, self.slot_num, self.max_nnz))
        return (batch, self.slot_num, input_shape[2] if len(input_shape) == 3 else 1, dim)

    def compute_output_spec(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        shape = self.compute_output_shape(tuple(inputs.shape))
        if self.combiner is None and self.sequence_output == "padded":
            return keras.KerasTensor(shape[0], self.compute_dtype), keras.KerasTensor(shape[1], "bool")
        if self.combiner is None and (getattr(inputs, "sparse", False) or getattr(inputs, "ragged", False)):
            return keras.KerasTensor((*shape[:2], None, shape[3]), self.compute_dtype, ragged=True)
        return keras.KerasTensor(shape, self.compute_dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "combiner": self.combiner, "slot_num": self.slot_num,
                "max_nnz": self.max_nnz, "max_feature_num": self.max_feature_num,
                "sequence_output": self.sequence_output}


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
                         key_dtype=key_dtype, embedding_initializer=embedding_initializer, **kwargs)
        self.slot_num = checks.positive_int("slot_num", slot_num)
        self.nnz_per_slot = checks.positive_int("nnz_per_slot", nnz_per_slot)
        self.dynamic_input = bool(dynamic_input)

    def call(self, inputs: Any, training: Any = None) -> tf.Tensor:
        if isinstance(inputs, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(f"{self.name}: All2AllDenseEmbedding takes dense keys [batch, slot_num, nnz_per_slot]; "
                            "read lists with sparse_as_dense=True, or use DistributedEmbedding for ragged keys")
        keys = self._check_keys(inputs if isinstance(inputs, UniqueKeys) else tf.convert_to_tensor(inputs))
        if not self.dynamic_input:
            if keys.shape.rank is not None and keys.shape.rank != 3:
                raise ValueError(f"{self.name}: keys must be [batch, slot_num, nnz_per_slot], got rank "
                                 f"{keys.shape.rank} (dynamic_input=True takes any shape)")
            expected = [self.slot_num, self.nnz_per_slot]
            if keys.shape[1:].is_fully_defined() and keys.shape[1:].as_list() != expected:
                raise ValueError(f"{self.name}: keys have shape {keys.shape.as_list()}, expected "
                                 f"[batch, {expected[0]}, {expected[1]}] (slot_num, nnz_per_slot)")
        flat = _flat(keys)
        if self.dynamic_input and layout_of(self.sharding, 1).needs_slots:
            raise ValueError(f"{self.name}: sharding={self.sharding!r} places slots, so keys must be "
                             "[batch, slot_num, nnz_per_slot] (dynamic_input=False)")
        vectors = self._vectors(flat, training, slots=lambda: _slot_ids(like_keys(keys)))
        shape = tf.concat([tf.shape(like_keys(keys), out_type=tf.int64), [self.embedding_vec_size]], 0)
        return tf.cast(tf.reshape(vectors, shape), self.compute_dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*input_shape, self.embedding_vec_size)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "slot_num": self.slot_num, "nnz_per_slot": self.nnz_per_slot,
                "dynamic_input": self.dynamic_input}
