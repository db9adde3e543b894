"""DLRM (Naumov et al., 2019) in Keras 3.

The bottom MLP turns the continuous features into one vector of the embedding width; every
categorical feature looks up a vector; the interaction takes the dot product of every pair of
these vectors; the top MLP maps the dot products and the bottom vector to one logit::

    continuous [B, 13] --log1p--> bottom MLP --> d [B, D]
    categorical [B, 26] --------> embeddings --> e [B, 26, D]
    T = [d; e] [B, 27, D];  Z = T T^T;  keep the 27 * 26 / 2 = 351 pairs below the diagonal
    [d, pairs] [B, D + 351] --(zero-padded to a multiple of 16)--> top MLP --> logit [B, 1]

Mixed-precision matrix units work on tiles whose dimensions are multiples of 8 or 16; padding
the interaction (``pad_interaction_to=16``: 351 pairs + 16 -> 367 becomes 352 + 16 = 368) gives
the top MLP's first matmul such a width.

References:
    M. Naumov et al., "Deep Learning Recommendation Model for Personalization and
    Recommendation Systems", arXiv:1906.00091 (2019).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import DistributedEmbedding


def _pair_indices(f: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions ``i * f + j`` of the pairs ``j < i``, and for each of the ``f * f`` positions
    of the Gram matrix the pair it holds plus one (both triangles; 0 on the diagonal)."""
    rows, cols = np.tril_indices(f, k=-1)
    pair = np.arange(1, len(rows) + 1)
    inverse = np.zeros(f * f, np.int64)
    inverse[rows * f + cols], inverse[cols * f + rows] = pair, pair
    return rows * f + cols, inverse


def pairwise_interaction(vectors: tf.Tensor, pad_to: int | None = None) -> tf.Tensor:
    """Dot products of every pair of the ``F`` vectors in ``[B, F, D]``, ``[B, F * (F - 1) / 2]``,
    zero-padded on the right to a multiple of `pad_to`.

    The pairs are the lower triangle of the Gram matrix ``T T^T``, picked out with one gather of
    whole columns of its transpose (a gather of single elements along the second axis is about
    twice as slow on CPU). The gradient is written out: the Gram matrix is symmetric, so
    ``dT = G T`` with ``G`` the pairs' gradients scattered into both triangles: one batched
    matmul instead of autodiff's two, and a gather instead of a segment sum.

    Example:
        >>> v = tf.constant([[[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]]])
        >>> pairwise_interaction(v).numpy().tolist()  # pairs (1,0), (2,0), (2,1)
        [[2.0, 0.0, 3.0]]
        >>> pairwise_interaction(v, pad_to=4).shape
        TensorShape([1, 4])
    """
    f = vectors.shape[1]
    if f is None:
        raise ValueError("pairwise_interaction: the number of vectors (axis 1) must be known statically")
    lower, inverse = _pair_indices(f)

    @tf.custom_gradient
    def pairs_of(t: tf.Tensor) -> tuple[tf.Tensor, Any]:
        gram = tf.reshape(tf.matmul(t, t, transpose_b=True), [-1, f * f])  # (B, F*F)
        pairs = tf.transpose(tf.gather(tf.transpose(gram), lower))  # (B, F(F-1)/2)

        def grad(g: tf.Tensor) -> tf.Tensor:
            both = tf.gather(tf.pad(tf.transpose(g), [[1, 0], [0, 0]]), inverse)  # (F*F, B), symmetric
            return tf.matmul(tf.reshape(tf.transpose(both), [-1, f, f]), t)

        return pairs, grad

    pairs = pairs_of(vectors)
    if pad_to:
        pad = (-len(lower)) % pad_to
        if pad:
            pairs = tf.pad(pairs, [[0, 0], [0, pad]])
    return pairs


def continuous_input(features: Any, cont_names: Sequence[str], dtype: Any) -> tf.Tensor:
    """``log(1 + max(x, 0))`` of the continuous features, ``[B, C]``: from ``features["continuous"]``
    (the loaders' ``concat_continuous``) or stacked from ``features[name]`` for `cont_names`.
    Count-like features have heavy tails; the log tames them before the bottom MLP."""
    if "continuous" in features:
        dense = tf.cast(features["continuous"], dtype)
    else:
        dense = tf.stack([tf.cast(features[n], dtype) for n in cont_names], axis=1)
    return tf.math.log1p(tf.maximum(dense, 0))


def mlps(bottom: Sequence[int], embedding_dim: int, top: Sequence[int]) -> tuple[list[Any], list[Any], Any]:
    """DLRM's layers around the interaction: the bottom MLP (ending at `embedding_dim`), the top
    MLP and the float32 logit (float32 even under mixed precision)."""
    bottom_layers = [keras.layers.Dense(int(w), activation="relu", name=f"bottom_{i}")
                     for i, w in enumerate([*bottom, embedding_dim])]
    top_layers = [keras.layers.Dense(int(w), activation="relu", name=f"top_{i}") for i, w in enumerate(top)]
    return bottom_layers, top_layers, keras.layers.Dense(1, name="logit", dtype="float32")


def apply_layers(layers: Sequence[Any], x: tf.Tensor) -> tf.Tensor:
    """`x` through `layers`, in order."""
    for layer in layers:
        x = layer(x)
    return x


@keras.saving.register_keras_serializable(package="sok_tutorial")
class DLRM(keras.Model):
    """DLRM over batches of ``{name: [B]}`` features, or of ``{"categorical": [B, 26],
    "continuous": [B, 13]}`` (the loaders' ``concat_categorical`` / ``concat_continuous``
    layout, columns in the order of `cat_names` / `cont_names`).

    Args:
        cardinalities: rows of each categorical feature's table (its hash buckets), in order.
        cat_names, cont_names: feature names, in the order of `cardinalities` for the categorical ones.
        embedding_dim: width of every embedding (and of the bottom MLP's output).
        bottom_mlp, top_mlp: hidden widths (the last bottom layer is `embedding_dim` wide).
        embedding: ``"sok"`` (one `DistributedEmbedding` over all features, a table of
            ``sum(cardinalities)`` rows, sparse updates) or ``"keras"`` (one
            ``keras.layers.Embedding`` per feature, dense updates).
        pad_interaction_to: pad the interaction's width to a multiple of this (None: no padding).
    """

    def __init__(self, cardinalities: Sequence[int], cat_names: Sequence[str], cont_names: Sequence[str], *,
                 embedding_dim: int = 16, bottom_mlp: Sequence[int] = (64,), top_mlp: Sequence[int] = (128, 64),
                 embedding: str = "sok", pad_interaction_to: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.cardinalities = [checks.positive_int(f"cardinalities[{i}]", c) for i, c in enumerate(cardinalities)]
        self.cat_names, self.cont_names = list(cat_names), list(cont_names)
        if len(self.cat_names) != len(self.cardinalities):
            raise ValueError(f"{len(self.cat_names)} cat_names but {len(self.cardinalities)} cardinalities")
        self.embedding_dim = checks.positive_int("embedding_dim", embedding_dim)
        self.bottom_widths, self.top_widths = [int(w) for w in bottom_mlp], [int(w) for w in top_mlp]
        self.embedding_kind = checks.one_of("embedding", embedding, ("sok", "keras"))
        self.pad_interaction_to = None if pad_interaction_to is None else checks.positive_int(
            "pad_interaction_to", pad_interaction_to)
        self.bottom, self.top, self.logit = mlps(self.bottom_widths, embedding_dim, self.top_widths)
        if self.embedding_kind == "sok":
            self.offsets = np.concatenate([[0], np.cumsum(self.cardinalities)[:-1]]).astype(np.int64)
            self.embedding = DistributedEmbedding("sum", int(sum(self.cardinalities)), embedding_dim,
                                                  slot_num=len(self.cat_names), max_nnz=1, use_hashtable=False,
                                                  name="embedding")
        else:
            self.embeddings = [keras.layers.Embedding(c, embedding_dim, name=f"embedding_{n}")
                               for n, c in zip(self.cat_names, self.cardinalities)]

    def call(self, features: dict[str, Any], training: Any = None) -> tf.Tensor:
        with tf.name_scope("inputs"):
            x = continuous_input(features, self.cont_names, self.compute_dtype)
            if "categorical" in features:  # concat_categorical
                keys = tf.cast(features["categorical"], tf.int64)
            else:
                keys = tf.stack([tf.cast(features[n], tf.int64) for n in self.cat_names], axis=1)  # (B, F)
        x = apply_layers(self.bottom, x)  # (B, D)
        if self.embedding_kind == "sok":
            vectors = self.embedding(keys + self.offsets, training=training)  # one table: (B, F, D)
        else:
            vectors = tf.stack([emb(keys[:, i]) for i, emb in enumerate(self.embeddings)], axis=1)
        with tf.name_scope("interaction"):
            vectors = tf.cast(vectors, x.dtype)
            pairs = pairwise_interaction(tf.concat([x[:, None, :], vectors], axis=1), self.pad_interaction_to)
            y = tf.concat([x, pairs], axis=1)
        return self.logit(apply_layers(self.top, y))  # (B, 1), float32 even under mixed precision

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "cardinalities": self.cardinalities, "cat_names": self.cat_names,
                "cont_names": self.cont_names, "embedding_dim": self.embedding_dim, "bottom_mlp": self.bottom_widths,
                "top_mlp": self.top_widths, "embedding": self.embedding_kind,
                "pad_interaction_to": self.pad_interaction_to}
