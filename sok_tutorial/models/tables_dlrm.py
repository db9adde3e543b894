"""DLRM over embedding layers made by the caller, one per categorical feature.

`sok_tutorial.models.DLRM` makes its own tables. `TablesDLRM` is the same model (bottom MLP,
pairwise dot products, top MLP; `sok_tutorial.models.dlrm.pairwise_interaction`) around tables
that are made elsewhere, one layer per feature, each of any kind the library has: a
`DistributedEmbedding` placed by the planner (``**plan(...)[name].layer_kwargs()``), the same
with 16-bit rows (``storage_dtype="bfloat16"``), a `QREmbedding`, a `MixedDimensionEmbedding`.
So one model compares the ways of fitting tables in memory, and the tables' placement, storage
and composition are chosen where they are built, not in the model::

    continuous [B, C] --log1p--> bottom MLP --> d [B, D]
    feature f [B] --remap[f] (optional)--> tables[f] --> e_f [B, D]   (one layer per feature)
    [d; e_1 .. e_F] [B, F + 1, D] --pairwise_interaction--> [d, pairs] --> top MLP --> logit [B, 1]

A `remap` turns a feature's ids into the keys its layer expects, in the model (so a served
model takes the same ids): a `MixedDimensionEmbedding` takes ids ranked by frequency, the
``inverse`` of `sok_tutorial.embedding.frequency_blocks`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sok_tutorial.models.dlrm import (
    apply_layers,
    check_slice,
    continuous_input,
    interaction_and_top,
    mlps,
    resolve_slice,
)


class TablesDLRM(keras.Model):
    """DLRM over ``{name: [B]}`` categorical ids and the continuous features, either as
    ``"continuous"`` ``[B, C]`` (the loaders' ``concat_continuous``) or as ``{name: [B]}`` for
    each of `cont_names`.

    Args:
        tables: ``{feature: layer}``: a single-slot embedding layer per categorical feature (it
            maps keys ``[B, 1]`` to ``[B, 1, D]`` or ``[B, D]``), all of one width ``D``
            (``embedding_vec_size``), which is also the bottom MLP's output width.
        cont_names: the continuous features' names, for batches that give them one by one.
        bottom_mlp, top_mlp: hidden widths, as in `DLRM`.
        remap: ``{feature: int array}``: look up ``remap[feature][id]`` instead of ``id``.
        interaction_slice: examples per slice of the batch for the interaction and top MLP, as
            in `DLRM`.

    Example:
        >>> from sok_tutorial.embedding import DistributedEmbedding, QREmbedding
        >>> tables = {"site": DistributedEmbedding("sum", 50, 4, slot_num=1, max_nnz=1, use_hashtable=False),
        ...           "user": QREmbedding("sum", 1000, 4, num_collisions=8)}
        >>> model = TablesDLRM(tables, bottom_mlp=[8], top_mlp=[8])
        >>> batch = {"site": tf.constant([3, 7]), "user": tf.constant([999, 0]), "continuous": tf.ones([2, 3])}
        >>> model(batch).shape
        TensorShape([2, 1])
    """

    def __init__(self, tables: Mapping[str, Any], *, cont_names: Sequence[str] = (),
                 bottom_mlp: Sequence[int] = (64,), top_mlp: Sequence[int] = (128, 64),
                 remap: Mapping[str, Any] | None = None, interaction_slice: Any = "auto", **kwargs: Any):
        super().__init__(**kwargs)
        if not isinstance(tables, Mapping) or not tables:
            raise ValueError(f"tables={tables!r} is invalid: expected a non-empty {{feature: embedding layer}}")
        widths = {name: getattr(layer, "embedding_vec_size", None) for name, layer in tables.items()}
        if len(set(widths.values())) != 1 or None in widths.values():
            raise ValueError(f"tables: every layer must have one embedding_vec_size, the interaction's width; "
                             f"got {widths}")
        remap = dict(remap or {})
        unknown = sorted(set(remap) - set(tables))
        if unknown:
            raise ValueError(f"remap: {unknown} are not among the tables' features {sorted(tables)}")
        self.tables, self.cont_names = dict(tables), list(cont_names)
        self.embedding_dim = int(next(iter(widths.values())))
        self.remap = {name: tf.constant(np.asarray(ids, np.int64)) for name, ids in remap.items()}
        self.bottom, self.top, self.logit = mlps(bottom_mlp, self.embedding_dim, top_mlp)
        self.interaction_slice = check_slice(interaction_slice)

    def build(self, input_shape: Any = None) -> None:
        """Builds the tables for real (a sharded table writes its initial rows on its replicas,
        which Keras' symbolic trace of an unbuilt model cannot do) and the MLPs from the widths."""
        for table in self.tables.values():
            if not table.built:
                table.build()
        shape = input_shape.get("continuous") if isinstance(input_shape, Mapping) else None
        width = int(shape[-1]) if shape is not None else len(self.cont_names)
        for layer in self.bottom:
            layer.build((None, width))
            width = layer.units
        vectors = len(self.tables) + 1
        width += vectors * (vectors - 1) // 2
        for layer in self.top:
            layer.build((None, width))
            width = layer.units
        self.logit.build((None, width))
        self.built = True

    def call(self, features: Mapping[str, Any], training: Any = None) -> tf.Tensor:
        x = apply_layers(self.bottom, continuous_input(features, self.cont_names, self.compute_dtype))  # (B, D)
        vectors = [x]
        for name, table in self.tables.items():
            keys = tf.reshape(tf.cast(features[name], tf.int64), [-1, 1])  # (B, 1)
            if name in self.remap:
                keys = tf.gather(self.remap[name], keys)
            vectors.append(tf.cast(tf.reshape(table(keys, training=training), [-1, self.embedding_dim]), x.dtype))
        return interaction_and_top(x, tf.stack(vectors[1:], axis=1), self.top, self.logit,  # (B, 1)
                                   slice_size=resolve_slice(self.interaction_slice, x))
