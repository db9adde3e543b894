"""The collectives of a table spread over replicas, on TensorFlow's own distribution engine.

* `gather_counts`: every replica's counts (how many keys or rows each sends) in one all-reduce.
* `all_gather`: ``ReplicaContext.all_gather`` that also survives every replica sending nothing,
  and carries the dtypes TensorFlow's collectives refuse, exactly, in a wider type.
* `all_gather_columns`: integer vectors of one length (keys and their slots or counts) in one gather.
* `all_gather_slices`: the sparse gradients of all replicated tables of one row width and dtype,
  gathered together: their lengths in one all-reduce, their rows and indices in one gather.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from sok_tutorial.embedding.ops import masked


def gather_counts(context: Any, counts: tf.Tensor) -> tf.Tensor:
    """Every replica's `counts` (int ``[k]``, k known while tracing), replica-major ``[replicas * k]``
    int64: one all-reduce of a ``[replicas, k]`` array of zeros but for this replica's row.

    TensorFlow's ``all_gather`` of a tensor whose length is not known while tracing first gathers
    the lengths, pads, gathers and trims, and builds a few hundred ops per call on 4 replicas; the
    lengths a table's step exchanges before each gather of keys or rows take this one collective.

    Example (one replica):
        >>> gather_counts(tf.distribute.get_replica_context(), tf.constant([3, 5])).numpy().tolist()
        [3, 5]
    """
    replicas = context.num_replicas_in_sync
    counts = tf.reshape(tf.cast(counts, tf.int64), [-1])
    mine = tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=tf.int64)  # (replicas,)
    return tf.reshape(context.all_reduce("sum", mine[:, None] * counts[None, :]), [-1])


#: dtypes TensorFlow's collectives do not carry, and the wider one each travels in, exactly
_CARRIED = {tf.bool: tf.int32, tf.int8: tf.int32, tf.uint8: tf.int32, tf.int16: tf.int32, tf.uint16: tf.int32,
            tf.uint32: tf.int64, tf.bfloat16: tf.float32}


def all_gather(context: Any, values: tf.Tensor, sizes: tf.Tensor | None = None) -> tf.Tensor:
    """Every replica's `values` concatenated along the first axis, in replica order:
    ``context.all_gather(values, 0)``, also when every replica's `values` is empty (TensorFlow's
    collective crashes the process then: each replica sends one padding row more, dropped after),
    and for the dtypes TensorFlow's collectives do not carry (bool, 8- and 16-bit types, bfloat16
    and unsigned ones, carried exactly in a wider type; uint64 as the same bits in int64).
    `sizes`: each replica's number of rows, when already known (else `gather_counts` of them).

    Example (one replica):
        >>> all_gather(tf.distribute.get_replica_context(), tf.constant([[1.0], [2.0]])).numpy().tolist()
        [[1.0], [2.0]]
    """
    if sizes is None:
        sizes = gather_counts(context, tf.shape(values, out_type=tf.int64)[:1])  # (replicas,)
    dtype = values.dtype
    values = tf.bitcast(values, tf.int64) if dtype == tf.uint64 else tf.cast(values, _CARRIED.get(dtype, dtype))
    pad = tf.zeros(tf.concat([[1], tf.shape(values)[1:]], 0), values.dtype)
    gathered = context.all_gather(tf.concat([values, pad], 0), 0)
    padding = tf.cumsum(tf.cast(sizes, tf.int64) + 1) - 1
    keep = tf.tensor_scatter_nd_update(tf.ones(tf.shape(gathered)[:1], tf.bool), padding[:, None],
                                       tf.zeros_like(padding, tf.bool))
    gathered = masked(gathered, keep)
    return tf.bitcast(gathered, dtype) if dtype == tf.uint64 else tf.cast(gathered, dtype)


def all_gather_columns(context: Any, columns: Sequence[tf.Tensor | None],
                       sizes: tf.Tensor) -> list[tf.Tensor | None]:
    """`all_gather` of integer vectors ``[n]`` of one length (each replica's `sizes`), in one gather:
    the columns of one int64 ``[n, k]`` array, each back in its own dtype; a None column stays None.
    How a step sends each key beside its slot or its count.

    Example (one replica):
        >>> keys, slots = tf.constant([7, 9], tf.int64), tf.constant([0, 2], tf.int32)
        >>> context = tf.distribute.get_replica_context()
        >>> [c.numpy().tolist() for c in all_gather_columns(context, [keys, slots], tf.constant([2]))]
        [[7, 9], [0, 2]]
    """
    present = [c for c in columns if c is not None]
    if len(present) == 1:
        gathered = [all_gather(context, present[0], sizes)]
    else:
        both = all_gather(context, tf.stack([tf.cast(c, tf.int64) for c in present], 1), sizes)  # (N*n, k)
        gathered = [tf.cast(both[:, i], c.dtype) for i, c in enumerate(present)]
    out = iter(gathered)
    return [None if c is None else next(out) for c in columns]


def all_gather_slices(context: Any, gradients: Sequence[tf.IndexedSlices]) -> list[tf.IndexedSlices]:
    """Every replica's rows of each of the sparse `gradients` (the rows of all replicas, in replica
    order, as ``context.all_reduce`` of an ``IndexedSlices`` gives them), gathered together:
    one gather of the lengths (`gather_counts`) and one `all_gather` of the rows with their indices
    for all gradients of one row width and dtype, where an all-reduce of each on its own takes a
    gather of its length and a branch of padded gathers per gradient. With many replicated tables
    that is tens of collectives a step fewer, and a smaller graph to trace and start.

    Example (one replica: each gradient comes back as it is):
        >>> g = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([4, 1]), tf.constant([9, 3]))
        >>> context = tf.distribute.get_replica_context()
        >>> [s.indices.numpy().tolist() for s in all_gather_slices(context, [g, g])]
        [[4, 1], [4, 1]]
    """
    replicas = context.num_replicas_in_sync
    out: list[tf.IndexedSlices | None] = [None] * len(gradients)
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(gradients):
        row = g.values.shape[1:]  # (a row shape not known while tracing is gathered on its own)
        groups.setdefault((g.values.dtype, tuple(row)) if row.is_fully_defined() else i, []).append(i)
    for members in groups.values():
        parts = [gradients[i] for i in members]
        values = tf.concat([g.values for g in parts], 0)
        indices = tf.concat([tf.cast(g.indices, tf.int64) for g in parts], 0)
        sizes = tf.stack([tf.shape(g.indices, out_type=tf.int64)[0] for g in parts])  # (k,)
        every = gather_counts(context, sizes)  # (replicas * k,): replica-major
        per_replica = tf.reduce_sum(tf.reshape(every, [replicas, len(parts)]), 1)
        rows, indices = _gather_rows_and_indices(context, values, indices, per_replica)
        pieces = (tf.split(rows, every, num=replicas * len(parts)), tf.split(indices, every, num=replicas * len(parts)))
        for j, (i, g) in enumerate(zip(members, parts)):
            mine = range(j, replicas * len(parts), len(parts))  # gradient j of each replica
            out[i] = tf.IndexedSlices(tf.concat([pieces[0][r] for r in mine], 0),
                                      tf.cast(tf.concat([pieces[1][r] for r in mine], 0), g.indices.dtype),
                                      g.dense_shape)
    return out


def _gather_rows_and_indices(context: Any, values: tf.Tensor, indices: tf.Tensor,
                             sizes: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`all_gather` of `values` ``[n, ...]`` and their int64 `indices` ``[n]`` (each replica's
    number of rows `sizes`): one gather of both, each index as the bits of one or two more values
    beside its row, when the row shape is known while tracing and the values are 32- or 64-bit
    numbers; else one gather each. The same bytes move, by the same route as the rows alone
    (a strategy may carry some dtypes by another), and TensorFlow's gather of a tensor is itself
    two collectives, its length and its contents."""
    dtype, row = values.dtype, values.shape[1:]
    if not (row.is_fully_defined() and row.num_elements() and (dtype.is_floating or dtype.is_integer)
            and dtype.size in (4, 8)):
        return all_gather(context, values, sizes), all_gather(context, indices, sizes)
    width, extra = row.num_elements(), 8 // dtype.size  # values a row, and per index
    n = tf.shape(values)[:1]
    carried = tf.concat([tf.reshape(values, tf.concat([n, [width]], 0)),
                         tf.reshape(tf.bitcast(indices, dtype), tf.concat([n, [extra]], 0))], 1)
    gathered = all_gather(context, carried, sizes)  # (N*n, width + extra)
    total = tf.shape(gathered)[:1]
    rows = tf.reshape(gathered[:, :width], tf.concat([total, row.as_list()], 0))
    at = gathered[:, width:] if extra == 2 else gathered[:, width]
    return rows, tf.bitcast(at, tf.int64)
