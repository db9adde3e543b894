"""An embedding per categorical or multi-hot feature, the continuous features beside them, an MLP
and one logit: the model of the training overview (HugeCTR's MovieLens example, in Keras)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import DistributedEmbedding


@keras.saving.register_keras_serializable(package="sok_tutorial")
class EmbeddingMLP(keras.Model):
    """Embeddings + MLP -> logit.

    Args:
        cardinalities: ``{feature: rows}`` for every categorical and multi-hot feature.
        dims: vector width, one for all features or ``{feature: width}``.
        multi_hot: features that arrive as lists (``tf.RaggedTensor [batch, None]``), reduced
            with `combiner`; the others arrive as ids ``[batch]``.
        max_nnz: longest list of a multi-hot feature.
        cont_names: continuous features ``[batch]`` concatenated after the embeddings.
        hidden: widths of the ReLU layers.
        use_hashtable: dynamic vocabularies (raw keys) instead of ids in ``[0, rows)``.
        l2: weight of an L2 penalty on the vectors a batch looks up (their squared norms summed
            over the features, averaged over the batch), added to the model's ``losses``. It
            reaches only the rows a step touched, each in proportion to how often the batch uses
            it, so a sparse optimizer stays sparse (a ``keras.regularizers.L2`` on a table would
            touch every row at every step).
        dropout: rate of the dropout after each ReLU layer while training.

    Example:
        >>> model = EmbeddingMLP({"user": 10, "genres": 5}, dims=4, multi_hot=["genres"], hidden=[8])
        >>> batch = {"user": tf.constant([1, 2]), "genres": tf.ragged.constant([[1, 3], []], dtype=tf.int64)}
        >>> model(batch).shape
        TensorShape([2, 1])
    """

    def __init__(self, cardinalities: Mapping[str, int], *, dims: int | Mapping[str, int] = 16,
                 multi_hot: Sequence[str] = (), max_nnz: int = 64, combiner: str = "mean",
                 cont_names: Sequence[str] = (), hidden: Sequence[int] = (128, 128), use_hashtable: bool = False,
                 l2: float = 0.0, dropout: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.cardinalities = {k: checks.positive_int(f"cardinalities[{k!r}]", v) for k, v in cardinalities.items()}
        self.dims = {k: (dims[k] if isinstance(dims, Mapping) else dims) for k in self.cardinalities}
        self.multi_hot = checks.known_names("multi_hot", multi_hot, list(self.cardinalities))
        self.max_nnz, self.combiner, self.cont_names = max_nnz, combiner, list(cont_names)
        self.hidden, self.use_hashtable = [int(h) for h in hidden], bool(use_hashtable)
        self.l2 = checks.fraction("l2", l2, low=0.0, high=float("inf"))
        self.dropout = checks.fraction("dropout", dropout, low=0.0, high=0.99)
        self.embeddings = {
            name: DistributedEmbedding(combiner if name in self.multi_hot else "sum", rows, self.dims[name], slot_num=1,
                                       max_nnz=max_nnz if name in self.multi_hot else 1,
                                       use_hashtable=use_hashtable, name=f"embedding_{name}")
            for name, rows in self.cardinalities.items()}
        self.mlp = [keras.layers.Dense(h, activation="relu", name=f"dense_{i}") for i, h in enumerate(self.hidden)]
        self.drop = keras.layers.Dropout(self.dropout, name="dropout") if self.dropout else None
        self.logit = keras.layers.Dense(1, name="logit")

    def call(self, features: Mapping[str, Any], training: Any = None) -> tf.Tensor:
        parts = []
        for name, layer in self.embeddings.items():
            keys = features[name]
            if name in self.multi_hot:
                keys = tf.RaggedTensor.from_uniform_row_length(keys, 1)  # (B, 1, None)
            else:
                keys = tf.reshape(keys, [-1, 1])  # (B, 1)
            parts.append(tf.reshape(layer(keys, training=training), [-1, self.dims[name]]))  # (B, D)
        if self.l2:
            squares = tf.add_n([tf.reduce_sum(tf.square(tf.cast(v, tf.float32)), axis=1) for v in parts])
            self.add_loss(self.l2 * tf.reduce_mean(squares))
        parts += [tf.reshape(tf.cast(features[n], self.compute_dtype), [-1, 1]) for n in self.cont_names]
        x = tf.concat(parts, axis=1)
        for layer in self.mlp:
            x = layer(x)
            if self.drop is not None:
                x = self.drop(x, training=training)
        return self.logit(x)  # (B, 1)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "cardinalities": self.cardinalities, "dims": self.dims,
                "multi_hot": self.multi_hot, "max_nnz": self.max_nnz, "combiner": self.combiner,
                "cont_names": self.cont_names, "hidden": self.hidden, "use_hashtable": self.use_hashtable,
                "l2": self.l2, "dropout": self.dropout}
