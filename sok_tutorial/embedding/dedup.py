"""Deduplicating a step's keys, and summing per key: the work every table lookup and every sparse
optimizer does on a batch's keys.

* `distinct` deduplicates a batch's keys, as ``tf.unique`` does, in four parts on large batches.
* `sum_by_position` sums the rows of repeated keys (a lookup's gradient, an optimizer's rows).
* `mix_keys` is the 64-bit key mix behind the key index's slots and the bucketed index's buckets.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np
import tensorflow as tf

_PARTS = 4  # hash maps `distinct` builds on a large batch
PARTS_FROM = 1 << 15  # keys from which it does; below, one tf.unique is as fast
_MIX = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: the multiplier of `mix_keys` and of `distinct`'s parts


def mix_keys(keys: tf.Tensor) -> tf.Tensor:
    """A 64-bit mix of int64 `keys` (multiply, xor-shift, multiply), uint64: its top bits place a key
    in the key index's slots (`sok_tutorial.embedding.index.home_slots`) and in the bucketed index's
    buckets (`sok_tutorial.embedding.buckets.bucket_of`). `mix_keys_np` is its NumPy twin.

    Example:
        >>> keys = [0, 1, -1, 2**63 - 1]
        >>> mix_keys(tf.constant(keys, tf.int64)).numpy().tolist() == mix_keys_np(np.array(keys)).tolist()
        True
    """
    mix = tf.constant(_MIX, tf.uint64)
    h = tf.bitcast(keys, tf.uint64) * mix
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(32, tf.uint64))) * mix


def mix_keys_np(keys: Any) -> np.ndarray:
    """NumPy twin of `mix_keys`."""
    mix = np.uint64(_MIX)
    with np.errstate(over="ignore"):
        h = np.asarray(keys, np.int64).view(np.uint64) * mix
        return (h ^ (h >> np.uint64(32))) * mix


def distinct(keys: tf.Tensor, parts_from: int = PARTS_FROM, any_order: bool = False,
             most: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """(distinct `keys`, int32 position of each key among them): ``tf.unique(keys, out_idx=tf.int32)``
    of 1-D integer `keys`, except that from `parts_from` keys on the distinct keys come grouped by
    four parts of the key space (first sight order within each part).

    A number of keys not known while tracing is settled by a ``tf.cond`` on the size, so that the
    order depends on the keys alone (a dynamic table hands out rows in this order). A caller to
    whom the order does not matter (`any_order`: sums per key, as an optimizer takes its rows)
    gets the parts with no ``tf.cond``, which would put both forms, as branch functions, in every
    such step's graph (a sharded table's optimizer's), to be traced and optimized at its first
    call. `most`, a bound on the distinct keys known while tracing (a small table's rows): below
    `parts_from`, one map stays in cache whatever the batch size, and it is one ``tf.unique``.

    ``tf.unique`` fills one hash map on one core; at the ~200k keys of a large recommender batch
    its map outgrows the core's cache, and it becomes the largest single op of a table's step.
    Split by the top bits of a multiplicative hash of the key (so that any pattern of keys
    spreads over the parts), four maps of a quarter of the keys each fit, and TensorFlow's
    inter-op threads build them side by side; one ``SparseToDense`` puts the positions back in
    the batch's order. ``benchmarks/embedding.py`` (``torchrec_shape``) measures the step it is
    part of; the README has the figures.

    Example:
        >>> keys = tf.constant([7, 3, 7, 8, 3, 5], tf.int64)
        >>> unique, position = distinct(keys, parts_from=1)  # (four parts even for six keys)
        >>> sorted(unique.numpy().tolist()), bool(tf.reduce_all(tf.gather(unique, position) == keys))
        ([3, 5, 7, 8], True)
        >>> [k.numpy().tolist() for k in distinct(keys)]  # small batches: exactly tf.unique
        [[7, 3, 8, 5], [0, 1, 0, 2, 1, 3]]
    """
    def one_map() -> tuple[tf.Tensor, tf.Tensor]:
        return tuple(tf.unique(keys, out_idx=tf.int32))  # (a tuple, as in_parts returns, for tf.cond)

    def in_parts() -> tuple[tf.Tensor, tf.Tensor]:
        mixed = tf.bitcast(tf.cast(keys, tf.int64), tf.uint64) * tf.constant(_MIX, tf.uint64)
        part = tf.cast(tf.bitwise.right_shift(mixed, tf.constant(62, tf.uint64)), tf.int32)  # 4 = 2 ** 2 parts
        pieces = tf.dynamic_partition(keys, part, _PARTS)
        where = tf.dynamic_partition(tf.range(tf.size(keys)), part, _PARTS)
        uniques, positions, offset = [], [], tf.constant(0, tf.int32)
        for piece in pieces:
            unique, position = tf.unique(piece, out_idx=tf.int32)
            uniques.append(unique)
            positions.append(position + offset)
            offset += tf.size(unique)
        position = tf.raw_ops.SparseToDense(  # back in the keys' order: one pass, twice a stitch's speed
            sparse_indices=tf.concat(where, 0), output_shape=tf.shape(keys), sparse_values=tf.concat(positions, 0),
            default_value=tf.constant(0, tf.int32), validate_indices=False)
        position.set_shape(keys.shape)
        return tf.concat(uniques, 0), position

    known = keys.shape.num_elements()
    if most is not None and most < parts_from:
        return one_map()
    if known is None and not any_order:
        return tf.cond(tf.size(keys) >= parts_from, in_parts, one_map)
    return one_map() if known is not None and known < parts_from else in_parts()


def row_position_pairs(position: tf.Tensor, start: Any = 0, stop: tf.Tensor | None = None) -> tf.Tensor:
    """``[n, 2]`` int32 ``(start + k, position[k])``: a sparse product's indices for the int32
    `position` ``[n]``. `stop`: ``start + n`` as int64, when the caller has it already.

    ``tf.stack`` along the last axis copies two elements at a time, one of the larger ops of a
    table's step on a CPU; on a little-endian host each pair is built instead as one int64,
    ``position * 2**32 + k``, whose two halves a bitcast reads as the pair, low half first, in three
    elementwise ops (`benchmarks/embedding.py` profiles the step).

    Example:
        >>> row_position_pairs(tf.constant([4, 0, 4]), 10).numpy().tolist()
        [[10, 4], [11, 0], [12, 4]]
    """
    if sys.byteorder != "little":
        start = tf.cast(start, tf.int32)
        return tf.stack([tf.range(start, start + tf.size(position)), position], 1)
    start = tf.cast(start, tf.int64)
    stop = start + tf.cast(tf.size(position), tf.int64) if stop is None else stop
    k = tf.range(start, stop)
    return tf.bitcast(tf.bitwise.left_shift(tf.cast(position, tf.int64), tf.constant(32, tf.int64)) + k, tf.int32)


def sum_by_position(values: tf.Tensor, position: tf.Tensor, count: tf.Tensor,
                    pairs: tf.Tensor | None = None) -> tf.Tensor:
    """``out[position[k]] += values[k]``: ``[count, ...]`` sums of the rows of `values` ``[K, ...]``.
    `pairs`: the product's indices ``(k, position[k])`` ``[K, 2]`` int64, if made ahead (`UniqueKeys`).

    Two sparse matrix products, each over half of the rows, which the inter-op threads run side by
    side (TensorFlow's CPU kernel of the product runs on one core), and one sum of the two. Each
    product's int32 indices ``(k, position[k])`` are made from its own half (no ``[K, 2]`` array
    of the whole batch to build and then slice). Two at any size: a small batch pays one more
    small product, and a batch sums alike whether its size is known while tracing or not, with no
    ``tf.cond`` between one product and two (which would put both in every graph whose size is
    unknown while tracing, a sharded table's optimizer's among them). Every table's gradient on every
    replica takes one, so it is built of few ops (one split for both halves, the halves' sizes and
    rows computed once): about forty, which a step's trace and first call pay per table and replica.

    Example:
        >>> sum_by_position(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([1, 0, 1]), 2).numpy().tolist()
        [[2.0], [5.0]]
    """
    position = tf.cast(position, tf.int32)
    k = tf.size(position)
    half = k // 2
    sizes = tf.stack([half, k - half])
    rows, lo = tf.cast(k, tf.int64), tf.cast(half, tf.int64)  # (the second half's first row, int64)
    shape = tf.stack([rows, tf.cast(count, tf.int64)])
    flat = values if values.shape.rank == 2 else tf.reshape(values, tf.stack([k, -1]))
    parts = tf.split(position, sizes)
    indices = tf.split(pairs, sizes) if pairs is not None else \
        [row_position_pairs(parts[0], tf.constant(0, tf.int64), lo), row_position_pairs(parts[1], lo, rows)]
    out = [tf.raw_ops.SparseTensorDenseMatMul(a_indices=these, a_values=tf.ones_like(part, values.dtype),
                                              a_shape=shape, b=flat, adjoint_a=True)  # (count, prod(rest))
           for these, part in zip(indices, parts)]
    out = out[0] + out[1]
    return out if values.shape.rank == 2 else tf.reshape(out, tf.concat([[count], tf.shape(values)[1:]], 0))
