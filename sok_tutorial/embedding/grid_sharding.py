"""Row x column ("grid") tables: each replica holds the rows of its row group, and of those only
its slice of the width.

``sharding="row_column"`` (TorchRec's row-wise x column-wise) arranges the N replicas as a grid
of R row groups x C column groups, ``N = R * C`` (`grid_shape`; ``column_shards=C``, by default
the squarest grid with ``C <= R``). Replica ``r`` is in row group ``i = r // C`` and column group
``j = r % C``: it holds the keys ``k`` with ``k mod R == i`` (a static table: row ``k // R``) and
of them the columns ``column_slices(dim, C)[j]``, padded to the widest slice. 4 replicas as
2 x 2, a table of width 6::

    replica    0          1          2          3
    keys       k mod 2=0  k mod 2=0  k mod 2=1  k mod 2=1
    columns    0 1 2      3 4 5      0 1 2      3 4 5

A lookup inside ``strategy.run``, K keys per replica::

    keys     all_gather over replicas        every replica sees the N*K keys of the global batch
    slice    its row group's keys, C*K       deduplicated; new keys get rows and their columns
                                             of the key-seeded vectors
    vectors  all_gather of the slices        [N, C*K, ceil(d/C)]; each key's C slices -> its
                                             vector (the owners of a position are known from
                                             the keys: no positions travel)
             or all_reduce                   [N*K, d], each replica's keys and columns filled
    backward all_gather of output grads      [N*K, d]; each replica keeps its keys' columns

The C replicas of a row group insert the same keys in the same order, so their key indexes are
equal; the R groups' indexes are disjoint. Gradients are `tf.IndexedSlices` already summed over
replicas, applied to each replica's own slice with no all-reduce, and optimizer slots follow the
slice (`ColumnShardedTable`). ``column_shards=N`` is the column-wise layout (``"column"``) and
``column_shards=1`` the row-wise one (``"row"``): the same numbers, with this exchange.
A per-row slot that mixes columns (`RowWiseAdagrad`'s accumulator) is refused, as column-wise.

`export` and `restore` speak the one-device layout (full-width rows by key), so checkpoints
move between one device and row-wise, column-wise and grid tables of any replica count.

Example:
    >>> from sok_tutorial.embedding.layouts import column_slices, grid_shape
    >>> groups, columns = grid_shape(4, 6)  # the default grid of 4 replicas
    >>> [(r // columns, column_slices(6, columns)[r % columns]) for r in range(4)]  # (row group, width)
    [(0, 3), (0, 3), (1, 3), (1, 3)]
    >>> import sok_tutorial as sok
    >>> layer = sok.DistributedEmbedding("sum", 100, 6, slot_num=1, max_nnz=1, sharding="row_column",
    ...                                  column_shards=2)
    >>> layer.build()  # under one replica (no strategy), a table like any other
    >>> type(layer.table).__name__, layer.get_config()["column_shards"]
    ('EmbeddingTable', 2)
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding.column_sharding import ColumnShardedTable
from sok_tutorial.embedding.ops import all_gather


@keras.saving.register_keras_serializable(package="sok_tutorial")
class GridShardedTable(ColumnShardedTable):
    """A `ShardedTable` split by rows and by columns: replica ``r`` holds the keys of row group
    ``r // C`` (key mod R), width ``column_slices(dim, C)[r % C]`` (module docstring).

    Args:
        capacity: rows per replica (``max_vocabulary_size_per_gpu``): a row group holds that
            many keys; a static table's row ids are ``[0, capacity * R)``.
        dim: width of the whole table; at least `column_shards`.
        column_shards: column groups C, a divisor of the number of replicas; None: `grid_shape`'s
            default (the squarest grid with ``C <= R``).
        exchange: ``"all_gather"`` of the slices (default) or ``"all_reduce"`` of ``[N*K, dim]``.
        dynamic, initializer: as for `EmbeddingTable`.
    """

    SHARDINGS = ("row_column",)

    def __init__(self, capacity: int, dim: int, *, column_shards: int | None = None, **kwargs: Any):
        super().__init__(capacity, dim, **kwargs)
        self.column_shards = None if column_shards is None else checks.positive_int("column_shards", column_shards)

    def _replica_lookup(self, context: Any, keys: tf.Tensor, slots: Any, insert: bool) -> tf.Tensor:
        if int(context.num_replicas_in_sync) != self.num_shards:
            raise RuntimeError(f"{self.name}: built for {self.num_shards} replicas, called under a strategy "
                               f"of {context.num_replicas_in_sync}")
        groups, columns = self.grid
        me = context.replica_id_in_sync_group
        counts = context.all_gather(tf.shape(keys, out_type=tf.int64)[:1], 0)  # (N,)
        total = tf.reduce_sum(counts)
        ours = tf.reduce_sum(counts[:me]) + tf.range(counts[me])  # this replica's keys in the global batch
        every = all_gather(context, keys, counts)  # (N*K,)
        owner = self.group_of(every)  # row group of every key
        mine = tf.where(tf.equal(owner, tf.cast(me // columns, tf.int64)))[:, 0]  # (M,) our row group's keys
        part = self._owned_vectors(tf.gather(every, mine), None, insert)  # (M, width)
        if self.exchange == "all_gather":
            # replica r = (i, j) sends the slice j of row group i's keys in batch order; replicas
            # come in order, so slice j of position p is entry C * start[i] + j * sizes[i] + rank[p]
            sizes = tf.math.bincount(tf.cast(owner, tf.int32), minlength=groups, maxlength=groups, dtype=tf.int64)
            start = tf.cumsum(sizes, exclusive=True)  # (R,)
            rank = tf.math.invert_permutation(tf.argsort(owner, stable=True))  # (N*K,) place in group order
            group = tf.gather(owner, ours)
            first = tf.gather(start, group)
            entry = columns * first + tf.cast(tf.gather(rank, ours), tf.int64) - first  # (K,) of slice 0
            size = tf.gather(sizes, group)

        @tf.custom_gradient
        def exchange(part: tf.Tensor) -> tuple[tf.Tensor, Any]:
            if self.exchange == "all_gather":
                slices = all_gather(context, part, tf.repeat(sizes, columns))  # (C*N*K, width)
                out = tf.concat([tf.gather(slices, entry + j * size)[:, :w] for j, w in enumerate(self.widths)],
                                1)  # (K, dim)
            else:
                spread = tf.gather(tf.pad(part, [[0, 0], [0, 1]]), tf.gather(tf.constant(self._place), me), axis=1)
                full = tf.scatter_nd(mine[:, None], spread, tf.stack([total, self.dim]))
                out = tf.gather(context.all_reduce("sum", full), ours)  # (K, dim)

            def grad(upstream: Any) -> tf.Tensor:
                grads = all_gather(context, tf.convert_to_tensor(upstream), counts)  # (N*K, dim)
                return self._columns_tf(tf.gather(grads, mine), me)
            return out, grad

        return exchange(part)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "column_shards": self.column_shards}
