"""Model-parallel tables: each replica stores a shard, keys travel to the shard that owns them.

Under a `tf.distribute` strategy with N replicas (``MirroredStrategy`` over GPUs or logical CPU
devices, ``MultiWorkerMirroredStrategy`` over processes), an embedding layer built with
``sharding="row"``, ``"table"``, ``"column"`` or ``"row_column"`` holds a `ShardedTable`: an
`EmbeddingTable` whose variables are mirrored but whose copies hold different rows (or different
columns of them), ``max_vocabulary_size_per_gpu`` rows per replica (SOK's meaning of the name),
so the replicas train one table together. Where rows and columns live is the table's layout
(`sok_tutorial.embedding.layouts`), one object the table composes:

* ``"row"`` (SOK "distributed"), ``Grid(N, N, 1)``: key ``k`` lives on replica ``k mod N``.
* ``"table"`` (SOK/HugeCTR "localized"), ``TableWise``: each slot of the layer is a table placed
  whole on one replica, slots balanced by size (`plan_table_wise`). Slots must use disjoint keys
  (as the loader's key offsets give): a key seen in two slots on two replicas would get two rows,
  where one device shares one.
* ``"column"`` (TorchRec CW), ``Grid(N, 1, N)``: every replica holds every row but only its slice
  of the width, ``column_slices(dim, N)``.
* ``"row_column"`` (TorchRec's RW x CW), ``Grid(N, R, C)``: R row groups x C column groups
  (`grid_shape`).
* ``"replicated"`` (the default): a full copy on every replica, gradients all-reduced; for
  small tables (a plain `EmbeddingTable`).

A lookup inside ``strategy.run`` is one exchange (`sok_tutorial.embedding.routing`): the keys of
the global batch are all-gathered, the replicas of each key's row group look up their slice of its
vector, and an all_gather of those slices brings every replica its vectors; the backward pass
all-gathers the output gradients, and each replica keeps those of its own rows and columns. A
new layout that routes keys this way (row groups, column groups, a key's group) is one module in
`sok_tutorial.embedding.layouts` and nothing else.

A sharded table may forget (``eviction_policy``, admission, ``track_changes``): each row group
holds its own lifecycle state (`sok_tutorial.embedding.lifecycle_state.LifecycleState`, one copy
of its mirrored variables per replica), and with an eviction policy a key belongs to the row group
of its bucket (`sok_tutorial.embedding.buckets.BucketedIndex.owner_of`) rather than ``k mod R``.
Every row group sees the keys it owns in the global batch's order and ticks its clock once a step,
so R groups of ``capacity`` rows keep, evict and admit exactly the keys one table of ``R *
capacity`` rows would; the C replicas of a group place the same keys, so their states stay
equal. A table-wise table forgets too, each replica's slots in buckets of their own, so it keeps
the keys one device would only while no bucket overflows; expiry and admission, decided per key,
match one device always. Export, deltas and checkpoints speak the one-device layout
(`sok_tutorial.embedding.sharded_rows`).

Bytes received per replica and step, K keys per replica of dim d (float32, int64 keys), ring
collectives (`placement.exchange_bytes` computes these from the layouts)::

    pattern                           ids                 vectors fwd        grads bwd
    row / table, all_gather           (N-1) K 8           (N-1) K d 4        (N-1) K d 4
    all_reduce of masked vectors      (N-1) K 8           2 (N-1) K d 4      (N-1) K d 4
    all-to-all (NCCL, as SOK)         (N-1)/N K 8         (N-1)/N K d 4      (N-1)/N K d 4
    column, all_gather                (N-1) K 8           (N-1) N K w 4      (N-1) K d 4
    row_column, all_gather            (N-1) K 8           (N-1) C K v 4      (N-1) K d 4
    replicated table                  0                   0                  (N-1) K (d 4 + 8)

(table-wise adds each key's slot id, 8 bytes; ``w = ceil(d / N)``, ``v = ceil(d / C)``, so a grid
moves what row-wise does plus the padding of unequal slices.) Memory per replica: ``ceil(V / R)``
rows of ``ceil(d / C)`` columns plus optimizer slots of the same shape; a dynamic table's key
index is kept by the C replicas of a row group (column-wise, by every replica). TensorFlow's
replica context offers all_gather and all_reduce, on every device type and across processes,
but no all-to-all; an all-to-all would move N times less and needs NCCL communicators that
``tf.distribute`` does not expose. Between the two, ``exchange="all_gather"`` moves fewer bytes
for any d > 2, the choice for real interconnects (``benchmarks/model_parallel.py`` times both).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import layouts
from sok_tutorial.embedding.dedup import distinct
from sok_tutorial.embedding.initializers import KeyedInitializer, keyed_initial_values_tf
from sok_tutorial.embedding.lifecycle_state import LifecycleState
from sok_tutorial.embedding.ops import in_shape_trace, inserting, local_components, masked, vectors_of
from sok_tutorial.embedding.placement import EXCHANGES
from sok_tutorial.embedding.precision import compute_dtype
from sok_tutorial.embedding.routing import ColumnSlices, global_lookup, replica_lookup
from sok_tutorial.embedding.sharded_rows import ShardedRows
from sok_tutorial.embedding.table import EmbeddingTable
from sok_tutorial.embedding.unique_keys import as_keys


def _local_replica_ids(strategy: Any, count: int) -> list[int]:
    """Global replica ids of this process's `count` local replicas."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task = int(getattr(resolver, "task_id", 0) or 0) if resolver is not None else 0
    return [task * count + i for i in range(count)]


@keras.saving.register_keras_serializable(package="sok_tutorial")
class ShardedTable(ShardedRows, EmbeddingTable):
    """One table over the N replicas of the strategy it is built under, `capacity` rows on each,
    laid out as `sharding` says (module docstring); ``table.layout`` is its layout object.

    Args:
        sharding: ``"row"``, ``"table"``, ``"column"`` or ``"row_column"``.
        exchange: ``"all_gather"`` (default) or ``"all_reduce"`` of the looked-up vectors.
        slot_num, slot_sizes: the slots of the layer (table-wise placement).
        column_shards: the column groups C of ``"row_column"`` (None: `grid_shape`'s default).
        capacity, dim, dynamic, initializer, ...: as for `EmbeddingTable`; `capacity` is per
            replica, `dim` the width of the whole table.

    Example:
        >>> strategy = tf.distribute.MirroredStrategy(["/cpu:0"])  # one replica: a grid of 1 x 1
        >>> with strategy.scope():
        ...     table = ShardedTable(100, 4, sharding="row", name="items")
        ...     table.build()
        >>> table.layout, table.total_rows
        (Grid(1, 1, 1), 100)
        >>> strategy.run(lambda: table.lookup(tf.constant([7, 2**40]), training=True)).shape
        TensorShape([2, 4])
        >>> sorted(table.export()["keys"].tolist())
        [7, 1099511627776]
    """

    def __init__(self, capacity: int, dim: int, *, sharding: str = "row", exchange: str = "all_gather",
                 slot_num: int = 1, slot_sizes: Sequence[int] | None = None, column_shards: int | None = None,
                 **kwargs: Any):
        super().__init__(capacity, dim, **kwargs)
        self.sharding = checks.one_of("sharding", sharding, tuple(n for n in layouts.LAYOUTS if n != "replicated"))
        self.exchange = checks.one_of("exchange", exchange, EXCHANGES)
        self.slot_num = checks.positive_int("slot_num", slot_num)
        self.slot_sizes = None if slot_sizes is None else [int(s) for s in slot_sizes]
        self.column_shards = None if column_shards is None else checks.positive_int("column_shards", column_shards)
        if self.column_shards is not None and sharding != "row_column":
            raise ValueError(f"{self.name}: column_shards={column_shards} sets the grid of sharding='row_column'; "
                             f"got sharding={sharding!r}")
        if self.slot_sizes is not None and len(self.slot_sizes) != self.slot_num:
            raise ValueError(f"{self.name}: slot_sizes has {len(self.slot_sizes)} entries, slot_num={self.slot_num}")
        self.layout: Any = None

    @property
    def indexed(self) -> bool:
        return self.dynamic or (self.layout is not None and self.layout.always_indexed())

    @property
    def total_rows(self) -> int:
        """Rows of the whole table: ``capacity`` per row group (a static table's row ids)."""
        return self.capacity * self.layout.rows

    @property
    def column_groups(self) -> int:
        return self.layout.columns

    @property
    def needs_slots(self) -> bool:
        """Whether a lookup must say each key's layer slot (table-wise: the slot picks the replica)."""
        return self.layout.needs_slots

    def _initializer(self) -> KeyedInitializer:
        return KeyedInitializer(self.init.kind, self.init.a, self.init.b, self.init.seed, dynamic=True)

    def build(self, input_shape: Any = None) -> None:
        if self.built:
            return
        strategy = tf.distribute.get_strategy()
        self.strategy, self.num_shards = strategy, int(strategy.num_replicas_in_sync)
        try:
            self.layout = layouts.layout_of(self.sharding, self.num_shards, dim=self.dim,
                                            column_shards=self.column_shards,
                                            slot_sizes=self.slot_sizes or [1] * self.slot_num)
            self.slices = ColumnSlices(self.dim, self.layout.widths(self.dim), self.num_shards)
            refusal = self.layout.overfills(self.capacity)
        except ValueError as exc:
            raise ValueError(f"{self.name}: {exc}") from None
        if refusal:
            raise ValueError(f"{self.name}: {refusal}")
        if self.lifecycle.active:  # one state per row group (its C replicas hold equal copies)
            self.state = LifecycleState(self.name, self.lifecycle, self.capacity, shards=self.layout.bucket_shards)
        if self.needs_slots:  # each row records its slot, so a checkpoint can place it again
            self.row_slots = self.add_weight(name="row_slots", shape=(self.capacity,), dtype="int64",
                                             trainable=False, initializer=keras.initializers.Constant(-1))
        dim, self.dim = self.dim, self.slices.width  # the variable holds one slice
        try:
            EmbeddingTable.build(self, input_shape)
        finally:
            self.dim = dim
        self.local_shards = _local_replica_ids(strategy, len(local_components(self.variable)))
        if not self.indexed:  # static rows: row j of replica r is key j * R + r // C
            rows = np.arange(self.capacity, dtype=np.int64)
            for shard, component in zip(self.local_shards, local_components(self.variable)):
                values = self.slices.slice(self.initial_values(rows * self.layout.rows + self.group(shard)), shard)
                component.assign(tf.cast(values, component.dtype))

    def group(self, replica: int) -> int:
        """The row group of a replica."""
        return replica // self.layout.columns

    def group_of(self, keys: tf.Tensor, slots: tf.Tensor | None = None) -> tf.Tensor:
        """The row group holding each key (`slots`: each key's slot, table-wise), as the layout
        says; with an eviction policy, from the key's bucket."""
        return self.layout.group_of(keys, slots, self.buckets if self.lifecycle.evicts else None)

    def group_of_np(self, keys: np.ndarray, slots: np.ndarray | None = None) -> np.ndarray:
        """NumPy twin of `group_of`."""
        return self.layout.group_of_np(keys, slots, self.buckets if self.lifecycle.evicts else None)

    # ------------------------------------------------------------------ lookups
    def lookup(self, keys: Any, training: Any = None, slots: Any = None) -> tf.Tensor:
        """Vectors of this replica's `keys` (`slots`: the slot of each key, for table-wise placement).
        (A `UniqueKeys` is expanded back: each replica deduplicates its share after routing.)"""
        keys = self._keys(as_keys(keys))
        if not self.built:
            self.build()
        if in_shape_trace(self.variable):
            return tf.zeros(tf.concat([tf.shape(keys), [self.dim]], 0), compute_dtype(self.variable.dtype))
        self._mark_variables()
        flat = tf.reshape(keys, [-1])
        if not self.dynamic:
            flat = self._check_range(flat, self.total_rows)
        if not self.needs_slots:
            slots = None
        elif slots is None and self.slot_num > 1:
            raise ValueError(f"{self.name}: the {self.slot_num} slots are placed table-wise, so each key's slot "
                             "decides its replica; pass the slot of every key")
        else:
            slots = tf.zeros_like(flat) if slots is None else tf.cast(tf.reshape(slots, [-1]), tf.int64)
        insert = inserting(training)
        context = tf.distribute.get_replica_context()
        if context is None or not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            out = global_lookup(self, flat, slots, insert)
        else:
            out = replica_lookup(self, context, flat, slots, insert)
        return tf.reshape(out, tf.concat([tf.shape(keys), [self.dim]], 0))

    def owned_vectors(self, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool,
                      component: int | None = None) -> tf.Tensor:
        """This replica's slices of the vectors of `keys` (with repeats) of its row group (`component`:
        a local replica, outside ``strategy.run``): deduplicated, looked up, repeated."""
        unique, position = distinct(keys)
        unique_slots = None if slots is None else tf.math.unsorted_segment_max(
            slots, position, tf.size(unique))  # a key's slots agree (slots use disjoint keys)
        counts = tf.math.bincount(position, minlength=tf.size(unique), dtype=tf.int64) \
            if insert and self.lifecycle.counts else None
        rows, found = self._owned_rows(unique, unique_slots, insert, component, counts)
        variable = self.variable.value if component is None else local_components(self.variable)[component]
        return vectors_of(variable, rows, found, position)

    def _owned_rows(self, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool, component: int | None,
                    counts: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor | None]:
        """Rows of distinct `keys` in this replica (`counts`: their occurrences, LFU and admission)."""
        if not self.indexed:
            rows = tf.math.floordiv(keys, self.layout.rows)
            if insert and self.lifecycle.track_changes:
                return self.rows(rows, insert, component)  # (row ids: checked and marked)
            return rows, None
        rows, found = self.rows(keys, insert, component, counts=counts)
        if insert and self.needs_slots:  # each row records its slot (rows a key may have just taken)
            placed = rows >= 0
            row_slots = self.row_slots.value if component is None else local_components(self.row_slots)[component]
            with tf.control_dependencies([row_slots.scatter_update(tf.IndexedSlices(
                    masked(slots, placed), masked(rows, placed)))]):
                rows = tf.identity(rows)
        return rows, found

    def _initial_vectors(self, keys: tf.Tensor, component: int | None) -> tf.Tensor:
        values = keyed_initial_values_tf(keys, self.dim, self.init)
        if self.slices.whole:
            return values
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group if component is None \
            else self.local_shards[component]
        return self.slices.of(values, replica)

    # ------------------------------------------------------------------ state
    def group_components(self) -> list[int]:
        """The local replicas (components) that speak for their row group: the first of its C."""
        return [c for c, shard in enumerate(self.local_shards) if shard % self.layout.columns == 0]

    def shard_states(self) -> list[Any]:
        return [self.state.local(c) for c in self.group_components()]

    @property
    def size(self) -> int:
        components = self.group_components()
        if not self.indexed:
            return self.capacity * len(components)
        if self.lifecycle.evicts:
            return sum(len(self.state.local(c).live()[0]) for c in components)
        return sum(int(self.index_variables(c).size.numpy()) for c in components)

    def save_own_variables(self, store: Any) -> None:
        raise NotImplementedError(f"{self.name}: save a sharded table with sok_tutorial.training.save_checkpoint "
                                  "(it writes every shard and restores onto any number of replicas)")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "sharding": self.sharding, "exchange": self.exchange,
                "slot_num": self.slot_num, "slot_sizes": self.slot_sizes, "column_shards": self.column_shards}
