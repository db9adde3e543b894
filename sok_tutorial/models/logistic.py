"""Logistic regression on one-hot ids: the baseline a click model has to beat, trained by the same
loader, optimizer and loop as the model beside it."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import DistributedEmbedding


@keras.saving.register_keras_serializable(package="sok_tutorial")
class LogisticRegression(keras.Model):
    """A weight per id of every categorical feature, summed, plus a weight per continuous feature
    and a bias -> logit.

    That is logistic regression on the one-hot encoding of each feature (a multi-hot feature
    contributes the weight of each entry of its list), stored as embedding tables one wide, so
    it trains sparsely on tables of any size like the models it is a baseline for.

    Args:
        cardinalities: ``{feature: rows}``, each feature arriving as ids ``[batch]`` in
            ``[0, rows)`` (or lists, for `multi_hot`); or a list of table sizes, the features
            arriving together as ``features["categorical"]`` int ``[batch, F]`` (the loaders'
            ``concat_categorical`` layout), column ``i`` in ``[0, cardinalities[i])``.
        multi_hot: features that arrive as lists (``tf.RaggedTensor [batch, None]``); the
            weights of a list's entries are summed.
        max_nnz: longest list of a multi-hot feature.
        cont_names: continuous features ``[batch]`` (per-feature layout), each with a weight.
        num_continuous: width of ``features["continuous"]`` (the loaders' ``concat_continuous``
            layout), each column with a weight.
        log_continuous: take ``log(1 + max(x, 0))`` of the continuous features first, as `DLRM`
            does with Criteo's counts.
        l2: weight of an L2 penalty on the weights a batch looks up (their squares summed over
            the features, averaged over the batch), in the model's ``losses``.

    Example:
        >>> model = LogisticRegression({"user": 10, "genres": 5}, multi_hot=["genres"])
        >>> batch = {"user": tf.constant([1, 2]), "genres": tf.ragged.constant([[1, 3], []], dtype=tf.int64)}
        >>> model(batch).shape
        TensorShape([2, 1])
        >>> model = LogisticRegression([4, 3], num_continuous=2, log_continuous=True)
        >>> model({"categorical": tf.constant([[0, 2], [3, 1]]), "continuous": tf.ones([2, 2])}).shape
        TensorShape([2, 1])
    """

    def __init__(self, cardinalities: Mapping[str, int] | Sequence[int], *, multi_hot: Sequence[str] = (),
                 max_nnz: int = 64, cont_names: Sequence[str] = (), num_continuous: int = 0,
                 log_continuous: bool = False, l2: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.concat = not isinstance(cardinalities, Mapping)
        names = [f"categorical[{i}]" for i in range(len(cardinalities))] if self.concat else list(cardinalities)
        sizes = list(cardinalities) if self.concat else list(cardinalities.values())
        if not sizes:
            raise ValueError("cardinalities is empty: expected at least one categorical feature")
        self.cardinalities = ([checks.positive_int(f"cardinalities[{i}]", int(c)) for i, c in enumerate(sizes)]
                              if self.concat else {n: checks.positive_int(f"cardinalities[{n!r}]", c)
                                                   for n, c in zip(names, sizes)})
        if self.concat and multi_hot:
            raise ValueError(f"multi_hot={list(multi_hot)}: the concatenated layout has one id per feature")
        self.multi_hot = [] if self.concat else checks.known_names("multi_hot", multi_hot, names)
        self.max_nnz = checks.positive_int("max_nnz", max_nnz)
        self.l2 = checks.fraction("l2", l2, low=0.0, high=float("inf"))
        self.cont_names, self.log_continuous = list(cont_names), bool(log_continuous)
        self.num_continuous = checks.positive_int("num_continuous", num_continuous, allow_zero=True)
        if self.cont_names and self.num_continuous:
            raise ValueError(f"cont_names={self.cont_names} and num_continuous={num_continuous}: give one layout")
        width = len(self.cont_names) or self.num_continuous
        self.dense = (keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="continuous")
                      if width else None)
        if self.concat:
            self.offsets = np.concatenate([[0], np.cumsum(self.cardinalities)[:-1]]).astype(np.int64)
            self.weights_table = DistributedEmbedding("sum", int(sum(self.cardinalities)), 1,
                                                      slot_num=len(self.cardinalities), max_nnz=1,
                                                      use_hashtable=False, name="weights")
        else:
            self.tables = {n: DistributedEmbedding("sum", rows, 1, slot_num=1,
                                                   max_nnz=max_nnz if n in self.multi_hot else 1,
                                                   use_hashtable=False, name=f"weights_{n}")
                           for n, rows in self.cardinalities.items()}
        self.bias = self.add_weight(shape=(1,), initializer="zeros", name="bias")

    def call(self, features: Mapping[str, Any], training: Any = None) -> tf.Tensor:
        if self.concat:
            keys = tf.cast(features["categorical"], tf.int64) + self.offsets  # (B, F)
            weights = tf.reshape(self.weights_table(keys, training=training), [-1, len(self.cardinalities)])
        else:
            parts = []
            for name, table in self.tables.items():
                keys = features[name]
                keys = (tf.RaggedTensor.from_uniform_row_length(keys, 1) if name in self.multi_hot
                        else tf.reshape(keys, [-1, 1]))
                parts.append(tf.reshape(table(keys, training=training), [-1, 1]))
            weights = tf.concat(parts, axis=1)  # (B, F)
        if self.l2:
            self.add_loss(self.l2 * tf.reduce_mean(tf.reduce_sum(tf.square(weights), axis=1)))
        logit = tf.reduce_sum(weights, axis=1, keepdims=True) + self.bias  # (B, 1)
        if self.dense is not None:
            x = (tf.cast(features["continuous"], tf.float32) if self.num_continuous
                 else tf.stack([tf.cast(features[n], tf.float32) for n in self.cont_names], axis=1))
            logit += self.dense(tf.math.log1p(tf.maximum(x, 0.0)) if self.log_continuous else x)
        return logit

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "cardinalities": self.cardinalities, "multi_hot": self.multi_hot,
                "max_nnz": self.max_nnz, "cont_names": self.cont_names,
                "num_continuous": self.num_continuous, "log_continuous": self.log_continuous, "l2": self.l2}
