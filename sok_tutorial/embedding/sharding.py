"""Model-parallel tables: each replica stores a shard, keys travel to the shard that owns them.

Under a `tf.distribute` strategy with N replicas (``MirroredStrategy`` over GPUs or logical CPU
devices, ``MultiWorkerMirroredStrategy`` over processes), an embedding layer built with
``sharding="row"`` or ``sharding="table"`` keeps only ``max_vocabulary_size_per_gpu`` rows per
replica (SOK's meaning of the name) and the replicas train one table together:

* ``"row"`` (SOK "distributed"): key ``k`` lives on replica ``k mod N``; every table is spread
  over all replicas.
* ``"table"`` (SOK/HugeCTR "localized"): each slot of the layer is a table placed whole on one
  replica, slots balanced by size (`plan_table_wise`). Slots must use disjoint keys (as the
  loader's key offsets give): a key seen in two slots on two replicas would get two rows, where
  one device shares one.
* ``"replicated"`` (the default): a full copy on every replica, gradients all-reduced; for
  small tables.

A lookup inside ``strategy.run`` is one exchange::

    keys     all_gather over replicas      every replica sees the N*K keys of the global batch
    owner    gathers the rows it owns       (new keys get their key-seeded initial vectors)
    vectors  all_gather of owned vectors    each replica keeps the K vectors of its own keys
    backward all_gather of output grads     each owner keeps the gradients of its own rows

so the gradient of a shard is a ``tf.IndexedSlices`` over the rows it owns, already summed over
replicas: the sparse optimizers apply it to that replica's shard only (no all-reduce).

Bytes received per replica and step, K keys per replica of dim d (float32, int64 keys), ring
collectives::

    pattern                           ids                 vectors fwd        grads bwd
    all_gather (exchange default)     (N-1) K (8 + 8)     (N-1) K d 4        (N-1) K d 4
    all_reduce of masked vectors      (N-1) K 8           2 (N-1) K d 4      (N-1) K d 4
    all-to-all (NCCL, as SOK)         (N-1)/N K 8         (N-1)/N K d 4      (N-1)/N K d 4
    replicated table                  0                   0                  (N-1) K (d 4 + 8)

(ids: keys, plus each owned key's position with all_gather; table-wise adds slot ids.)
`exchange_bytes` computes these. TensorFlow's replica context offers all_gather and
all_reduce, on every device type and across processes, but no all-to-all; an all-to-all would
move N times less and needs NCCL communicators that ``tf.distribute`` does not expose. Between
the two, ``exchange="all_gather"`` moves fewer bytes for any d > 2, the choice for real
interconnects, and it measured faster or equal too (``benchmarks/model_parallel.py``: 26 slots
x 20k keys, dim 16, global batch 4096; two runs on 2 logical CPU devices: 40-50 ms per step
against 49-61 ms for all_reduce; on 4: 62-68 against 63-101 ms; on tiny batches the all_reduce
variant's fewer ops can win).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding.slots import table_slots
from sok_tutorial.embedding.initializers import keyed_initial_values
from sok_tutorial.embedding.vocabulary import DynamicVocabulary

SHARDINGS = ("replicated", "row", "table")
EXCHANGES = ("all_gather", "all_reduce")


def rows_per_replica(vocabulary_size: int, num_replicas: int) -> int:
    """``max_vocabulary_size_per_gpu`` for a table of `vocabulary_size` rows sharded row-wise.

    Example:
        >>> rows_per_replica(1000, 3)
        334
    """
    checks.positive_int("vocabulary_size", vocabulary_size)
    checks.positive_int("num_replicas", num_replicas)
    if vocabulary_size < num_replicas:
        raise ValueError(f"vocabulary_size={vocabulary_size} is smaller than num_replicas={num_replicas}: a "
                         "row-wise shard would be empty; mark the table sharding='replicated'")
    return math.ceil(vocabulary_size / num_replicas)


def exchange_bytes(sharding: str, num_replicas: int, keys_per_replica: int, dim: int,
                   exchange: str = "all_gather") -> int:
    """Bytes one replica receives per training step for a table's lookup and gradient, counted
    from the shapes of the collectives the layers issue (ring algorithms, float32, int64 ids).

    Example:
        >>> exchange_bytes("row", 2, 1000, 16), exchange_bytes("replicated", 2, 1000, 16)
        (144008, 72000)
    """
    checks.one_of("sharding", sharding, SHARDINGS)
    checks.one_of("exchange", exchange, EXCHANGES)
    others = (num_replicas - 1) * keys_per_replica
    if num_replicas == 1:
        return 0
    if sharding == "replicated":
        return others * (dim * 4 + 8)  # the all-reduce of IndexedSlices gathers rows and ids
    total = (num_replicas - 1) * 8 + others * 8 + others * dim * 4  # counts, keys, gradients backward
    if sharding == "table":
        total += others * 8  # slot ids
    if exchange == "all_gather":
        return total + others * 8 + others * dim * 4  # positions, owned vectors
    return total + 2 * others * dim * 4  # ring all-reduce of the [N*K, dim] masked vectors


def plan_table_wise(slot_sizes: Sequence[int], num_replicas: int) -> tuple[list[int], list[int]]:
    """(owner replica of each slot, rows each replica stores): largest tables first, each to the
    least loaded replica, so every replica holds about ``sum(slot_sizes) / num_replicas`` rows.

    Example:
        >>> plan_table_wise([100, 10, 60, 50], 2)
        ([0, 0, 1, 1], [110, 110])
    """
    checks.positive_int("num_replicas", num_replicas)
    sizes = [checks.positive_int(f"slot_sizes[{i}]", s) for i, s in enumerate(slot_sizes)]
    owners, load = [0] * len(sizes), [0] * num_replicas
    for slot in sorted(range(len(sizes)), key=lambda s: (-sizes[s], s)):
        target = min(range(num_replicas), key=lambda r: (load[r], r))
        owners[slot] = target
        load[target] += sizes[slot]
    return owners, load


def _local_replica_ids(strategy: Any, count: int) -> list[int]:
    """Global replica ids of this process's `count` local replicas."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task = int(getattr(resolver, "task_id", 0) or 0) if resolver is not None else 0
    return [task * count + i for i in range(count)]


class ShardedTable:
    """The shards of one layer's table on the replicas of the strategy it was built under.

    Holds, for each local replica, its component of the layer's (mirrored) variable, whose rows
    hold different keys on every replica, and, with ``use_hashtable``, its own key -> row
    vocabulary. Used by the embedding layers; `export`/`restore` serve checkpoints.
    """

    def __init__(self, layer: Any, mode: str, exchange: str, slot_sizes: Sequence[int] | None):
        self.layer = layer
        self.mode = mode
        self.exchange = checks.one_of("exchange", exchange, EXCHANGES)
        self.slot_sizes = None if slot_sizes is None else [int(s) for s in slot_sizes]

    # ------------------------------------------------------------------ building
    def build(self, variable: Any) -> None:
        strategy = tf.distribute.get_strategy()
        self.strategy = strategy
        self.num_shards = int(strategy.num_replicas_in_sync)
        self.rows = int(variable.shape[0])
        self.components = list(strategy.experimental_local_results(getattr(variable, "value", variable)))
        self.replica_ids = _local_replica_ids(strategy, len(self.components))
        slots = int(getattr(self.layer, "slot_num", 1))
        if self.mode == "table":
            sizes = self.slot_sizes or [1] * slots
            if len(sizes) != slots:
                raise ValueError(f"{self.layer.name}: slot_sizes has {len(sizes)} entries, slot_num={slots}")
            self.owners, load = plan_table_wise(sizes, self.num_shards)
            if self.slot_sizes and max(load) > self.rows:
                raise ValueError(f"{self.layer.name}: table-wise placement puts {max(load):,} rows on one replica, "
                                 f"more than max_vocabulary_size_per_gpu={self.rows:,}")
        # Table-wise shards hold keys of chosen slots, so rows are assigned by a vocabulary even for
        # row-id keys; it also records each row's slot, so a checkpoint can re-place it.
        dynamic = self.layer.use_hashtable or self.mode == "table"
        self.vocabularies = {r: DynamicVocabulary(self.rows, name=f"{self.layer.name}[shard {r}]")
                             for r in self.replica_ids} if dynamic else None
        self.row_slots = {r: np.full(self.rows, -1, np.int64) for r in self.replica_ids} \
            if self.mode == "table" else None
        if not dynamic:  # static rows: row j of shard r is key j * N + r
            for r, component in zip(self.replica_ids, self.components):
                component.assign(self.initial_values(np.arange(self.rows, dtype=np.int64) * self.num_shards + r))

    def initial_values(self, keys: np.ndarray) -> np.ndarray:
        return keyed_initial_values(keys, self.layer.embedding_vec_size, self.layer.init)

    def owner_of(self, keys: tf.Tensor, slots: tf.Tensor | None) -> tf.Tensor:
        if self.mode == "row":
            return tf.math.floormod(keys, self.num_shards)
        return tf.gather(tf.constant(self.owners, tf.int64), slots)

    # ------------------------------------------------------- keys -> local rows
    def _component(self, replica: int) -> Any:
        return self.components[self.replica_ids.index(replica)]

    def _rows_numpy(self, keys: np.ndarray, slots: np.ndarray, replica: int,
                    insert: bool) -> tuple[np.ndarray, np.ndarray]:
        """(rows, found) of keys owned by `replica` in its shard; new keys get initial vectors."""
        if self.vocabularies is None:
            return keys // self.num_shards, np.ones(len(keys), bool)
        vocabulary = self.vocabularies[replica]
        if not insert:
            rows = vocabulary.lookup(keys)
            return np.maximum(rows, 0), rows >= 0
        with vocabulary.lock:
            rows, fresh_rows, fresh_keys = vocabulary.lookup_or_insert(keys)
            if len(fresh_rows):
                if self.mode == "table":
                    self.row_slots[replica][rows] = slots
                update = tf.IndexedSlices(tf.constant(self.initial_values(fresh_keys)), tf.constant(fresh_rows))
                self._component(replica).scatter_update(update)
        return rows, np.ones(len(keys), bool)

    def _rows(self, keys: tf.Tensor, slots: tf.Tensor, replica: tf.Tensor,
              insert: bool) -> tuple[tf.Tensor, tf.Tensor]:
        def run(k: tf.Tensor, s: tf.Tensor, r: tf.Tensor) -> tuple[np.ndarray, np.ndarray]:
            return self._rows_numpy(k.numpy(), s.numpy(), int(r.numpy()), insert)
        rows, found = tf.py_function(run, [keys, slots, replica], [tf.int64, tf.bool])
        rows.set_shape(keys.shape)
        found.set_shape(keys.shape)
        return rows, found

    # ------------------------------------------------------------------ lookups
    def vectors(self, keys: tf.Tensor, slots: tf.Tensor | None, training: Any) -> tf.Tensor:
        """Vectors of this replica's `keys` ``[K]`` (slot of each key in `slots` for table-wise)."""
        insert = training is not False
        context = tf.distribute.get_replica_context()
        if context is None or not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            return self._global_vectors(keys, slots, insert)
        if int(context.num_replicas_in_sync) != self.num_shards:
            raise RuntimeError(f"{self.layer.name}: built for {self.num_shards} replicas, called under a strategy "
                               f"of {context.num_replicas_in_sync}")
        me = tf.cast(context.replica_id_in_sync_group, tf.int64)
        count = tf.shape(keys, out_type=tf.int64)[:1]
        counts = context.all_gather(count, 0)
        all_keys = context.all_gather(keys, 0)
        if self.mode == "row":
            all_slots = tf.zeros_like(all_keys)
            all_owners = self.owner_of(all_keys, None)
        else:
            all_slots = context.all_gather(tf.cast(slots, tf.int64), 0)
            all_owners = self.owner_of(all_keys, all_slots)
        mine = tf.where(tf.equal(all_owners, me))[:, 0]
        rows, found = self._rows(tf.gather(all_keys, mine), tf.gather(all_slots, mine), me, insert)
        with tf.control_dependencies([rows]):
            owned = tf.gather(self.layer.embedding_variable.value, rows)
        if not insert:
            owned = owned * tf.cast(found, owned.dtype)[:, None]
        start = tf.reduce_sum(counts[:me])
        return self._exchange(context, owned, mine, start, count[0], tf.reduce_sum(counts))

    def _exchange(self, context: Any, owned: tf.Tensor, mine: tf.Tensor, start: tf.Tensor, count: tf.Tensor,
                  total: tf.Tensor) -> tf.Tensor:
        """Owned vectors (global positions `mine`) -> this replica's ``count`` vectors."""
        dim = self.layer.embedding_vec_size
        ours = start + tf.range(count)
        if self.exchange == "all_gather":
            take = tf.gather(tf.math.invert_permutation(context.all_gather(mine, 0)), ours)

        @tf.custom_gradient
        def exchange(vectors: tf.Tensor) -> tuple[tf.Tensor, Any]:
            if self.exchange == "all_gather":
                out = tf.gather(context.all_gather(vectors, 0), take)
            else:
                full = tf.scatter_nd(mine[:, None], vectors, tf.stack([total, dim]))
                out = tf.gather(context.all_reduce("sum", full), ours)

            def grad(upstream: Any) -> tf.Tensor:
                return tf.gather(context.all_gather(tf.convert_to_tensor(upstream), 0), mine)
            return out, grad

        return exchange(owned)

    def _global_vectors(self, keys: tf.Tensor, slots: tf.Tensor | None, insert: bool) -> tf.Tensor:
        """Outside ``strategy.run``: read every shard directly (all shards must be in this process)."""
        if len(self.components) != self.num_shards:
            raise RuntimeError(f"{self.layer.name}: this process holds {len(self.components)} of {self.num_shards} "
                               "shards; call the layer inside strategy.run")
        slots = tf.zeros_like(keys) if slots is None else tf.cast(slots, tf.int64)
        owners = self.owner_of(keys, slots)
        out = tf.zeros([tf.size(keys), self.layer.embedding_vec_size], self.components[0].dtype)
        for replica, component in zip(self.replica_ids, self.components):
            where = tf.where(tf.equal(owners, replica))
            rows, found = self._rows(tf.gather_nd(keys, where), tf.gather_nd(slots, where),
                                     tf.constant(replica, tf.int64), insert)
            with tf.control_dependencies([rows]):
                values = tf.gather(component, rows) * tf.cast(found, component.dtype)[:, None]
            out = tf.tensor_scatter_nd_update(out, where, values)
        return out

    # ------------------------------------------------------------ export/restore
    def export(self, replica: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, rows, slot of each key or -1) stored in one local shard."""
        if self.vocabularies is not None:
            keys, rows = self.vocabularies[replica].export()
            slots = self.row_slots[replica][rows] if self.row_slots is not None else np.full(len(keys), -1)
            return keys, rows, slots
        rows = np.arange(self.rows, dtype=np.int64)
        return rows * self.num_shards + replica, rows, np.full(self.rows, -1, np.int64)

    def restore(self, keys: np.ndarray, key_slots: np.ndarray, values: Sequence[np.ndarray],
                variables: Sequence[Any]) -> None:
        """Load rows by key, saved from any number of shards: each local shard takes the keys it
        owns now. ``values[i]`` holds, per key, the row of ``variables[i]`` (the table, then slots)."""
        keys, key_slots = np.asarray(keys, np.int64), np.asarray(key_slots, np.int64)
        if self.mode == "row":
            owners = np.mod(keys, self.num_shards)
        else:
            if len(key_slots) and (key_slots.min() < 0 or key_slots.max() >= len(self.owners)):
                raise ValueError(f"{self.layer.name}: the checkpoint does not say which of the {len(self.owners)} "
                                 "slots each key belongs to; a table-wise table restores from checkpoints of "
                                 "table-wise tables only")
            owners = np.asarray(self.owners, np.int64)[key_slots]
        for i, replica in enumerate(self.replica_ids):
            owned = np.flatnonzero(owners == replica)
            if self.vocabularies is not None:
                if len(owned) > self.rows:
                    raise ValueError(f"{self.layer.name}: shard {replica} would hold {len(owned):,} keys, more "
                                     f"than max_vocabulary_size_per_gpu={self.rows:,}")
                owned = owned[np.argsort(keys[owned], kind="stable")]
                rows = np.arange(len(owned), dtype=np.int64)
                self.vocabularies[replica].restore(keys[owned], rows)
                if self.row_slots is not None:
                    self.row_slots[replica][:] = -1
                    self.row_slots[replica][rows] = key_slots[owned]
            else:
                rows = keys[owned] // self.num_shards
            for variable, value in zip(variables, values):
                component = local_components(variable)[i]
                if self.vocabularies is None and variable is self.layer.embedding_variable:
                    full = component.numpy()
                else:
                    full = np.zeros(tuple(component.shape), component.dtype.as_numpy_dtype)
                full[rows] = np.asarray(value)[owned]
                component.assign(full)


def local_components(variable: Any) -> list[Any]:
    """The per-device tf.Variables of this process behind a (possibly mirrored) variable."""
    value = getattr(variable, "value", variable)
    return list(getattr(value, "values", None) or [value])


def local_table_rows(layer: Any, variables: Sequence[Any] = ()) -> dict[str, np.ndarray]:
    """The rows of `layer`'s table held by this process, by key: ``keys``, ``slots`` (the slot of
    each key for table-wise tables, else -1), ``vectors`` and ``extra_i``: the same rows of each
    of `variables` (optimizer slots shaped like the table). Works for any sharding.
    """
    table = layer.embedding_variable
    if layer._sharded is None:
        if layer.vocabulary is not None:
            keys, rows = layer.vocabulary.export()
        else:
            keys = rows = np.arange(int(table.shape[0]), dtype=np.int64)
        parts = [(keys, rows, np.full(len(keys), -1, np.int64), 0)]
        components = [[local_components(v)[0]] for v in (table, *variables)]
    else:
        shards = layer._sharded
        parts = [(*shards.export(r), i) for i, r in enumerate(shards.replica_ids)]
        components = [local_components(v) for v in (table, *variables)]
    out = {"keys": np.concatenate([p[0] for p in parts]), "slots": np.concatenate([p[2] for p in parts])}
    for j, name in enumerate(["vectors"] + [f"extra_{i}" for i in range(len(variables))]):
        out[name] = np.concatenate([components[j][i].numpy()[rows] for _, rows, _, i in parts])
    return out


def replica_bytes(layers: Sequence[Any], optimizer: Any = None) -> int:
    """Bytes one replica stores for the tables of `layers` (plus their optimizer slots)."""
    variables = [v for layer in layers
                 for v in (layer.embedding_variable, *table_slots(optimizer, layer.embedding_variable))]
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
