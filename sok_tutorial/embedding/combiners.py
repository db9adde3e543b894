"""Combiners: how the vectors of one bag (the keys of one slot of one sample) become one vector.

As ``tf.nn.embedding_lookup_sparse`` defines them, for a bag of keys ``k_1 .. k_n`` with weights
``w_1 .. w_n`` (all 1 when no weights are given)::

    sum     w_1 e_1 + ... + w_n e_n
    mean    (w_1 e_1 + ... + w_n e_n) / (w_1 + ... + w_n)
    sqrtn   (w_1 e_1 + ... + w_n e_n) / sqrt(w_1^2 + ... + w_n^2)

An empty bag, or one whose divisor is 0, gives zeros. Bags are given by a segment id per key
(`combine`, any layout that `sok_tutorial.embedding.lookup.flatten_bags` flattens) or by an axis
of a dense tensor when every bag holds the same number of keys (`combine_dense`).

Weights come shaped like the keys, and `flat_weights` lines them up with the flat keys::

    keys      (ragged)   [[[3, 7], []], [[7]]]           2 samples, 2 slots
    weights   (ragged)   [[[0.5, 2.0], []], [[1.0]]]     the same row splits
    flat keys            [3, 7, 7]
    flat weights         [0.5, 2.0, 1.0]
    segment ids          [0, 0, 2]                        bag 1 (sample 0, slot 1) is empty
    mean                 [[(0.5 e3 + 2 e7) / 2.5, 0], [e7, 0]]

``combiner=None`` keeps each key's vector (times its weight, if any) for sequence models,
``ragged`` or ``padded`` to ``max_nnz`` with a mask (`sequence`, `dense_sequence`)::

    keys      (ragged)   [[[3, 7], []], [[7], [1]]]       [batch=2, slot=2, None]
    "ragged"             [[[e3, e7], []], [[e7], [e1]]]   [batch, slot, None, dim]
      flat values        [e3, e7, e7, e1]
      bag row splits     [0, 2, 2, 3, 4]                   bag = sample * slot_num + slot
    "padded", max_nnz=3  vectors [[[e3, e7, 0], [0, 0, 0]],
                                  [[e7, 0, 0], [e1, 0, 0]]]         [batch, slot, max_nnz, dim]
                         mask    [[[T, T, F], [F, F, F]],
                                  [[T, F, F], [T, F, F]]]           [batch, slot, max_nnz], bool
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")
SEQUENCE_OUTPUTS = ("ragged", "padded")


def weigh(vectors: tf.Tensor, weights: tf.Tensor | None) -> tf.Tensor:
    """`vectors` ``[..., dim]`` times `weights` ``[...]`` (each vector by its key's weight), or as they are."""
    return vectors if weights is None else vectors * tf.cast(weights, vectors.dtype)[..., None]


def scale(sums: tf.Tensor, segments: tf.Tensor, num_bags: tf.Tensor, combiner: str,
          weights: tf.Tensor | None = None) -> tf.Tensor:
    """Per-bag (weighted) sums ``[num_bags, dim]`` divided as `combiner` says: by nothing, the sum of
    the bag's weights (``n`` without weights) or the square root of the sum of their squares."""
    if combiner == "sum":
        return sums
    weights = tf.ones_like(segments, sums.dtype) if weights is None else tf.cast(weights, sums.dtype)
    if combiner == "sqrtn":
        weights = tf.square(weights)
    divisor = tf.math.unsorted_segment_sum(weights, segments, num_bags)  # (bags,)
    if combiner == "sqrtn":
        divisor = tf.sqrt(divisor)
    return tf.math.divide_no_nan(sums, divisor[:, None])


def combine(vectors: tf.Tensor, segments: tf.Tensor, num_bags: tf.Tensor, combiner: str,
            weights: tf.Tensor | None = None) -> tf.Tensor:
    """The combined vector of each bag, ``[num_bags, dim]``; an empty bag gives zeros.

    Args:
        vectors: float ``[n, dim]``, one row per key.
        segments: int ``[n]``, the bag of each key, in ``[0, num_bags)`` (any order).
        num_bags: scalar int, the number of bags.
        combiner: one of `COMBINERS`.
        weights: float ``[n]``, each key's weight, or None (every weight 1).

    Returns:
        ``[num_bags, dim]``, the dtype of `vectors`.

    Example:
        >>> vectors = tf.constant([[1.0, 2.0], [3.0, 2.0], [2.0, 0.0], [2.0, 4.0], [5.0, 3.0]])
        >>> segments = tf.constant([0, 0, 0, 0, 2], tf.int64)  # 4 keys in bag 0, bag 1 empty
        >>> combine(vectors, segments, 3, "sqrtn").numpy().tolist()
        [[4.0, 4.0], [0.0, 0.0], [5.0, 3.0]]
        >>> weights = tf.constant([1.0, 3.0, 0.0, 0.0, 2.0])
        >>> combine(vectors, segments, 3, "mean", weights).numpy().tolist()
        [[2.5, 2.0], [0.0, 0.0], [5.0, 3.0]]
    """
    sums = tf.math.unsorted_segment_sum(weigh(vectors, weights), segments, num_bags)
    return scale(sums, segments, num_bags, combiner, weights)


def combine_dense(vectors: tf.Tensor, combiner: str, weights: tf.Tensor | None = None, axis: int = 2) -> tf.Tensor:
    """Combine along `axis` of dense ``[batch, slot, nnz, dim]`` vectors (every bag holds ``nnz`` keys);
    `weights`, if given, are shaped like the vectors less their last axis (``[batch, slot, nnz]``).

    Example:
        >>> combine_dense(tf.ones([1, 1, 4, 2]), "sqrtn").numpy().tolist()
        [[[2.0, 2.0]]]
    """
    if weights is None:
        sums = tf.reduce_sum(vectors, axis=axis)
        if combiner == "sum":
            return sums
        count = tf.cast(tf.shape(vectors)[axis], vectors.dtype)
        return tf.math.divide_no_nan(sums, tf.sqrt(count) if combiner == "sqrtn" else count)
    weights = tf.cast(weights, vectors.dtype)
    sums = tf.reduce_sum(weigh(vectors, weights), axis=axis)
    if combiner == "sum":
        return sums
    divisor = tf.reduce_sum(tf.square(weights) if combiner == "sqrtn" else weights, axis=axis)
    return tf.math.divide_no_nan(sums, (tf.sqrt(divisor) if combiner == "sqrtn" else divisor)[..., None])


def _same(a: tf.Tensor, b: tf.Tensor, message: str) -> tf.Operation | None:
    """Check that two int tensors hold the same values: at once (ValueError) where shapes or eager
    values tell, else an assertion for the graph (InvalidArgumentError when it runs)."""
    a, b = tf.reshape(tf.cast(a, tf.int64), [-1]), tf.reshape(tf.cast(b, tf.int64), [-1])
    if a.shape.is_fully_defined() and b.shape.is_fully_defined() and a.shape != b.shape:
        raise ValueError(message)
    if tf.executing_eagerly():
        if a.numpy().tolist() != b.numpy().tolist():
            raise ValueError(message)
        return None
    n = tf.minimum(tf.size(a), tf.size(b))
    same = tf.logical_and(tf.equal(tf.size(a), tf.size(b)), tf.reduce_all(tf.equal(a[:n], b[:n])))
    return tf.debugging.Assert(same, [message])  # (a string only: no tf.cond around it to print a bool)


def flat_weights(keys: Any, weights: Any, *, name: str = "sp_weights") -> tf.Tensor:
    """The weight of each key, ``[n]`` float, in the order the keys flatten to.

    `weights` must be shaped like `keys`: a ``tf.RaggedTensor`` with the same row splits (and
    ragged rank), a ``tf.SparseTensor`` with the same indices and dense shape, or, for dense keys,
    a dense tensor of the same shape. Anything else is an error naming `name` and what differs: a
    ``ValueError`` (eagerly, or where static shapes tell), else a ``tf.errors.InvalidArgumentError``
    when the graph runs.

    Example:
        >>> keys = tf.ragged.constant([[[3, 7], []], [[7]]], dtype=tf.int64)
        >>> weights = tf.ragged.constant([[[0.5, 2.0], []], [[1.0]]])
        >>> flat_weights(keys, weights).numpy().tolist()
        [0.5, 2.0, 1.0]
    """
    if isinstance(keys, tf.RaggedTensor):
        if not isinstance(weights, tf.RaggedTensor):
            raise TypeError(f"{name} must be a tf.RaggedTensor like the keys (the same row splits), "
                            f"got {type(weights).__name__}")
        if weights.ragged_rank != keys.ragged_rank:
            raise ValueError(f"{name} has ragged_rank={weights.ragged_rank}, expected the keys' "
                             f"ragged_rank={keys.ragged_rank} (the same row splits)")
        checks = [_same(k, w, f"{name}: row splits of ragged dimension {i + 1} differ from the keys'")
                  for i, (k, w) in enumerate(zip(keys.nested_row_splits, weights.nested_row_splits))]
        checks.append(_same(tf.shape(keys.flat_values), tf.shape(weights.flat_values),
                            f"{name}: inner shape {weights.flat_values.shape[1:]} differs from the keys' "
                            f"{keys.flat_values.shape[1:]}"))
        values = weights.flat_values
    elif isinstance(keys, tf.SparseTensor):
        if not isinstance(weights, tf.SparseTensor):
            raise TypeError(f"{name} must be a tf.SparseTensor like the keys (the same indices), "
                            f"got {type(weights).__name__}")
        checks = [_same(keys.dense_shape, weights.dense_shape, f"{name}: dense shape {weights.shape} differs "
                                                                f"from the keys' {keys.shape}"),
                  _same(keys.indices, weights.indices, f"{name}: indices differ from the keys' (expected the "
                                                       f"same entries in the same order)")]
        values = weights.values
    else:
        if isinstance(weights, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(f"{name} must be a dense tensor like the keys, got {type(weights).__name__}")
        keys, values = tf.convert_to_tensor(keys), tf.convert_to_tensor(weights)
        checks = [_same(tf.shape(keys), tf.shape(values), f"{name} has shape {values.shape}, expected the "
                                                          f"keys' shape {keys.shape}")]
    if not values.dtype.is_floating:
        raise TypeError(f"{name} must be float (like tf.nn.embedding_lookup_sparse's), got {values.dtype.name}")
    with tf.control_dependencies([c for c in checks if c is not None]):
        return tf.reshape(tf.identity(values), [-1])


def sequence(vectors: tf.Tensor, segments: tf.Tensor, num_bags: tf.Tensor, slot_num: int, max_nnz: int,
             output: str) -> Any:
    """Each key's vector, uncombined: a ``tf.RaggedTensor`` ``[batch, slot_num, None, dim]``
    (``output="ragged"``), or ``(vectors [batch, slot_num, max_nnz, dim] zero-padded, mask
    [batch, slot_num, max_nnz] bool)`` (``"padded"``).

    Args:
        vectors: float ``[n, dim]``, one row per key, bag after bag.
        segments: int ``[n]``, the bag of each key (``sample * slot_num + slot``), sorted.
        num_bags: scalar int, ``batch * slot_num``.

    Example:
        >>> vectors = tf.constant([[3.0], [7.0], [7.0], [1.0]])
        >>> ragged = sequence(vectors, tf.constant([0, 0, 2, 3], tf.int64), 4, 2, 3, "ragged")
        >>> ragged.to_list()
        [[[[3.0], [7.0]], []], [[[7.0]], [[1.0]]]]
        >>> padded, mask = sequence(vectors, tf.constant([0, 0, 2, 3], tf.int64), 4, 2, 3, "padded")
        >>> padded.shape, mask.numpy().astype(int).tolist()
        (TensorShape([2, 2, 3, 1]), [[[1, 1, 0], [0, 0, 0]], [[1, 0, 0], [1, 0, 0]]])
    """
    bags = tf.RaggedTensor.from_value_rowids(vectors, segments, nrows=num_bags, validate=False)
    ragged = tf.RaggedTensor.from_uniform_row_length(bags, slot_num, validate=False)
    if output == "ragged":
        return ragged
    padded = ragged.to_tensor(shape=[None, slot_num, max_nnz, vectors.shape[-1]])
    mask = tf.reshape(tf.sequence_mask(bags.row_lengths(), max_nnz), [-1, slot_num, max_nnz])
    return padded, mask


def dense_sequence(vectors: tf.Tensor, max_nnz: int, output: str) -> Any:
    """`sequence` for dense ``[batch, slot, nnz, dim]`` vectors (every bag full): the vectors
    themselves (``"ragged"``), or padded to ``max_nnz`` with their mask (``"padded"``)."""
    if output == "ragged":
        return vectors
    nnz = tf.shape(vectors)[2]
    padded = tf.pad(vectors, [[0, 0], [0, 0], [0, max_nnz - nnz], [0, 0]])
    padded = tf.ensure_shape(padded, [None, vectors.shape[1], max_nnz, vectors.shape[-1]])
    mask = tf.broadcast_to(tf.range(max_nnz) < nnz, tf.shape(padded)[:3])
    return padded, mask
