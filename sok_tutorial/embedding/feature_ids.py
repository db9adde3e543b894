"""One feature's ids as flat keys, and how their vectors become the feature's activation.

`prepare` takes a feature's ids (and weights) in any of the layouts `FeatureEmbedding` accepts
and returns the flat int64 ids to look up, in order, with the function that turns their vectors
``[n, dim]`` into the activation::

    ids                          flat ids                  activation
    [batch] dense                the ids                   [batch, dim]: each id's vector
    [batch, ..., n] dense        every id                  [batch, ..., dim]: each row of n combined
    [batch, None] ragged         values                    [batch, dim]: each row combined
    [batch, n] sparse            values                    [batch, dim]: each row's entries combined
    sequence_length L > 0        each row's first L ids    [batch, L, dim]: their vectors, zero-padded

Weights come in the ids' layout (a dense tensor of their shape, a ragged one with their row
splits, a sparse one with their indices) and weigh each id's vector before combining
(`sok_tutorial.embedding.combiners`); for one id a sample, as Keras-RS has it, only ``"sum"``
applies the weight (``"mean"`` and ``"sqrtn"`` of one weighted vector are the vector). Float ids
are cast to integers, as ``keras.layers.Embedding`` (and so Keras-RS) casts them: Keras traces a
model's first call under a strategy with float inputs.

Example:
    >>> ids = tf.ragged.constant([[3, 7], [], [7]], dtype=tf.int64)
    >>> flat, finish = prepare("feature 'f'", ids, None, "mean", 2, 0)
    >>> flat.numpy().tolist()
    [3, 7, 7]
    >>> finish(tf.constant([[1.0, 0.0], [3.0, 2.0], [3.0, 2.0]])).numpy().tolist()
    [[2.0, 1.0], [0.0, 0.0], [3.0, 2.0]]
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from sok_tutorial.embedding.combiners import combine, combine_dense, flat_weights

Finish = Callable[[tf.Tensor], tf.Tensor]  # the feature's vectors [n, dim] -> its activation


def _kind(x: Any) -> str:
    return "ragged" if isinstance(x, tf.RaggedTensor) else "sparse" if isinstance(x, tf.SparseTensor) else "dense"


def prepare(where: str, ids: Any, weights: Any, combiner: str, dim: int,
            sequence_length: int = 0) -> tuple[tf.Tensor, Finish]:
    """(the flat int64 ids of one feature, what turns their vectors into its activation).

    Args:
        where: the feature, as errors name it.
        ids: integer ids, dense, ``tf.RaggedTensor`` ``[batch, None]`` or ``tf.SparseTensor`` ``[batch, n]``.
        weights: float weights in the layout of `ids`, or None.
        combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"``.
        dim: the table's width.
        sequence_length: > 0 for the uncombined sequence of each row's first ids.
    """
    dtype = getattr(ids, "dtype", None)
    if dtype is None or not (tf.as_dtype(dtype).is_integer or tf.as_dtype(dtype).is_floating):
        raise TypeError(f"{where}: ids must be integers, got {dtype}")
    if weights is not None:
        if sequence_length:
            raise ValueError(f"{where}: a sequence feature (sequence_length={sequence_length}) takes no weights")
        if _kind(weights) != _kind(ids):
            raise TypeError(f"{where}: weights must be {_kind(ids)} like the ids, got {type(weights).__name__}")
    if sequence_length:
        return _sequence(where, ids, sequence_length, dim)
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.shape.rank != 2:
            raise ValueError(f"{where}: ragged ids must be [batch, None], got shape {ids.shape} "
                             f"(ragged_rank {ids.ragged_rank})")
        return _bags(where, ids, weights, ids.values, ids.value_rowids(), ids.nrows(), combiner)
    if isinstance(ids, tf.SparseTensor):
        if ids.shape.rank != 2:
            raise ValueError(f"{where}: sparse ids must be [batch, n], got rank {ids.shape.rank}")
        return _bags(where, ids, weights, ids.values, ids.indices[:, 0], ids.dense_shape[0], combiner)
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank is None or ids.shape.rank < 1:
        raise ValueError(f"{where}: dense ids must be [batch] or [batch, ..., n], got shape {ids.shape}")
    if weights is not None:
        weights = tf.convert_to_tensor(weights)
        if not weights.dtype.is_floating:
            raise TypeError(f"{where}: weights must be float, got {weights.dtype.name}")
        if not weights.shape.is_compatible_with(ids.shape):
            raise ValueError(f"{where}: weights of shape {weights.shape} do not match the ids' {ids.shape}")
    flat = tf.cast(tf.reshape(ids, [-1]), tf.int64)
    if ids.shape.rank == 1:  # one id a sample: nothing to combine
        if weights is None or combiner != "sum":
            return flat, lambda v: v
        return flat, lambda v: v * tf.cast(weights, v.dtype)[:, None]
    shape = tf.concat([tf.shape(ids), [dim]], 0)
    return flat, lambda v: combine_dense(tf.reshape(v, shape), combiner, weights, axis=ids.shape.rank - 1)


def _bags(where: str, ids: Any, weights: Any, values: tf.Tensor, segments: tf.Tensor, num_bags: tf.Tensor,
          combiner: str) -> tuple[tf.Tensor, Finish]:
    w = None if weights is None else flat_weights(ids, weights, name=f"{where}: weights")
    segments, num_bags = tf.cast(segments, tf.int64), tf.cast(num_bags, tf.int64)
    return tf.cast(values, tf.int64), lambda v: combine(v, segments, num_bags, combiner, w)


def _sequence(where: str, ids: Any, length: int, dim: int) -> tuple[tf.Tensor, Finish]:
    """The first `length` ids of each row, their vectors zero-padded to ``[batch, length, dim]``."""
    if isinstance(ids, tf.SparseTensor):
        if ids.shape.rank != 2:
            raise ValueError(f"{where}: sparse ids must be [batch, n], got rank {ids.shape.rank}")
        ids = tf.RaggedTensor.from_sparse(tf.sparse.reorder(ids))
    elif not isinstance(ids, tf.RaggedTensor):
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank not in (1, 2):
            raise ValueError(f"{where}: dense ids of a sequence feature must be [batch] or [batch, n], got {ids.shape}")
        ids = tf.RaggedTensor.from_tensor(ids[:, None] if ids.shape.rank == 1 else ids)
    if ids.ragged_rank != 1 or ids.shape.rank != 2:
        raise ValueError(f"{where}: ragged ids must be [batch, None], got shape {ids.shape}")
    ids = ids[:, :length]
    splits = ids.row_splits
    return (tf.cast(ids.values, tf.int64),
            lambda v: tf.RaggedTensor.from_row_splits(v, splits, validate=False).to_tensor(shape=[None, length, dim]))
