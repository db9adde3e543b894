"""How a `ShardedTable` lookup routes keys to the replicas holding them and brings the vectors back,
for any layout that routes keys (`sok_tutorial.embedding.layouts.Layout`: R row groups of C
replicas, a key's row group from `group_of`, a slice of the width per replica of a group).

Inside ``strategy.run``, K keys per replica::

    keys     all_gather over replicas        every replica sees the N*K keys of the global batch
                                             (table-wise: with each key's slot id)
    owner    its row group's keys, C*K       deduplicated; new keys get rows and their columns
                                             of the key-seeded vectors
    vectors  all_gather of the slices        each replica sends its slice of its group's keys in
                                             batch order; every replica knows every key's group,
                                             so no positions travel
             or all_reduce                   [N*K, d], each replica's keys and columns filled
    backward all_gather of output grads      [N*K, d]; each replica keeps its keys' columns

so the gradient of a replica's variable is a ``tf.IndexedSlices`` over the rows it holds, already
summed over replicas: the sparse optimizers apply it to that replica's shard only (no
all-reduce). Row-wise is ``C = 1`` (each replica a group), column-wise ``R = 1`` (every replica
looks up every key, for its columns). Outside ``strategy.run`` (`global_lookup`) the table reads
the shards directly, which needs them all in this process.

`ColumnSlices` maps full-width rows to a replica's slice and back, in NumPy (export, restore, static
initial rows) and in TensorFlow (new rows' initial values, gradients).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.collectives import all_gather, all_gather_columns, gather_counts
from sok_tutorial.embedding.precision import compute_dtype


class ColumnSlices:
    """Column group ``r % C`` of replica ``r``: its slice of a table `dim` wide, ``widths[r % C]``
    columns padded to ``max(widths)`` (`width`)."""

    def __init__(self, dim: int, widths: list[int], num_replicas: int):
        self.dim, self.widths, self.width = dim, list(widths), max(widths)
        self.whole = len(self.widths) == 1  # one column group: every replica holds whole rows
        starts = np.concatenate([[0], np.cumsum(self.widths)[:-1]]).astype(int)
        # column j of replica r's slice is column take[r, j] of the table (`dim`: padding, zero),
        # and column c of the table is column place[r, c] of replica r's slice (`width`: not there)
        self.take = np.full((num_replicas, self.width), dim, np.int32)
        self.place = np.full((num_replicas, dim), self.width, np.int32)
        for r in range(num_replicas):
            s, w = starts[r % len(self.widths)], self.widths[r % len(self.widths)]
            self.take[r, :w] = np.arange(s, s + w)
            self.place[r, s:s + w] = np.arange(w)

    def slice(self, values: np.ndarray, replica: int, blocks: int = 1) -> np.ndarray:
        """Replica `replica`'s columns of one-device rows ``[n, blocks * dim + extra]`` (`blocks`
        slices of the width, then per-row columns kept whole), padded to its variable's layout."""
        if self.whole:
            return values
        dim = self.dim
        padded = np.concatenate([values[:, :blocks * dim], np.zeros((len(values), 1), values.dtype)], 1)
        take = self.take[replica]
        parts = [padded[:, np.where(take < dim, take + b * dim, blocks * dim)] for b in range(blocks)]
        return np.concatenate([*parts, values[:, blocks * dim:]], 1)

    def join(self, parts: list[np.ndarray], blocks: int = 1) -> np.ndarray:
        """One-device rows from the slices of a row group's replicas (`slice` undone)."""
        if self.whole:
            return parts[0]
        w = self.width
        cols = [p[:, b * w:b * w + width] for b in range(blocks) for p, width in zip(parts, self.widths)]
        return np.concatenate([*cols, parts[0][:, blocks * w:]], 1)

    def of(self, values: tf.Tensor, replica: Any) -> tf.Tensor:
        """Replica `replica`'s columns of ``[n, dim]`` vectors (a tensor or int), zero padded."""
        if self.whole:
            return values
        return tf.gather(tf.pad(values, [[0, 0], [0, 1]]), tf.gather(tf.constant(self.take), replica), axis=1)

    def spread(self, values: tf.Tensor, replica: Any) -> tf.Tensor:
        """Replica `replica`'s slices ``[n, width]`` placed in ``[n, dim]`` rows (zeros elsewhere)."""
        if self.whole:
            return values
        return tf.gather(tf.pad(values, [[0, 0], [0, 1]]), tf.gather(tf.constant(self.place), replica), axis=1)


def replica_lookup(table: Any, context: Any, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool) -> tf.Tensor:
    """Vectors ``[K, dim]`` of this replica's distinct-or-not `keys` (module docstring)."""
    if int(context.num_replicas_in_sync) != table.num_shards:
        raise RuntimeError(f"{table.name}: built for {table.num_shards} replicas, called under a strategy "
                           f"of {context.num_replicas_in_sync}")
    layout, columns = table.layout, table.slices
    groups = layout.rows
    me = context.replica_id_in_sync_group
    counts = gather_counts(context, tf.shape(keys, out_type=tf.int64)[:1])  # (N,)
    total = tf.reduce_sum(counts)
    ours = tf.reduce_sum(counts[:me]) + tf.range(counts[me])  # this replica's keys in the global batch
    every, every_slots = all_gather_columns(context, [keys, slots], counts)  # (N*K,): each key beside its slot
    if groups == 1:  # every replica looks up every key
        mine, owned, owned_slots = None, every, every_slots
    else:
        owner = table.group_of(every, every_slots)
        mine = tf.where(tf.equal(owner, tf.cast(me // layout.columns, tf.int64)))[:, 0]
        owned = tf.gather(every, mine)
        owned_slots = None if every_slots is None else tf.gather(every_slots, mine)
    part = table.owned_vectors(owned, owned_slots, insert)  # (M, width)
    if table.exchange == "all_gather":
        # replica r = (i, j) sends slice j of row group i's keys in batch order; replicas come in
        # order, so slice j of position p is entry C * start[i] + j * sizes[i] + rank[p]
        if groups == 1:
            sizes, entry, size = tf.reshape(total, [1]), ours, total
        else:
            # the keys of each group in batch order (a stable sort by group, in one pass), and where each lands
            parts = tf.dynamic_partition(tf.range(tf.size(owner)), tf.cast(owner, tf.int32), groups)
            sizes = tf.cast(tf.stack([tf.size(part) for part in parts]), tf.int64)
            start = tf.cumsum(sizes, exclusive=True)  # (R,)
            rank = tf.math.invert_permutation(tf.concat(parts, 0))  # (N*K,) place in group order
            group = tf.gather(owner, ours)
            first = tf.gather(start, group)
            entry = layout.columns * first + tf.cast(tf.gather(rank, ours), tf.int64) - first  # (K,) of slice 0
            size = tf.gather(sizes, group)

    @tf.custom_gradient
    def exchange(part: tf.Tensor) -> tuple[tf.Tensor, Any]:
        if table.exchange == "all_gather":
            slices = all_gather(context, part, tf.repeat(sizes, layout.columns))  # (C*N*K, width)
            if columns.whole:
                out = tf.gather(slices, entry)
            else:
                out = tf.concat([tf.gather(slices, entry + j * size)[:, :w] for j, w in enumerate(columns.widths)],
                                1)  # (K, dim)
        else:
            spread = columns.spread(part, me)
            full = spread if mine is None else tf.scatter_nd(mine[:, None], spread, tf.stack([total, table.dim]))
            out = tf.gather(context.all_reduce("sum", full), ours)  # (K, dim)

        def grad(upstream: Any) -> tf.Tensor:
            grads = all_gather(context, tf.convert_to_tensor(upstream), counts)  # (N*K, dim)
            return columns.of(grads if mine is None else tf.gather(grads, mine), me)
        return out, grad

    return exchange(part)


def global_lookup(table: Any, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool) -> tf.Tensor:
    """Outside ``strategy.run``: each key's vector from the replicas of its row group, read directly
    (all of them must be in this process)."""
    if len(table.local_shards) != table.num_shards:
        raise RuntimeError(f"{table.name}: this process holds {len(table.local_shards)} of {table.num_shards} "
                           "shards; call the layer inside strategy.run")
    groups, columns = table.layout.rows, table.layout.columns
    owner = table.group_of(keys, slots)
    out = tf.zeros([tf.size(keys), table.dim], compute_dtype(table.variable.dtype))
    for group in range(groups):  # components are replicas here: this process holds them all
        where = tf.where(tf.equal(owner, group))
        group_slots = None if slots is None else tf.gather_nd(slots, where)
        parts = [table.owned_vectors(tf.gather_nd(keys, where), group_slots, insert, group * columns + j)
                 for j in range(columns)]
        joined = tf.concat([p[:, :w] for p, w in zip(parts, table.slices.widths)], 1)
        out = tf.tensor_scatter_nd_update(out, where, joined)
    return out
