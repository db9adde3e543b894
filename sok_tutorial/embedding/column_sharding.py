"""Column-wise tables: every replica holds every row, but only its slice of the width.

``sharding="column"`` (TorchRec's CW, distributed-embeddings' column slicing) splits a table of
width ``d`` over the N replicas into slices ``column_slices(d, N)`` (widths differ by at most
one). A replica stores ``[capacity, ceil(d / N)]``: replicas whose slice is one column narrower
keep a padding column that is never read out and never receives gradient. A lookup inside
``strategy.run``::

    keys     all_gather over replicas       every replica sees the N*K keys of the global batch
    slice    every replica looks up all     deduplicated; new keys get rows and their columns
                                            of the key-seeded vectors
    vectors  all_gather of the slices       [N, N*K, ceil(d/N)] -> this replica's K full vectors
    backward all_gather of output grads     [N*K, d]; each replica keeps its own columns

Every replica inserts the same keys in the same order, so a dynamic table's key index is the
same on every replica (a replicated index: it costs what a one-device index costs). Each
replica's gradient is a ``tf.IndexedSlices`` over the rows of all N*K keys, already summed
over replicas: the sparse optimizers apply it to that replica's columns (no all-reduce), and
their slots follow the variable's slice. A per-row slot that mixes columns (`RowWiseAdagrad`'s
accumulator) cannot be split: each replica would keep its own, so training would not match one
device, and `export` and `restore` refuse it.

`export` and `restore` speak the one-device layout (full-width rows), so checkpoints move between
one device, row-wise and column-wise tables of any replica count. `export` needs every slice in
one process: replicas in several processes (``MultiWorkerMirroredStrategy``) are not supported
for checkpoints, and their training is untested.
"""
from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sok_tutorial.embedding import index as key_index
from sok_tutorial.embedding.initializers import keyed_initial_values_tf
from sok_tutorial.embedding.ops import all_gather, local_components
from sok_tutorial.embedding.placement import column_slices
from sok_tutorial.embedding.sharding import ShardedTable, _local_replica_ids
from sok_tutorial.embedding.table import EmbeddingTable


@keras.saving.register_keras_serializable(package="sok_tutorial")
class ColumnShardedTable(ShardedTable):
    """A `ShardedTable` split by columns: all `capacity` rows on every replica, width
    ``column_slices(dim, N)[r]`` on replica ``r`` (module docstring).

    Args:
        capacity: rows, on every replica (``max_vocabulary_size_per_gpu``).
        dim: width of the whole table; at least the number of replicas.
        exchange: ``"all_gather"`` of the slices (default) or ``"all_reduce"`` of
            ``[N*K, dim]`` vectors holding each replica's columns.
        dynamic, initializer: as for `EmbeddingTable`.
    """

    SHARDINGS = ("column",)

    @property
    def indexed(self) -> bool:
        return self.dynamic

    @property
    def total_rows(self) -> int:
        return self.capacity

    def build(self, input_shape: Any = None) -> None:
        if self.built:
            return
        strategy = tf.distribute.get_strategy()
        self.strategy, self.num_shards = strategy, int(strategy.num_replicas_in_sync)
        try:
            self.widths = column_slices(self.dim, self.num_shards)
        except ValueError as exc:
            raise ValueError(f"{self.name}: {exc}") from None
        self.starts = np.concatenate([[0], np.cumsum(self.widths)[:-1]]).astype(int).tolist()
        self.width = max(self.widths)
        # column j of replica r's slice is column starts[r] + j of the table; `dim` is padding (zero)
        self._take = np.full((self.num_shards, self.width), self.dim, np.int32)
        for r, (s, w) in enumerate(zip(self.starts, self.widths)):
            self._take[r, :w] = np.arange(s, s + w)
        dim, self.dim = self.dim, self.width  # the variable holds one slice
        try:
            EmbeddingTable.build(self, input_shape)
        finally:
            self.dim = dim
        self.local_shards = _local_replica_ids(strategy, len(local_components(self.variable)))
        if not self.indexed:  # static rows: row j is key j on every replica
            rows = np.arange(self.capacity, dtype=np.int64)
            for shard, component in zip(self.local_shards, local_components(self.variable)):
                component.assign(self._slice(self.initial_values(rows), shard))

    # ------------------------------------------------------------------ column slices
    def _slice(self, values: np.ndarray, shard: int, blocks: int = 1) -> np.ndarray:
        """Replica `shard`'s columns of one-device rows ``[n, blocks * dim + extra]`` (`blocks`
        slices of the width, then per-row columns kept whole), padded to its variable's layout."""
        padded = np.concatenate([values[:, :blocks * self.dim], np.zeros((len(values), 1), values.dtype)], 1)
        parts = [padded[:, np.where(self._take[shard] < self.dim, self._take[shard] + b * self.dim,
                                    blocks * self.dim)] for b in range(blocks)]
        return np.concatenate([*parts, values[:, blocks * self.dim:]], 1)

    def _join(self, parts: list[np.ndarray], blocks: int = 1) -> np.ndarray:
        """One-device rows from every replica's slice (`_slice` undone)."""
        w = self.width
        cols = [p[:, b * w:b * w + width] for b in range(blocks) for p, width in zip(parts, self.widths)]
        return np.concatenate([*cols, parts[0][:, blocks * w:]], 1)

    def _columns_tf(self, values: tf.Tensor, shard: Any) -> tf.Tensor:
        """Replica `shard`'s columns of ``[n, dim]`` vectors (a tensor or int), zero padded."""
        padded = tf.pad(values, [[0, 0], [0, 1]])
        return tf.gather(padded, tf.gather(tf.constant(self._take), shard), axis=1)

    def _shard(self, component: int | None) -> Any:
        if component is None:
            return tf.distribute.get_replica_context().replica_id_in_sync_group
        return self.local_shards[component]

    def _slot_blocks(self, slot: Any, optimizer: Any) -> int:
        """Slices of the width a slot holds (1, or Adam's fused ``m | v (| v_hat)``), the rest per row."""
        if len(slot.shape) != 2:
            raise ValueError(f"{self.name}: optimizer slot {slot.name} holds one value per row of all columns "
                             "(as RowWiseAdagrad does), which a column-sharded table cannot split; use "
                             "sharding='row' or another optimizer")
        optimizer = self.optimizer if self.optimizer is not None else optimizer
        width = int(slot.shape[1])
        blocks = 1 if width == self.width else (3 if getattr(optimizer, "amsgrad", False) else 2)
        if not 0 <= width - blocks * self.width <= 1:
            raise ValueError(f"{self.name}: optimizer slot {slot.name} has width {width}, not a multiple of the "
                             f"slice width {self.width}")
        return blocks

    # ------------------------------------------------------------------ lookups
    def rows(self, keys: tf.Tensor, insert: bool, component: int | None = None, share: Any = None,
             counts: tf.Tensor | None = None, admission: bool = True) -> tuple[tf.Tensor, tf.Tensor | None]:
        if not (self.indexed and insert):
            return super().rows(keys, insert, component)
        rows, new_keys, new_rows = key_index.lookup_or_insert(self.index_variables(component), keys, self.capacity,
                                                              self.name)
        variable = self.variable.value if component is None else local_components(self.variable)[component]
        values = self._columns_tf(keyed_initial_values_tf(new_keys, self.dim, self.init), self._shard(component))
        variable.scatter_update(tf.IndexedSlices(values, new_rows))
        return rows, None

    def _owned_rows(self, keys: tf.Tensor, slots: Any, insert: bool,
                    component: int | None = None) -> tuple[tf.Tensor, tf.Tensor | None]:
        return self.rows(keys, insert, component) if self.indexed else (keys, None)

    def _replica_lookup(self, context: Any, keys: tf.Tensor, slots: Any, insert: bool) -> tf.Tensor:
        if int(context.num_replicas_in_sync) != self.num_shards:
            raise RuntimeError(f"{self.name}: built for {self.num_shards} replicas, called under a strategy "
                               f"of {context.num_replicas_in_sync}")
        me = context.replica_id_in_sync_group
        counts = context.all_gather(tf.shape(keys, out_type=tf.int64)[:1], 0)  # (N,)
        total = tf.reduce_sum(counts)
        ours = tf.reduce_sum(counts[:me]) + tf.range(counts[me])
        part = self._owned_vectors(all_gather(context, keys, counts), None, insert)  # (N*K, width)
        n, widths = self.num_shards, self.widths
        place = np.full((n, self.dim), self.width, np.int32)  # column c of the table in replica r's slice
        for r, (s, w) in enumerate(zip(self.starts, widths)):
            place[r, s:s + w] = np.arange(w)

        @tf.custom_gradient
        def exchange(part: tf.Tensor) -> tuple[tf.Tensor, Any]:
            if self.exchange == "all_gather":
                slices = tf.reshape(all_gather(context, part, tf.fill([n], total)), tf.stack([n, total, self.width]))
                slices = tf.gather(slices, ours, axis=1)  # (N, K, width)
                out = tf.concat([slices[r, :, :w] for r, w in enumerate(widths)], 1)  # (K, dim)
            else:
                mine = tf.gather(tf.pad(part, [[0, 0], [0, 1]]), tf.gather(tf.constant(place), me), axis=1)
                out = tf.gather(context.all_reduce("sum", mine), ours)  # (K, dim)

            def grad(upstream: Any) -> tf.Tensor:
                return self._columns_tf(all_gather(context, tf.convert_to_tensor(upstream), counts), me)
            return out, grad

        return exchange(part)

    def _global_lookup(self, keys: tf.Tensor, slots: Any, insert: bool) -> tf.Tensor:
        """Outside ``strategy.run``: every slice of this process's replicas, joined."""
        if len(self.local_shards) != self.num_shards:
            raise RuntimeError(f"{self.name}: this process holds {len(self.local_shards)} of {self.num_shards} "
                               "column slices; call the layer inside strategy.run")
        parts = [self._owned_vectors(keys, None, insert, component) for component in range(self.num_shards)]
        return tf.concat([p[:, :w] for p, w in zip(parts, self.widths)], 1)

    # ------------------------------------------------------------------ export/restore
    @property
    def size(self) -> int:
        if not self.indexed:
            return self.capacity
        return int(local_components(self._size)[0].numpy())

    def _keys_and_rows(self, component: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.indexed:
            rows = np.arange(self.capacity, dtype=np.int64)
            return rows, rows
        return super()._keys_and_rows(component)

    def _local_rows(self, keys: np.ndarray) -> np.ndarray:
        return keys

    def export(self, optimizer: Any = None, since: int | None = None) -> dict[str, np.ndarray]:
        """Every row in use by key, full width (the one-device layout): ``keys``, ``vectors``,
        ``slot_<j>``, ``shard`` and ``key_slots`` (-1: every replica holds a slice of every row)."""
        if len(self.local_shards) != self.num_shards:
            raise NotImplementedError(f"{self.name}: this process holds {len(self.local_shards)} of "
                                      f"{self.num_shards} column slices; export needs all of them")
        if since is not None:
            raise ValueError(f"{self.name}: a sharded table does not track changes (since={since})")
        slots = self.optimizer_slots(optimizer)
        blocks = [1] + [self._slot_blocks(s, optimizer) for s in slots]
        keys, rows = self._keys_and_rows(0)
        values = [self._join([tf.gather(c, rows).numpy() for c in local_components(v)], b)
                  for v, b in zip([self.variable, *slots], blocks)]
        out = {"keys": keys, "vectors": values[0], "shard": np.full(len(keys), -1, np.int64),
               "key_slots": np.full(len(keys), -1, np.int64)}
        out.update({f"slot_{j}": v for j, v in enumerate(values[1:])})
        return out

    def _checked(self, arrays: dict[str, Any], optimizer: Any) -> tuple[np.ndarray, list[np.ndarray], list[Any]]:
        """As `EmbeddingTable._checked`, for one-device (full-width) rows."""
        slots = self.optimizer_slots(optimizer)
        names = ["vectors"] + [f"slot_{j}" for j in range(len(slots))]
        keys, _, variables = super()._checked({k: v for k, v in arrays.items() if k not in names}, optimizer)
        values = []
        for name, variable, blocks in zip(names, variables, [1] + [self._slot_blocks(s, optimizer) for s in slots]):
            want = (len(keys), blocks * self.dim + int(variable.shape[1]) - blocks * self.width)
            value = np.asarray(arrays[name]) if name in arrays else np.zeros(want, variable.dtype)
            if value.shape != want:
                raise ValueError(f"{self.name}: {name} has shape {value.shape}, expected {want} (one-device rows "
                                 f"of {variable.path})")
            values.append(value)
        return keys, values, variables

    def _placement(self, arrays: dict[str, Any], optimizer: Any) -> tuple:
        keys, values, variables = self._checked(arrays, optimizer)
        self._check_fit(keys)
        every = np.arange(len(keys))
        return keys, values, variables, None, {shard: every for shard in self.local_shards}

    def restore(self, arrays: dict[str, Any], optimizer: Any = None) -> None:
        """Load one-device rows by key (saved from any table of this width): each replica takes its
        columns of every row."""
        keys, values, variables, _, _ = self._placement(arrays, optimizer)
        order = np.argsort(keys, kind="stable") if self.indexed else np.arange(len(keys))
        blocks = [1] + [self._slot_blocks(v, optimizer) for v in variables[1:]]
        for component, shard in enumerate(self.local_shards):
            self._assign(component, keys[order], [self._slice(v[order], shard, b) for v, b in zip(values, blocks)],
                         variables)
