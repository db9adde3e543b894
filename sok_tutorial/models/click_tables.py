"""A click model over three tables sharded three ways: the model of notebook 06.

Each input of `data_gen.click_tables` has its own table, each placed the way that suits it::

    items   [B, 1, 3]  DistributedEmbedding, sum      row-wise:   key k on replica k mod N
    fields  [B, F, 1]  All2AllDenseEmbedding          table-wise: field f on one replica (planned)
    weekday [B, 1]     DistributedEmbedding, 7 rows   replicated: a copy on every replica
            -> concat [B, (F + 2) * D] -> Dense(hidden, relu) -> Dense(1): a logit

The tables' initial rows are a function of the key alone (`embedding_initializer` with a seed),
so the same model on 1 or N replicas starts from the same rows wherever they live.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import All2AllDenseEmbedding, DistributedEmbedding, plan_table_wise, rows_per_replica


class ClickTablesModel(keras.Model):
    """Three sharded tables and an MLP; SOK's layers with their SOK arguments.

    Args:
        item_vocabulary: keys of the row-wise ``items`` table.
        field_sizes: keys of each field; the fields are the slots of the table-wise ``fields``
            table, balanced over the replicas by `plan_table_wise`.
        embedding_dim: width of every table's vectors.
        num_replicas: replicas the tables are sharded over (default: those of the strategy in
            scope). Build the model in that strategy's scope.
        hidden: width of the ReLU layer.
        items_per_sample: keys of each sample's ``items`` history.
        seed: the tables' initializer and the MLP's.

    Call it on ``{"items": [B, 1, items_per_sample], "fields": [B, F, 1], "weekday": [B, 1]}``
    int64 keys; it returns logits ``[B, 1]``. `build()` (no argument) makes every table and
    layer, so optimizers can be built for its variables before the first step.

    Example:
        >>> from data_gen.click_tables import ClickSamples
        >>> model = ClickTablesModel(1000, [50, 20], embedding_dim=4, hidden=8)
        >>> model.build()
        >>> model(ClickSamples(1000, [50, 20]).batch(5)[0]).shape
        TensorShape([5, 1])
        >>> [layer.sharding for layer in model.tables]
        ['row', 'table', 'replicated']
    """

    def __init__(self, item_vocabulary: int, field_sizes: Sequence[int], embedding_dim: int = 16,
                 num_replicas: int | None = None, hidden: int = 64, items_per_sample: int = 3, seed: int = 0,
                 **kwargs: Any):
        super().__init__(name=kwargs.pop("name", "clicks"), **kwargs)
        n = num_replicas or tf.distribute.get_strategy().num_replicas_in_sync
        self.field_sizes = [checks.positive_int(f"field_sizes[{i}]", s) for i, s in enumerate(field_sizes)]
        self.embedding_dim = checks.positive_int("embedding_dim", embedding_dim)
        kw = {"embedding_initializer": keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)}
        self.items = DistributedEmbedding("sum", rows_per_replica(item_vocabulary, n), embedding_dim, slot_num=1,
                                          max_nnz=items_per_sample, sharding="row", name="items", **kw)
        self.fields = All2AllDenseEmbedding(max(plan_table_wise(self.field_sizes, n)[1]), embedding_dim,
                                            slot_num=len(self.field_sizes), nnz_per_slot=1, sharding="table",
                                            slot_sizes=self.field_sizes, name="fields", **kw)
        self.weekday = DistributedEmbedding("sum", 7, embedding_dim, slot_num=1, max_nnz=1, sharding="replicated",
                                            use_hashtable=False, name="weekday", **kw)
        self.mlp = keras.Sequential([keras.layers.Dense(hidden, activation="relu", name="hidden",
                                                        kernel_initializer=keras.initializers.GlorotUniform(seed)),
                                     keras.layers.Dense(1, name="logit",
                                                        kernel_initializer=keras.initializers.GlorotUniform(seed + 1))],
                                    name="mlp")

    @property
    def tables(self) -> tuple[Any, Any, Any]:
        """The embedding layers: ``(items, fields, weekday)``."""
        return self.items, self.fields, self.weekday

    def build(self, input_shape: Any = None) -> None:
        for layer in self.tables:
            layer.build()
        self.mlp.build((None, (len(self.field_sizes) + 2) * self.embedding_dim))
        self.built = True

    def call(self, x: dict[str, Any], training: bool | None = None) -> tf.Tensor:
        d = self.embedding_dim
        parts = [tf.reshape(self.items(x["items"], training=training), [-1, d]),  # (B, D)
                 tf.reshape(self.fields(x["fields"], training=training), [-1, len(self.field_sizes) * d]),  # (B, F*D)
                 tf.reshape(self.weekday(x["weekday"], training=training), [-1, d])]  # (B, D)
        return self.mlp(tf.concat(parts, 1), training=training)  # (B, 1) logits
