"""Wide & deep (Cheng et al., 2016) in Keras 3, with the layout of HugeCTR's continuous-training
example: a 1-wide table summed over every categorical key (the wide, linear part) and a deep
part whose 16-wide vectors, beside the continuous features, go through an MLP with dropout::

    categorical [B, F] ------------> wide table (dim 1), summed over F --------> w [B, 1]
    categorical[:, :F_deep] -------> deep table (dim D) --> [B, F_deep * D] --+
    continuous [B, C] -----------------------------------------------------------+
        --> Dense(1024, relu), Dropout(0.5) --> Dense(1024, relu), Dropout(0.5) --> Dense(1) --> d [B, 1]
    logit = w + d

Both tables index one key space (``id + key_offset`` of each column, or the rows that an
`EmbeddingTrainingCache` assigns to a file's keyset), so crossed features can feed the wide part
only: put them after the ``deep_slots`` columns that feed both.

References:
    H.-T. Cheng et al., "Wide & Deep Learning for Recommender Systems", DLRS 2016, arXiv:1606.07792.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import DistributedEmbedding


@keras.saving.register_keras_serializable(package="sok_tutorial")
class WideAndDeep(keras.Model):
    """Wide & deep over ``{"categorical": int64 [B, wide_slots], "continuous": float32 [B, C]}``
    (the loaders' ``concat_categorical`` / ``concat_continuous`` layout); returns logits ``[B, 1]``.

    Args:
        rows: rows of each table (``use_hashtable=False``: keys are rows in ``[0, rows)``).
        wide_slots: categorical columns per sample; all feed the wide table.
        deep_slots: the first this many columns also feed the deep table (default: all).
        embedding_dim: width of the deep vectors.
        hidden: widths of the deep MLP's ReLU layers, each followed by dropout.
        dropout: dropout rate after each hidden layer (training only).

    Example:
        >>> model = WideAndDeep(rows=100, wide_slots=3, deep_slots=2, embedding_dim=4, hidden=[8])
        >>> batch = {"categorical": tf.constant([[1, 5, 99], [2, 2, 0]], tf.int64), "continuous": tf.ones([2, 13])}
        >>> model(batch).shape, [layer.name for layer in (model.wide, model.deep)]
        (TensorShape([2, 1]), ['wide', 'deep'])
    """

    def __init__(self, rows: int, wide_slots: int, deep_slots: int | None = None, *, embedding_dim: int = 16,
                 hidden: Sequence[int] = (1024, 1024), dropout: float = 0.5, **kwargs: Any):
        super().__init__(**kwargs)
        self.rows = checks.positive_int("rows", rows)
        self.wide_slots = checks.positive_int("wide_slots", wide_slots)
        self.deep_slots = self.wide_slots if deep_slots is None else checks.positive_int("deep_slots", deep_slots)
        if self.deep_slots > self.wide_slots:
            raise ValueError(f"deep_slots={self.deep_slots} is more than wide_slots={self.wide_slots}: the deep "
                             "columns are the first deep_slots of the categorical input")
        self.embedding_dim = checks.positive_int("embedding_dim", embedding_dim)
        self.hidden = [checks.positive_int(f"hidden[{i}]", h) for i, h in enumerate(hidden)]
        self.dropout = checks.fraction("dropout", dropout, low=0.0, high=0.99)
        self.wide = DistributedEmbedding("sum", self.rows, 1, slot_num=self.wide_slots, max_nnz=1,
                                         use_hashtable=False, name="wide")
        self.deep = DistributedEmbedding("sum", self.rows, self.embedding_dim, slot_num=self.deep_slots, max_nnz=1,
                                         use_hashtable=False, name="deep")
        self.mlp = [keras.layers.Dense(h, activation="relu", name=f"fc_{i}") for i, h in enumerate(self.hidden)]
        # Named seed generators rather than Dropout layers: every instance gets the same variable
        # paths (Keras numbers unnamed ones per process), so saves keyed by path load into a new one.
        self.dropout_seeds = [keras.random.SeedGenerator(name=f"dropout_{i}") for i in range(len(self.hidden))]
        self.logit = keras.layers.Dense(1, name="logit", dtype="float32")

    def call(self, features: dict[str, Any], training: Any = None) -> tf.Tensor:
        keys = tf.cast(features["categorical"], tf.int64)  # (B, F)
        wide = tf.reduce_sum(self.wide(keys, training=training), axis=1)  # (B, 1)
        deep = tf.reshape(self.deep(keys[:, :self.deep_slots], training=training),
                          [-1, self.deep_slots * self.embedding_dim])  # (B, F_deep * D)
        x = tf.concat([deep, tf.cast(features["continuous"], deep.dtype)], axis=1)
        for dense, seed in zip(self.mlp, self.dropout_seeds):
            x = dense(x)
            if training and self.dropout:
                x = keras.random.dropout(x, self.dropout, seed=seed)
        return self.logit(x) + tf.cast(wide, tf.float32)  # (B, 1)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rows": self.rows, "wide_slots": self.wide_slots,
                "deep_slots": self.deep_slots, "embedding_dim": self.embedding_dim, "hidden": self.hidden,
                "dropout": self.dropout}
