"""The TensorFlow math of embedding lookups: a gather plus a segment reduction.

Keys of a batch arrive ragged (``[batch, slot, None]``) or sparse; they are flattened to one key
per entry with the index of the bag (``batch * slot_num + slot``) it belongs to::

    keys    (ragged)   [[[3, 7], []], [[7]]]          2 rows, 2 slots
    flat keys          [3, 7, 7]
    segment ids        [0, 0, 2]                       bag 1 (row 0, slot 1) is empty
    output  (sum)      [[e3 + e7, 0], [e7, 0]]         [batch, slot, dim]

The gather's gradient is a ``tf.IndexedSlices`` over the rows used, so sparse optimizers update
only those rows.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding.combiners import COMBINERS, combine, flat_weights, scale, weigh
from sok_tutorial.embedding.ops import counts_at_most
from sok_tutorial.embedding.sharding import ShardedTable
from sok_tutorial.embedding.table import EmbeddingTable

__all__ = ["COMBINERS", "combine", "flatten_bags", "group_embedding_lookup_sparse"]


def flatten_bags(keys: Any, slot_num: int, *, max_nnz: int | None,
                 layer: str) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(flat keys [n], bag ids [n], number of bags = batch * slot_num) of ragged/sparse keys.

    Accepts a ``tf.RaggedTensor`` ``[batch, slot_num, None]``, a ``tf.SparseTensor`` of dense
    shape ``[batch, slot_num, max_nnz]``, or SOK's 2-D layout ``[batch * slot_num, max_nnz]``.
    Bags longer than `max_nnz` are an error.
    """
    if isinstance(keys, tf.RaggedTensor):
        if keys.ragged_rank != 2 and not (keys.ragged_rank == 1 and keys.shape.rank == 3):
            raise ValueError(f"{layer}: ragged keys must be [batch, slot_num={slot_num}, None], "
                             f"got ragged_rank={keys.ragged_rank}, shape={keys.shape}")
        if keys.ragged_rank == 1:  # [batch, (slots), nnz] with a fixed nnz: make the inner lists ragged
            keys = keys.with_values(tf.RaggedTensor.from_tensor(keys.values))
        slots = keys.row_lengths()
        tf.debugging.Assert(tf.reduce_all(tf.equal(slots, tf.cast(slot_num, slots.dtype))),
                            [f"{layer}: every row needs slot_num={slot_num} slots"])
        bags = keys.values
        lengths, flat = bags.row_lengths(), bags.values
        segments, num_bags = bags.value_rowids(), bags.nrows()
    elif isinstance(keys, tf.SparseTensor):
        if keys.shape.rank not in (2, 3):
            raise ValueError(f"{layer}: sparse keys must have dense shape [batch, slot_num, max_nnz] or "
                             f"[batch * slot_num, max_nnz], got rank {keys.shape.rank}")
        index = keys.indices
        if keys.shape.rank == 3:
            segments = index[:, 0] * slot_num + index[:, 1]
            num_bags = keys.dense_shape[0] * slot_num
        else:
            segments, num_bags = index[:, 0], keys.dense_shape[0]
            tf.debugging.Assert(tf.equal(num_bags % slot_num, tf.constant(0, num_bags.dtype)),
                                [f"{layer}: sparse keys of shape [batch * slot_num, max_nnz] need a first "
                                 f"dimension divisible by slot_num={slot_num}"])
        flat = keys.values
        lengths = tf.math.bincount(tf.cast(segments, tf.int32), minlength=tf.cast(num_bags, tf.int32),
                                   dtype=tf.int64)
    else:
        raise TypeError(f"{layer}: keys must be a tf.RaggedTensor [batch, slot_num, None] or a tf.SparseTensor, "
                        f"got {type(keys).__name__}; dense [batch, slot, nnz] keys go to All2AllDenseEmbedding")
    # (the checks carry strings only: plain Assert ops, where tf.debugging.assert_equal and the like wrap
    # theirs in a tf.cond, two branch functions per check in every step's graph, to print int64 values)
    if max_nnz is not None:
        counts_at_most(lengths, max_nnz, f"{layer}: a slot holds more keys than max_nnz={max_nnz}")
    return flat, tf.cast(segments, tf.int64), tf.cast(num_bags, tf.int64)


def _ids(ids: Any, name: str) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor | None]:
    """(values, row of each value, rows, slot of each value or None) of a ``[batch, None]``
    SparseTensor or RaggedTensor, or of a ``[batch, slot, None]`` RaggedTensor (slots kept)."""
    if isinstance(ids, tf.SparseTensor):
        return ids.values, ids.indices[:, 0], ids.dense_shape[0], None
    if isinstance(ids, tf.RaggedTensor):
        if ids.shape.rank == 3:
            if ids.ragged_rank == 1:  # [batch, (slots), nnz] with a fixed nnz
                ids = ids.with_values(tf.RaggedTensor.from_tensor(ids.values))
            bag = ids.values.value_rowids()  # inner list (batch, slot) of each value
            sample = tf.gather(ids.value_rowids(), bag)
            return ids.flat_values, sample, ids.nrows(), bag - tf.gather(ids.row_splits, sample)
        return ids.flat_values, ids.value_rowids(), ids.nrows(), None
    raise TypeError(f"{name} must be a tf.SparseTensor or tf.RaggedTensor [batch, None] (or [batch, slot, None]), "
                    f"got {type(ids).__name__}")


def _lookup(param: Any, keys: tf.Tensor, slots: tf.Tensor | None, name: str) -> tf.Tensor:
    """Rows of a tensor or variable, or vectors of keys through an `EmbeddingTable` or the table of a
    SOK layer (`slots`: each key's slot)."""
    if isinstance(getattr(param, "table", None), EmbeddingTable) or isinstance(param, EmbeddingTable):
        if not param.built:  # (under a strategy, build layers in its scope before strategy.run)
            param.build()
        table = getattr(param, "table", param)
        if isinstance(table, ShardedTable) and table.needs_slots:
            if slots is None and table.slot_num > 1:
                raise ValueError(f"{name}: layer {table.name!r} places its {table.slot_num} slots table-wise, so "
                                 f"each key's slot decides its replica; pass its keys as a tf.RaggedTensor "
                                 f"[batch, slot_num={table.slot_num}, None]")
            return table.lookup(keys, slots=tf.zeros_like(keys) if slots is None else tf.cast(slots, tf.int64))
        return table.lookup(keys)
    return tf.gather(param, keys)


def group_embedding_lookup_sparse(params: Sequence[Any], sp_ids: Sequence[Any], combiners: Sequence[str],
                                  partition_strategy: str = "mod", sp_weights: Any = None, name: str | None = None,
                                  fused: bool = False) -> list[tf.Tensor]:
    """DeepRec's grouped lookup: ``[combine(params[i][sp_ids[i]]) for i]`` in one call.

    Args:
        params: embedding tables ``[rows_i, dim_i]`` (tf or Keras variables, or tensors), or
            `EmbeddingTable` objects or SOK embedding layers, whose keys go through the table: its
            index, and its shards when it is sharded over replicas (call this inside
            ``strategy.run`` then).
        sp_ids: row ids per table, ``tf.SparseTensor`` or ``tf.RaggedTensor`` ``[batch, None]``. A
            ``tf.RaggedTensor`` ``[batch, slot, None]`` keeps each key's slot, which a SOK layer
            with several slots placed table-wise needs (each slot lives on its own replica); all
            of a sample's keys still form one bag.
        combiners: ``"sum"``, ``"mean"`` or ``"sqrtn"`` per table (`sok_tutorial.embedding.combiners`).
        sp_weights: None, or a list aligned with `sp_ids` whose entries are None or float weights
            shaped like those ids (a ``tf.SparseTensor`` with the same indices, a ``tf.RaggedTensor``
            with the same row splits). Weighted combiners are ``tf.nn.embedding_lookup_sparse``'s:
            ``sum(w e)``, ``sum(w e) / sum(w)``, ``sum(w e) / sqrt(sum(w^2))``. (DeepRec takes no
            weights here.)
        fused: reduce all tables of the same width with one segment sum. Off by default: on CPU,
            one segment sum per table trains about twice as fast (26 tables of dim 16, batch 8192:
            ``benchmarks/embedding.py``, group_lookup_loop vs group_lookup_fused), the concatenation
            costing more than the ops it saves.

    Returns:
        A ``[batch, dim_i]`` tensor per table.

    Example:
        >>> table = tf.reshape(tf.range(6, dtype=tf.float32), [3, 2])
        >>> ids = tf.ragged.constant([[0, 2], [1]], dtype=tf.int64)
        >>> [t.numpy().tolist() for t in group_embedding_lookup_sparse([table], [ids], ["sum"])]
        [[[4.0, 6.0], [2.0, 3.0]]]
    """
    checks.one_of("partition_strategy", partition_strategy, ("mod",))
    if not (len(params) == len(sp_ids) == len(combiners)):
        raise ValueError(f"params, sp_ids and combiners differ in length: {len(params)}, {len(sp_ids)}, "
                         f"{len(combiners)}")
    if sp_weights is None:
        sp_weights = [None] * len(sp_ids)
    elif not isinstance(sp_weights, (list, tuple)) or len(sp_weights) != len(sp_ids):
        got = f"a {type(sp_weights).__name__}" + (f" of length {len(sp_weights)}" if isinstance(sp_weights, (
            list, tuple)) else "")
        raise ValueError(f"sp_weights is invalid: expected None or a list of {len(sp_ids)} entries aligned with "
                         f"sp_ids (each None or weights shaped like its ids), got {got}")
    for i, c in enumerate(combiners):
        checks.one_of(f"combiners[{i}]", c, COMBINERS)
    with tf.name_scope(name or "group_embedding_lookup_sparse"):
        parts = [_ids(ids, f"sp_ids[{i}]") for i, ids in enumerate(sp_ids)]
        weights = [None if w is None else flat_weights(ids, w, name=f"sp_weights[{i}]")
                   for i, (ids, w) in enumerate(zip(sp_ids, sp_weights))]
        vectors = [_lookup(p, tf.cast(v, tf.int64), slots, f"sp_ids[{i}]")
                   for i, (p, (v, _, _, slots)) in enumerate(zip(params, parts))]
        if not fused:
            return [combine(vec, seg, n, c, w)
                    for vec, (_, seg, n, _), c, w in zip(vectors, parts, combiners, weights)]
        out: list[tf.Tensor | None] = [None] * len(params)
        by_width: dict[int, list[int]] = {}
        for i, vec in enumerate(vectors):
            by_width.setdefault(int(vec.shape[-1]), []).append(i)
        for group in by_width.values():
            n = parts[group[0]][2]
            segments = tf.concat([parts[i][1] + k * n for k, i in enumerate(group)], 0)
            weighted = tf.concat([weigh(vectors[i], weights[i]) for i in group], 0)
            sums = tf.math.unsorted_segment_sum(weighted, segments, len(group) * n)
            sums = tf.reshape(sums, [len(group), n, -1])
            for k, i in enumerate(group):
                out[i] = scale(sums[k], parts[i][1], n, combiners[i], weights[i])
        return out
