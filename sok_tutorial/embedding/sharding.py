"""Model-parallel tables: each replica stores a shard, keys travel to the shard that owns them.

Under a `tf.distribute` strategy with N replicas (``MirroredStrategy`` over GPUs or logical CPU
devices, ``MultiWorkerMirroredStrategy`` over processes), an embedding layer built with
``sharding="row"`` or ``sharding="table"`` holds a `ShardedTable`: an `EmbeddingTable` whose
variables are mirrored but whose copies hold different rows, ``max_vocabulary_size_per_gpu`` per
replica (SOK's meaning of the name), so the replicas train one table together:

* ``"row"`` (SOK "distributed"): key ``k`` lives on replica ``k mod N``; every table is spread
  over all replicas.
* ``"table"`` (SOK/HugeCTR "localized"): each slot of the layer is a table placed whole on one
  replica, slots balanced by size (`plan_table_wise`). Slots must use disjoint keys (as the
  loader's key offsets give): a key seen in two slots on two replicas would get two rows, where
  one device shares one.
* ``"column"`` (TorchRec CW): every replica holds every row but only its slice of the width,
  ``column_slices(dim, N)``; `sok_tutorial.embedding.column_sharding.ColumnShardedTable`.
* ``"row_column"`` (TorchRec's RW x CW): the replicas as a grid of R row groups x C column
  groups (`grid_shape`); replica ``r`` holds the keys ``k mod R == r // C`` and of them the
  slice ``r % C`` of the width; `sok_tutorial.embedding.grid_sharding.GridShardedTable`.
* ``"replicated"`` (the default): a full copy on every replica, gradients all-reduced; for
  small tables.

A lookup inside ``strategy.run`` is one exchange::

    keys     all_gather over replicas      every replica sees the N*K keys of the global batch
    owner    looks up the keys it owns      deduplicated; new keys get rows and key-seeded vectors
    vectors  all_gather of owned vectors    each replica keeps the K vectors of its own keys
    backward all_gather of output grads     each owner keeps the gradients of its own rows

so the gradient of a shard is a ``tf.IndexedSlices`` over the rows it owns, already summed over
replicas: the sparse optimizers apply it to that replica's shard only (no all-reduce).

A row-wise table may forget (``eviction_policy``, admission, ``track_changes``): each shard holds
its own lifecycle state (`sok_tutorial.embedding.lifecycle_state.LifecycleState`, one copy of
its mirrored variables per replica), and with an eviction policy a key belongs to the shard of
its bucket (`sok_tutorial.embedding.buckets.BucketedIndex.owner_of`) rather than ``k mod N``.
Every shard sees the keys it owns in the global batch's order and ticks its clock once a step, so
N shards of ``capacity`` rows keep, evict and admit exactly the keys one table of ``N *
capacity`` rows would. Column-wise and grid tables do the same per row group (the C replicas of
a group place the same keys, so their states stay equal). Export, deltas and checkpoints speak
the one-device layout (keys with their marks and counts), and a restore puts each key in its
shard's bucket. A table-wise table forgets too, each replica's slots in buckets of its own (a
key's replica is its slot's), so it keeps the keys one device would only while no bucket
overflows; expiry and admission, decided per key, match one device always.

Bytes received per replica and step, K keys per replica of dim d (float32, int64 keys), ring
collectives::

    pattern                           ids                 vectors fwd        grads bwd
    all_gather (exchange default)     (N-1) K (8 + 8)     (N-1) K d 4        (N-1) K d 4
    all_reduce of masked vectors      (N-1) K 8           2 (N-1) K d 4      (N-1) K d 4
    all-to-all (NCCL, as SOK)         (N-1)/N K 8         (N-1)/N K d 4      (N-1)/N K d 4
    column, all_gather                (N-1) K 8           (N-1) N K w 4      (N-1) K d 4
    column, all_reduce                (N-1) K 8           2 (N-1) K d 4      (N-1) K d 4
    row_column, all_gather            (N-1) K 8           (N-1) C K v 4      (N-1) K d 4
    row_column, all_reduce            (N-1) K 8           2 (N-1) K d 4      (N-1) K d 4
    replicated table                  0                   0                  (N-1) K (d 4 + 8)

(ids: keys, plus each owned key's position with row-wise all_gather; table-wise adds slot ids;
``w = ceil(d / N)``, so column-wise moves what row-wise does, without positions, plus the padding
of unequal slices; a grid of R x C, ``v = ceil(d / C)``, likewise.) Memory per replica:
row-wise ``ceil(V / N)`` rows of ``d``; column-wise all ``V`` rows of ``w`` columns, ``V w 4``
bytes plus optimizer slots of the same shape, and a dynamic table's key index is replicated
(every replica inserts the same keys in the same order); a grid ``ceil(V / R)`` rows of ``v``,
the key index replicated over the C replicas of a row group.
`placement.exchange_bytes` computes these. TensorFlow's replica context offers all_gather and
all_reduce, on every device type and across processes, but no all-to-all; an all-to-all would
move N times less and needs NCCL communicators that ``tf.distribute`` does not expose. Between
the two, ``exchange="all_gather"`` moves fewer bytes for any d > 2, the choice for real
interconnects, and it measured faster or equal too (``benchmarks/model_parallel.py``: 26 slots
x 20k keys, dim 16, global batch 4096; two runs on 2 logical CPU devices: 40-50 ms per step
against 49-61 ms for all_reduce; on 4: 62-68 against 63-101 ms; on tiny batches the all_reduce
variant's fewer ops can win).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding.initializers import KeyedInitializer
from sok_tutorial.embedding.layouts import layout_of
from sok_tutorial.embedding.lifecycle_state import LifecycleState
from sok_tutorial.embedding.ops import all_gather, in_shape_trace, inserting, local_components
from sok_tutorial.embedding.placement import EXCHANGES
from sok_tutorial.embedding.precision import compute_dtype
from sok_tutorial.embedding.table import EmbeddingTable


def _local_replica_ids(strategy: Any, count: int) -> list[int]:
    """Global replica ids of this process's `count` local replicas."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task = int(getattr(resolver, "task_id", 0) or 0) if resolver is not None else 0
    return [task * count + i for i in range(count)]


@keras.saving.register_keras_serializable(package="sok_tutorial")
class ShardedTable(EmbeddingTable):
    """One table over the N replicas of the strategy it is built under, `capacity` rows on each.

    Args:
        sharding: ``"row"`` (key ``k`` on replica ``k mod N``) or ``"table"`` (each of the
            `slot_num` slots whole on one replica, planned from `slot_sizes`).
        exchange: ``"all_gather"`` or ``"all_reduce"`` of the owned vectors (module docstring).
        slot_num, slot_sizes: the slots of the layer (table-wise placement).
        capacity, dim, dynamic, initializer: as for `EmbeddingTable`; `capacity` is per replica.

    Table-wise shards hold keys of chosen slots, so their rows are assigned by the index even
    for row-id keys, and each row records its slot, so a checkpoint can place it again.
    """

    SHARDINGS: tuple[str, ...] = ("row", "table")  # "column": `ColumnShardedTable`; "row_column": `GridShardedTable`

    def __init__(self, capacity: int, dim: int, *, sharding: str = "row", exchange: str = "all_gather",
                 slot_num: int = 1, slot_sizes: Sequence[int] | None = None, **kwargs: Any):
        super().__init__(capacity, dim, **kwargs)
        self.sharding = checks.one_of("sharding", sharding, self.SHARDINGS)
        self.exchange = checks.one_of("exchange", exchange, EXCHANGES)
        self.slot_num = checks.positive_int("slot_num", slot_num)
        self.slot_sizes = None if slot_sizes is None else [int(s) for s in slot_sizes]

    @property
    def indexed(self) -> bool:
        return self.dynamic or self.sharding == "table"

    @property
    def total_rows(self) -> int:
        """Rows of the whole table, over all replicas (a static table's row ids)."""
        return self.capacity * self.num_shards

    def _initializer(self) -> KeyedInitializer:
        return KeyedInitializer(self.init.kind, self.init.a, self.init.b, self.init.seed, dynamic=True)

    def build(self, input_shape: Any = None) -> None:
        if self.built:
            return
        strategy = tf.distribute.get_strategy()
        self.strategy, self.num_shards = strategy, int(strategy.num_replicas_in_sync)
        if self.lifecycle.active:  # a shard's state per replica; row-wise, a bucketed index routes keys by bucket
            shards = self.num_shards if self.sharding == "row" else 1  # table-wise: a slot's table is one shard
            self.state = LifecycleState(self.name, self.lifecycle, self.capacity, shards=shards)
        sizes = self.slot_sizes or [1] * self.slot_num
        if self.sharding == "table" and len(sizes) != self.slot_num:
            raise ValueError(f"{self.name}: slot_sizes has {len(sizes)} entries, slot_num={self.slot_num}")
        self.layout = layout_of(self.sharding, self.num_shards, dim=self.dim, slot_sizes=sizes)
        if self.sharding == "table":
            self.owners, load = self.layout.owners(sum(sizes))  # (sizes given: the rows are not read)
            if self.slot_sizes and max(load) > self.capacity:
                raise ValueError(f"{self.name}: table-wise placement puts {max(load):,} rows on one replica, "
                                 f"more than max_vocabulary_size_per_gpu={self.capacity:,}")
            self._row_slots = self.add_weight(name="row_slots", shape=(self.capacity,), dtype="int64",
                                              trainable=False, initializer=keras.initializers.Constant(-1))
        super().build(input_shape)
        self.local_shards = _local_replica_ids(strategy, len(local_components(self.variable)))
        if not self.indexed:  # static rows: row j of shard r is key j * N + r
            rows = np.arange(self.capacity, dtype=np.int64)
            for shard, component in zip(self.local_shards, local_components(self.variable)):
                component.assign(tf.cast(self.initial_values(rows * self.num_shards + shard), component.dtype))

    def owner_of(self, keys: tf.Tensor, slots: tf.Tensor | None) -> tf.Tensor:
        """The replica holding each key: row-wise ``key mod N``, or with an eviction policy the shard
        of the key's bucket (`sok_tutorial.embedding.buckets.BucketedIndex.owner_of`); table-wise
        the replica of its slot."""
        if self.sharding == "row":
            return self.layout.group_of(keys, self.buckets if self.lifecycle.evicts else None)
        return self.layout.owner_of(slots)

    def _owned_rows(self, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool, component: int | None = None,
                    counts: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor | None]:
        """Rows in this shard of distinct `keys` it owns (`slots`: each key's slot, table-wise;
        `counts`: their occurrences, for LFU and admission)."""
        if not self.indexed:
            if insert and self.lifecycle.track_changes:
                return self.rows(tf.math.floordiv(keys, self.num_shards), insert, component)
            return tf.math.floordiv(keys, self.num_shards), None
        rows, found = self.rows(keys, insert, component, counts=counts)
        if insert and self.sharding == "table":  # each row records its slot (rows a key may have just taken)
            placed = rows >= 0
            row_slots = self._row_slots.value if component is None else local_components(self._row_slots)[component]
            with tf.control_dependencies([row_slots.scatter_update(tf.IndexedSlices(
                    tf.boolean_mask(slots, placed), tf.boolean_mask(rows, placed)))]):
                rows = tf.identity(rows)
        return rows, found

    # ------------------------------------------------------------------ lookups
    def lookup(self, keys: Any, training: Any = None, slots: Any = None) -> tf.Tensor:
        """Vectors of this replica's `keys` (`slots`: the slot of each key, for table-wise placement)."""
        keys = self._keys(keys)
        if not self.built:
            self.build()
        if in_shape_trace(self.variable):
            return tf.zeros(tf.concat([tf.shape(keys), [self.dim]], 0), compute_dtype(self.variable.dtype))
        flat = tf.reshape(keys, [-1])
        if not self.dynamic:
            flat = self._check_range(flat, self.total_rows)
        if self.sharding == "table":
            if slots is None and self.slot_num > 1:
                raise ValueError(f"{self.name}: the {self.slot_num} slots are placed table-wise, so each key's slot "
                                 "decides its replica; pass the slot of every key")
            slots = tf.zeros_like(flat) if slots is None else tf.cast(tf.reshape(slots, [-1]), tf.int64)
        insert = inserting(training)
        context = tf.distribute.get_replica_context()
        if context is None or not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            out = self._global_lookup(flat, slots, insert)
        else:
            out = self._replica_lookup(context, flat, slots, insert)
        return tf.reshape(out, tf.concat([tf.shape(keys), [self.dim]], 0))

    def _replica_lookup(self, context: Any, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool) -> tf.Tensor:
        if int(context.num_replicas_in_sync) != self.num_shards:
            raise RuntimeError(f"{self.name}: built for {self.num_shards} replicas, called under a strategy "
                               f"of {context.num_replicas_in_sync}")
        me = tf.cast(context.replica_id_in_sync_group, tf.int64)
        count = tf.shape(keys, out_type=tf.int64)[:1]
        counts = context.all_gather(count, 0)
        all_keys = all_gather(context, keys, counts)
        all_slots = all_gather(context, slots, counts) if slots is not None else None
        mine = tf.where(tf.equal(self.owner_of(all_keys, all_slots), me))[:, 0]
        owned_slots = None if all_slots is None else tf.gather(all_slots, mine)
        owned = self._owned_vectors(tf.gather(all_keys, mine), owned_slots, insert)
        return self._exchange(context, owned, mine, tf.reduce_sum(counts[:me]), counts)

    def _owned_vectors(self, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool,
                       component: int | None = None) -> tf.Tensor:
        """Vectors of `keys` (with repeats) that this shard owns: deduplicated, looked up, repeated."""
        unique, position = tf.unique(keys, out_idx=tf.int32)
        unique_slots = None if slots is None else tf.math.unsorted_segment_max(
            slots, position, tf.size(unique))  # a key's slots agree (slots use disjoint keys)
        counts = tf.math.bincount(position, minlength=tf.size(unique), dtype=tf.int64) \
            if insert and self.lifecycle.counts else None
        rows, found = self._owned_rows(unique, unique_slots, insert, component, counts)
        variable = self.variable.value if component is None else local_components(self.variable)[component]
        return self._vectors(variable, rows, found, position)

    def _exchange(self, context: Any, owned: tf.Tensor, mine: tf.Tensor, start: tf.Tensor,
                  counts: tf.Tensor) -> tf.Tensor:
        """Owned vectors (global positions `mine`) -> this replica's vectors (`counts`: keys per replica)."""
        me = context.replica_id_in_sync_group
        ours = start + tf.range(counts[me])
        if self.exchange == "all_gather":
            owned_counts = context.all_gather(tf.shape(mine, out_type=tf.int64)[:1], 0)
            take = tf.gather(tf.math.invert_permutation(all_gather(context, mine, owned_counts)), ours)

        @tf.custom_gradient
        def exchange(vectors: tf.Tensor) -> tuple[tf.Tensor, Any]:
            if self.exchange == "all_gather":
                out = tf.gather(all_gather(context, vectors, owned_counts), take)
            else:
                full = tf.scatter_nd(mine[:, None], vectors, tf.stack([tf.reduce_sum(counts), self.dim]))
                out = tf.gather(context.all_reduce("sum", full), ours)

            def grad(upstream: Any) -> tf.Tensor:
                return tf.gather(all_gather(context, tf.convert_to_tensor(upstream), counts), mine)
            return out, grad

        return exchange(owned)

    def _global_lookup(self, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool) -> tf.Tensor:
        """Outside ``strategy.run``: read every shard directly (all shards must be in this process)."""
        if len(self.local_shards) != self.num_shards:
            raise RuntimeError(f"{self.name}: this process holds {len(self.local_shards)} of {self.num_shards} "
                               "shards; call the layer inside strategy.run")
        owners = self.owner_of(keys, slots)
        out = tf.zeros([tf.size(keys), self.dim], compute_dtype(self.variable.dtype))
        for component, shard in enumerate(self.local_shards):
            where = tf.where(tf.equal(owners, shard))
            shard_slots = None if slots is None else tf.gather_nd(slots, where)
            values = self._owned_vectors(tf.gather_nd(keys, where), shard_slots, insert, component)
            out = tf.tensor_scatter_nd_update(out, where, values)
        return out

    # ------------------------------------------------------------------ export/restore
    def _key_slots(self, component: int, rows: np.ndarray) -> np.ndarray:
        if self.sharding != "table":
            return super()._key_slots(component, rows)
        return tf.gather(local_components(self._row_slots)[component], rows).numpy()

    def _local_rows(self, keys: np.ndarray) -> np.ndarray:
        return keys // self.num_shards

    def check(self, arrays: dict[str, Any], optimizer: Any = None, *, fit: bool = True) -> None:
        if fit:
            self._placement(arrays, optimizer)
        else:
            super().check(arrays, optimizer, fit=False)

    def _placement(self, arrays: dict[str, Any], optimizer: Any) -> tuple:
        """(keys, values, variables, key_slots, {shard: positions of the keys it takes}), checked."""
        keys, values, variables = self._checked(arrays, optimizer)
        key_slots = np.asarray(arrays.get("key_slots", np.full(len(keys), -1)), np.int64)
        if self.sharding == "row":
            owners = self.layout.group_of_np(keys, self.buckets if self.lifecycle.evicts else None)
            if not self.dynamic and len(keys) and (keys.min() < 0 or keys.max() >= self.capacity * self.num_shards):
                raise ValueError(f"{self.name}: keys span [{keys.min()}, {keys.max()}] but the table holds row ids "
                                 f"[0, {self.capacity * self.num_shards})")
        else:
            placed = len(key_slots) == len(keys) and (not len(keys) or (key_slots.min() >= 0 and
                                                                         key_slots.max() < len(self.owners)))
            if not placed:
                raise ValueError(f"{self.name}: the checkpoint does not say which of the {len(self.owners)} slots "
                                 "each key belongs to; a table-wise table restores from checkpoints of table-wise "
                                 "tables only")
            owners = self.layout.owner_of_np(key_slots)
        owned = {shard: np.flatnonzero(owners == shard) for shard in self.local_shards}
        for shard, part in owned.items():  # (a shard that evicts takes any number: `restore` keeps the newest)
            if self.indexed and not self.lifecycle.evicts and len(part) > self.capacity:
                raise ValueError(f"{self.name}: shard {shard} would hold {len(part):,} keys, more than "
                                 f"max_vocabulary_size_per_gpu={self.capacity:,}")
        return keys, values, variables, key_slots, owned

    def restore(self, arrays: dict[str, Any], optimizer: Any = None) -> None:
        """Load rows by key saved from any number of shards: each local shard takes the keys it owns
        now (a table-wise table needs each key's slot: ``key_slots``, as `export` writes it)."""
        keys, values, variables, key_slots, owned = self._placement(arrays, optimizer)
        clock = self._restored_clock(arrays)
        for component, shard in enumerate(self.local_shards):
            part = owned[shard]
            part = part[np.argsort(keys[part], kind="stable")] if self.indexed else part
            rows = self._restore_shard(component, keys[part], [v[part] for v in values], variables, arrays, part,
                                       clock)
            if self.sharding == "table":
                full = np.full(self.capacity, -1, np.int64)
                full[rows[rows >= 0]] = key_slots[part][rows >= 0]
                local_components(self._row_slots)[component].assign(full)

    def _restored_clock(self, arrays: dict[str, Any]) -> int:
        """The clock every shard restores to (at least): the latest mark of all the rows."""
        marks = arrays.get("marks")
        return int(np.max(marks)) if self.lifecycle.track_changes and marks is not None and len(marks) else 0

    def _restore_shard(self, component: int, keys: np.ndarray, values: list[np.ndarray], variables: list[Any],
                       arrays: dict[str, Any], part: np.ndarray, clock: int) -> np.ndarray:
        """Write one local shard's `keys` (positions `part` of the checkpoint's) and their rows: into
        its buckets with their marks and counts (a policy), else rows ``0 .. n-1``. Returns the row
        of each key (-1: left out, its bucket full)."""
        if self.lifecycle.active:
            per_key = {name: None if arrays.get(name) is None else np.asarray(arrays[name])[part]
                       for name in ("marks", "counts")}
            slots = self.state.local(component).reset(keys, per_key["marks"], per_key["counts"], clock)
            if slots is not None:  # a bucketed shard: each key at its slot
                kept = slots >= 0
                self._write_rows(component, slots[kept], [v[kept] for v in values], variables)
                return slots
        self._assign(component, keys, values, variables)
        return np.arange(len(keys), dtype=np.int64) if self.indexed else self._local_rows(keys)

    def save_own_variables(self, store: Any) -> None:
        raise NotImplementedError(f"{self.name}: save a sharded table with sok_tutorial.training.save_checkpoint "
                                  "(it writes every shard and restores onto any number of replicas)")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "sharding": self.sharding, "exchange": self.exchange,
                "slot_num": self.slot_num, "slot_sizes": self.slot_sizes}
