"""Keys to vectors: `EmbeddingTable`'s lookup, from a step's keys to its rows and their vectors.

`KeysToVectors` is a mixin of `sok_tutorial.embedding.table.EmbeddingTable`; it works through the
table's key index (`index_variables`), its lifecycle state (`state`) and its variable. `lookup`
deduplicates a step's keys (or takes them deduplicated ahead, `UniqueKeys`), finds their rows
(`rows`: the key index, and in training new keys' rows with their key-seeded initial vectors)
and hands the vectors out in the keys' shape (`sok_tutorial.embedding.ops.vectors_of`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from sok_tutorial.embedding import index as key_index
from sok_tutorial.embedding.collectives import all_gather, all_gather_columns, gather_counts
from sok_tutorial.embedding.dedup import distinct
from sok_tutorial.embedding.initializers import keyed_initial_values_tf
from sok_tutorial.embedding.ops import ids_below, in_shape_trace, inserting, local_components, vectors_of
from sok_tutorial.embedding.precision import compute_dtype
from sok_tutorial.embedding.unique_keys import UniqueKeys, like_keys


class KeysToVectors:
    """A table's lookup: keys checked, deduplicated, given rows, read as vectors."""

    def _keys(self, keys: Any) -> tf.Tensor:
        if isinstance(keys, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(f"{self.name}: keys must be a dense tensor, got a {type(keys).__name__}; a layer "
                            "(DistributedEmbedding, FeatureEmbedding) takes ragged and sparse keys")
        if isinstance(keys, (list, tuple, int, np.integer)):  # (Python's numbers: int64, as a tensor of them is)
            keys = np.asarray(keys)
            keys = keys.astype(np.int64) if keys.dtype.kind in "iu" else keys
        dtype = getattr(keys, "dtype", None)
        if dtype is None or not tf.as_dtype(dtype).is_integer:
            raise TypeError(f"{self.name}: keys must be integers (int64 or int32), got {dtype}")
        return tf.cast(keys, tf.int64)

    def _check_range(self, keys: tf.Tensor, rows: int) -> tf.Tensor:
        """`keys`, once checked to be row ids in ``[0, rows)``: in a graph, whatever reads the table
        with them waits for the checks, so a bad key gets this message, not the gather's (`ids_below`;
        no key is printed: `_distinct` has made a key outside the table the capacity by now)."""
        return ids_below(keys, rows, f"{self.name}: negative key or key out of range [0, {rows}); keys are row "
                                     "ids (use_hashtable=False, max_vocabulary_size_per_gpu)")

    def _distinct(self, keys: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """`distinct` of a step's int64 `keys`. A table whose keys are row ids (not indexed) below
        2**31 deduplicates them as int32: a hash map of half the width, which ``tf.unique`` fills
        faster. A key outside ``[0, capacity)`` becomes ``capacity`` first (as unsigned, a negative
        key is larger than any row id), never a row id, so the range check of `rows` still meets it.
        There are then at most ``capacity + 1`` distinct ids (`distinct`'s ``most``).

        A dynamic table's keys are any int64; a step whose keys all lie in ``[0, 2**31)`` (the ids
        of most categorical features) deduplicates them as int32 too, found by one maximum over
        the keys read as unsigned. The distinct keys and their order are the same either way
        (first sight, and the same parts of the key space), so the rows new keys get are too."""
        if self.indexed:
            def narrow() -> tuple[tf.Tensor, tf.Tensor]:
                unique, position = distinct(tf.cast(keys, tf.int32))
                return tf.cast(unique, tf.int64), position

            fits = tf.reduce_max(tf.bitcast(keys, tf.uint64)) < tf.constant(2**31, tf.uint64)
            return tf.cond(fits, narrow, lambda: distinct(keys))
        if self.capacity >= 2**31:
            return distinct(keys)
        row_ids = tf.minimum(tf.bitcast(keys, tf.uint64), tf.constant(self.capacity, tf.uint64))
        unique, position = distinct(tf.cast(row_ids, tf.int32), most=self.capacity + 1)
        return tf.cast(unique, tf.int64), position

    def _share(self) -> Any:
        """For a table replicated over several replicas: all_gather of each replica's new keys."""
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return None
        return lambda keys: all_gather(context, keys)

    def rows(self, keys: tf.Tensor, insert: bool, component: int | None = None, share: Any = None,
             counts: tf.Tensor | None = None, admission: bool = True) -> tuple[tf.Tensor, tf.Tensor | None]:
        """(rows of distinct int64 `keys`, mask of keys that have one or None when all do).

        With `insert`, a dynamic table gives new keys rows (those its admission lets in: `counts`
        are their occurrences in the batch) and writes their initial vectors.
        """
        life = self.lifecycle
        state = self.state if component is None else self.state.local(component)
        if not self.indexed:
            keys = self._check_range(keys, self.capacity)
            if insert and life.track_changes:
                with tf.control_dependencies(state.touch(keys, state.tick())):
                    keys = tf.identity(keys)
            return keys, None
        if not insert:
            if life.evicts:
                rows = state.buckets.lookup(keys, state.now())  # expiry: against the time now
            else:
                rows, _ = key_index.lookup(self.index_variables(component), keys)
            return tf.maximum(rows, 0), rows >= 0
        found = None
        if life.active and share is not None:  # (`lookup` places the keys of every replica instead)
            raise ValueError(f"{self.name}: a replicated table with eviction_policy, admission or track_changes "
                             "places the keys of every replica at once; look it up through `lookup`")
        if life.evicts:
            rows, found, new_keys, new_rows = state.place_bucketed(keys, counts, admission=admission)
        elif life.active:
            rows, found, new_keys, new_rows = state.place_open(self.index_variables(component), keys, counts,
                                                               admission=admission)
        else:
            index = self.index_variables(component)
            rows, new_keys, new_rows = key_index.lookup_or_insert(index, keys, self.capacity, self.name, share)
        variable = self.variable.value if component is None else local_components(self.variable)[component]
        initial = tf.cast(self._initial_vectors(new_keys, component), variable.dtype)  # to nearest
        variable.scatter_update(tf.IndexedSlices(initial, new_rows))
        return rows, found

    def _initial_vectors(self, keys: tf.Tensor, component: int | None) -> tf.Tensor:
        """What the rows of new `keys` start from in this replica's variable (a column-sharded
        table: its columns of the key-seeded vectors)."""
        return keyed_initial_values_tf(keys, self.dim, self.init)

    def lookup(self, keys: Any, training: Any = None, slots: Any = None) -> tf.Tensor:
        """Vectors of `keys` (any shape, or a `UniqueKeys` deduplicated ahead): ``keys.shape + [dim]``,
        float32. New keys get rows in training calls (`inserting`). (`slots`, each key's slot,
        matters to table-wise sharded tables only.)"""
        ready = isinstance(keys, UniqueKeys)  # deduplicated ahead, in the input pipeline
        keys = keys if ready else self._keys(keys)  # (UniqueKeys: int64 already)
        if not self.built:
            self.build()
        if in_shape_trace(self.variable):
            return tf.zeros(tf.concat([tf.shape(like_keys(keys)), [self.dim]], 0), compute_dtype(self.variable.dtype))
        self._mark_variables()
        pairs = keys.pairs if ready else None
        if ready:
            unique, position = keys.unique, tf.reshape(keys.position, [-1])
        else:
            unique, position = self._distinct(tf.reshape(keys, [-1]))
        insert = inserting(training)
        counts = tf.math.bincount(position, minlength=tf.size(unique), dtype=tf.int64) \
            if insert and self.lifecycle.counts else None
        share = self._share()
        if share is not None and insert and self.lifecycle.active:
            rows, found = self._rows_of_every_replica(unique, counts)
        elif ready and keys.rows is not None and share is None and self.takes_rows_ahead:
            rows, found = self._rows_checked(unique, keys.rows, insert)
        else:
            rows, found = self.rows(unique, insert=insert, share=share, counts=counts)
        vectors = vectors_of(self.variable.value, rows, found, position, pairs)
        return tf.reshape(vectors, tf.concat([tf.shape(like_keys(keys)), [self.dim]], 0))

    def _rows_of_every_replica(self, keys: tf.Tensor, counts: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor | None]:
        """A replicated table that forgets: every replica places the distinct keys of the whole step
        (the union of the replicas' keys in replica order, their counts summed), so every copy takes
        the same decisions as one device would and the copies stay equal; then each keeps its own."""
        context = tf.distribute.get_replica_context()
        sizes = gather_counts(context, tf.shape(keys, out_type=tf.int64)[:1])
        every, every_count = all_gather_columns(context, [keys, counts], sizes)  # each key beside its count
        union, where = tf.unique(every, out_idx=tf.int32)
        total = None if counts is None else tf.math.unsorted_segment_sum(every_count, where, tf.size(union))
        rows, found = self.rows(union, insert=True, counts=total)
        mine = where[tf.reduce_sum(sizes[:context.replica_id_in_sync_group]):][:tf.size(keys)]
        return tf.gather(rows, mine), None if found is None else tf.gather(found, mine)
