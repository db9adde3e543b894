"""Combiners: how the vectors of one bag (the keys of one slot of one sample) become one vector.

As ``tf.nn.embedding_lookup_sparse`` defines them, for a bag of keys ``k_1 .. k_n``::

    sum     e_1 + ... + e_n
    mean    (e_1 + ... + e_n) / n
    sqrtn   (e_1 + ... + e_n) / sqrt(n)

An empty bag gives zeros. Bags are given by a segment id per key (`combine`, any layout that
`sok_tutorial.embedding.lookup.flatten_bags` flattens) or by an axis of a dense tensor when every
bag holds the same number of keys (`combine_dense`).
"""
from __future__ import annotations

import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")


def scale(sums: tf.Tensor, segments: tf.Tensor, num_bags: tf.Tensor, combiner: str) -> tf.Tensor:
    """Per-bag sums ``[num_bags, dim]`` divided as `combiner` says (by nothing, ``n`` or ``sqrt(n)``)."""
    if combiner == "sum":
        return sums
    counts = tf.math.unsorted_segment_sum(tf.ones_like(segments, sums.dtype), segments, num_bags)  # (bags,)
    if combiner == "sqrtn":
        counts = tf.sqrt(counts)
    return tf.math.divide_no_nan(sums, counts[:, None])


def combine(vectors: tf.Tensor, segments: tf.Tensor, num_bags: tf.Tensor, combiner: str) -> tf.Tensor:
    """The combined vector of each bag, ``[num_bags, dim]``; an empty bag gives zeros.

    Args:
        vectors: float ``[n, dim]``, one row per key.
        segments: int ``[n]``, the bag of each key, in ``[0, num_bags)`` (any order).
        num_bags: scalar int, the number of bags.
        combiner: one of `COMBINERS`.

    Returns:
        ``[num_bags, dim]``, the dtype of `vectors`.

    Example:
        >>> vectors = tf.constant([[1.0, 2.0], [3.0, 2.0], [2.0, 0.0], [2.0, 4.0], [5.0, 3.0]])
        >>> segments = tf.constant([0, 0, 0, 0, 2], tf.int64)  # 4 keys in bag 0, bag 1 empty
        >>> combine(vectors, segments, 3, "sqrtn").numpy().tolist()
        [[4.0, 4.0], [0.0, 0.0], [5.0, 3.0]]
    """
    return scale(tf.math.unsorted_segment_sum(vectors, segments, num_bags), segments, num_bags, combiner)


def combine_dense(vectors: tf.Tensor, combiner: str, axis: int = 2) -> tf.Tensor:
    """Combine along `axis` of dense ``[batch, slot, nnz, dim]`` vectors (every bag holds ``nnz`` keys).

    Example:
        >>> combine_dense(tf.ones([1, 1, 4, 2]), "sqrtn").numpy().tolist()
        [[[2.0, 2.0]]]
    """
    sums = tf.reduce_sum(vectors, axis=axis)
    if combiner == "sum":
        return sums
    count = tf.cast(tf.shape(vectors)[axis], vectors.dtype)
    return tf.math.divide_no_nan(sums, tf.sqrt(count) if combiner == "sqrtn" else count)
