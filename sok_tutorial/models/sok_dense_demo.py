"""SOK's dense demo: an All2AllDenseEmbedding over ``[batch, slot_num, nnz_per_slot]`` keys,
flattened into a stack of ReLU layers and one output logit."""
from __future__ import annotations

from typing import Any

import keras

from sok_tutorial.embedding import All2AllDenseEmbedding


@keras.saving.register_keras_serializable(package="sok_tutorial")
class SOKDenseDemo(keras.Model):
    """The dense demo model of SOK's tutorials.

    Args:
        max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, nnz_per_slot, use_hashtable:
            as `All2AllDenseEmbedding`.
        num_dense_layers: ReLU layers after the embedding (6 in SOK's demo).
        dense_units: width of each (1024 in SOK's demo).

    Example:
        >>> import numpy as np
        >>> model = SOKDenseDemo(100, 4, slot_num=3, nnz_per_slot=2, num_dense_layers=2, dense_units=8)
        >>> model(np.arange(12).reshape(2, 3, 2)).shape
        TensorShape([2, 1])
    """

    def __init__(self, max_vocabulary_size_per_gpu: int, embedding_vec_size: int, slot_num: int, nnz_per_slot: int,
                 num_dense_layers: int = 6, dense_units: int = 1024, use_hashtable: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.config = dict(max_vocabulary_size_per_gpu=max_vocabulary_size_per_gpu,
                           embedding_vec_size=embedding_vec_size, slot_num=slot_num, nnz_per_slot=nnz_per_slot,
                           num_dense_layers=num_dense_layers, dense_units=dense_units, use_hashtable=use_hashtable)
        self.embedding = All2AllDenseEmbedding(max_vocabulary_size_per_gpu, embedding_vec_size, slot_num,
                                               nnz_per_slot, use_hashtable=use_hashtable, name="embedding")
        self.dense_layers = [keras.layers.Dense(dense_units, activation="relu", name=f"dense_{i}")
                             for i in range(num_dense_layers)]
        self.out = keras.layers.Dense(1, name="logit")
        self.flat_width = slot_num * nnz_per_slot * embedding_vec_size

    def call(self, inputs: Any, training: Any = None) -> Any:
        x = keras.ops.reshape(self.embedding(inputs, training=training), [-1, self.flat_width])  # (B, S*N*D)
        for layer in self.dense_layers:
            x = layer(x)
        return self.out(x)  # (B, 1) logits

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self.config}
