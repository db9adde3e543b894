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
their slots follow the variable's slice, as each optimizer's `SlotLayout` declares. A per-row slot
that mixes columns (`RowWiseAdagrad`'s accumulator) cannot be split: each replica would keep its
own, so training would not match one device; the optimizer refuses such a table when it builds.

`export` and `restore` speak the one-device layout (full-width rows), so checkpoints move between
one device, row-wise, column-wise and grid tables of any replica count. A column-wise table is the
grid of one row group (``grid = (1, N)``): what depends on the layout alone (slices, static rows,
export, restore) is written here for any grid, and
`sok_tutorial.embedding.grid_sharding.GridShardedTable` (``sharding="row_column"``) adds the
lookup that routes keys to their row group. Over worker processes (``MultiWorkerMirroredStrategy``)
`export` gathers the other processes' slices with a collective, so every worker must call it
(as `sok_tutorial.training.save_checkpoint` and `export_delta` do); the process holding a row
group's first replica exports its rows.
"""
from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.initializers import keyed_initial_values_tf
from sok_tutorial.embedding.layouts import layout_of
from sok_tutorial.embedding.lifecycle_state import LifecycleState
from sok_tutorial.embedding.ops import all_gather, local_components, read_rows
from sok_tutorial.embedding.precision import compute_dtype
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
        return self.capacity * self.grid[0]

    @property
    def column_groups(self) -> int:
        return self.grid[1]

    def build(self, input_shape: Any = None) -> None:
        if self.built:
            return
        strategy = tf.distribute.get_strategy()
        self.strategy, self.num_shards = strategy, int(strategy.num_replicas_in_sync)
        try:  # replica r: row group r // C, column slice r % C (column-wise: one row group of all N)
            self.layout = layout_of(self.sharding, self.num_shards, dim=self.dim,
                                    column_shards=getattr(self, "column_shards", None))
            self.grid, self.widths = (self.layout.rows, self.layout.columns), self.layout.widths(self.dim)
        except ValueError as exc:
            raise ValueError(f"{self.name}: {exc}") from None
        groups, columns = self.grid
        self.starts = np.concatenate([[0], np.cumsum(self.widths)[:-1]]).astype(int).tolist()
        self.width = max(self.widths)
        # column j of replica r's slice is column starts[r % C] + j of the table (`dim`: padding, zero),
        # and column c of the table is column _place[r, c] of replica r's slice (`width`: not there)
        self._take = np.full((self.num_shards, self.width), self.dim, np.int32)
        self._place = np.full((self.num_shards, self.dim), self.width, np.int32)
        for r in range(self.num_shards):
            s, w = self.starts[r % columns], self.widths[r % columns]
            self._take[r, :w] = np.arange(s, s + w)
            self._place[r, s:s + w] = np.arange(w)
        if self.lifecycle.active:  # one state per row group, the same on each of its C replicas
            self.state = LifecycleState(self.name, self.lifecycle, self.capacity, shards=groups)
        dim, self.dim = self.dim, self.width  # the variable holds one slice
        try:
            EmbeddingTable.build(self, input_shape)
        finally:
            self.dim = dim
        self.local_shards = _local_replica_ids(strategy, len(local_components(self.variable)))
        if not self.indexed:  # static rows: row j of replica r is key j * R + r // C (key j column-wise)
            rows = np.arange(self.capacity, dtype=np.int64)
            for shard, component in zip(self.local_shards, local_components(self.variable)):
                component.assign(self._slice(self.initial_values(rows * groups + shard // columns), shard))

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
        """Slices of the width a slot holds (1, or Adam's fused ``m | v (| v_hat)``), the rest per row,
        as its optimizer declares (`sok_tutorial.embedding.optimizers.SlotLayout`)."""
        from sok_tutorial.embedding.optimizers import slot_layout  # (the optimizers import the tables)

        optimizer = self.optimizer if self.optimizer is not None else optimizer
        return slot_layout(optimizer).of(slot.name)[0]

    # ------------------------------------------------------------------ lookups
    def group_of(self, keys: tf.Tensor) -> tf.Tensor:
        """The row group holding each key: ``key mod R``, or with an eviction policy the row group
        of the key's bucket (`sok_tutorial.embedding.buckets.BucketedIndex.owner_of`)."""
        return self.layout.group_of(keys, self.buckets if self.lifecycle.evicts else None)

    def group_of_np(self, keys: np.ndarray) -> np.ndarray:
        """NumPy twin of `group_of`."""
        return self.layout.group_of_np(keys, self.buckets if self.lifecycle.evicts else None)

    def _initial_vectors(self, keys: tf.Tensor, component: int | None) -> tf.Tensor:
        return self._columns_tf(keyed_initial_values_tf(keys, self.dim, self.init), self._shard(component))

    def _owned_rows(self, keys: tf.Tensor, slots: Any, insert: bool, component: int | None = None,
                    counts: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor | None]:
        if self.indexed:
            return self.rows(keys, insert, component, counts=counts)
        rows = tf.math.floordiv(keys, self.grid[0])
        if insert and self.lifecycle.track_changes:
            return self.rows(rows, insert, component)  # (row ids: checked and marked)
        return rows, None

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

        @tf.custom_gradient
        def exchange(part: tf.Tensor) -> tuple[tf.Tensor, Any]:
            if self.exchange == "all_gather":
                slices = tf.reshape(all_gather(context, part, tf.fill([n], total)), tf.stack([n, total, self.width]))
                slices = tf.gather(slices, ours, axis=1)  # (N, K, width)
                out = tf.concat([slices[r, :, :w] for r, w in enumerate(widths)], 1)  # (K, dim)
            else:
                mine = tf.gather(tf.pad(part, [[0, 0], [0, 1]]), tf.gather(tf.constant(self._place), me), axis=1)
                out = tf.gather(context.all_reduce("sum", mine), ours)  # (K, dim)

            def grad(upstream: Any) -> tf.Tensor:
                return self._columns_tf(all_gather(context, tf.convert_to_tensor(upstream), counts), me)
            return out, grad

        return exchange(part)

    def _global_lookup(self, keys: tf.Tensor, slots: Any, insert: bool) -> tf.Tensor:
        """Outside ``strategy.run``: the slices of each key's row group (all in this process), joined."""
        if len(self.local_shards) != self.num_shards:
            raise RuntimeError(f"{self.name}: this process holds {len(self.local_shards)} of {self.num_shards} "
                               "column slices; call the layer inside strategy.run")
        groups, columns = self.grid
        owner = self.group_of(keys)
        out = tf.zeros([tf.size(keys), self.dim], compute_dtype(self.variable.dtype))
        for group in range(groups):  # components are replicas here: this process holds them all
            where = tf.where(tf.equal(owner, group))
            parts = [self._owned_vectors(tf.gather_nd(keys, where), None, insert, group * columns + j)
                     for j in range(columns)]
            out = tf.tensor_scatter_nd_update(out, where, tf.concat([p[:, :w] for p, w in zip(parts, self.widths)], 1))
        return out

    # ------------------------------------------------------------------ export/restore
    def shard_states(self) -> list[Any]:
        columns = self.grid[1]  # the C replicas of a row group hold the same keys: the first speaks for them
        return [self.state.local(c) for c, shard in enumerate(self.local_shards) if shard % columns == 0]

    @property
    def size(self) -> int:
        if not self.indexed:
            return self.total_rows
        if self.lifecycle.evicts:
            return sum(len(state.live()[0]) for state in self.shard_states())
        groups, columns = self.grid  # the C replicas of a row group hold the same keys
        return sum(int(self.index_variables(group * columns).size.numpy()) for group in range(groups))

    def _keys_and_rows(self, component: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.indexed:
            rows = np.arange(self.capacity, dtype=np.int64)
            return rows * self.grid[0] + self.local_shards[component] // self.grid[1], rows
        return super()._keys_and_rows(component)

    def _local_rows(self, keys: np.ndarray) -> np.ndarray:
        return keys // self.grid[0]

    def export(self, optimizer: Any = None, since: int | None = None) -> dict[str, np.ndarray]:
        """Every row in use by key, full width (the one-device layout): ``keys``, ``vectors``,
        ``slot_<j>``, ``shard`` and ``key_slots`` (-1: the replicas of a row group each hold a
        slice of its rows). Over worker processes, every worker must call it (the slices of other
        processes come through a collective); each row group is exported by the process holding
        its first replica, so the workers' exports together hold every key once."""
        slots = self.optimizer_slots(optimizer)
        blocks = [1] + [self._slot_blocks(s, optimizer) for s in slots]
        groups, columns = self.grid
        chosen = []  # (component, keys, rows) of each local replica, the rows its row group exports
        for component in range(len(self.local_shards)):
            keys, rows = self._keys_and_rows(component)
            if since is not None:
                keep = np.isin(rows, self.state.local(component).changed_since(since, len(rows)))
                keys, rows = keys[keep], rows[keep]
            chosen.append((component, keys, rows))
        variables = [self.variable, *slots]
        slices = self._slices(variables, [rows for _, _, rows in chosen])
        parts, marks, counts = [], [], []
        for component, keys, rows in chosen:  # a row group is exported where its first replica lives
            shard = self.local_shards[component]
            if shard % columns:
                continue
            replicas = [[by_shard[shard + j] for j in range(columns)] for by_shard in slices]
            parts.append([keys, *(self._join(p, b) for p, b in zip(replicas, blocks))])
            state = self.state.local(component)
            if self.lifecycle.track_changes:
                marks.append(state.row_marks(rows))
            if self.lifecycle.eviction_policy == "lfu":
                counts.append(state.row_counts(rows))
        if not parts:  # every row group this process holds is exported by another (worker) process
            parts = [[np.zeros(0, np.int64), *(self._join([np.zeros((0, int(v.shape[1])), np.float32)] * columns, b)
                                               for v, b in zip(variables, blocks))]]
        keys, *values = (np.concatenate(arrays) for arrays in zip(*parts))
        out = {"keys": keys, "vectors": values[0], "shard": np.full(len(keys), -1, np.int64),
               "key_slots": np.full(len(keys), -1, np.int64)}
        out.update({f"slot_{j}": v for j, v in enumerate(values[1:])})
        out.update({name: np.concatenate(v) for name, v in (("marks", marks), ("counts", counts)) if v})
        return out

    def _slices(self, variables: list[Any], rows: list[np.ndarray]) -> list[dict[int, np.ndarray]]:
        """For each of `variables`, every replica's rows (`rows[c]` of local replica c) by replica id.
        Replicas in other processes (worker processes) send theirs through an all_gather, which
        every process must call, as every worker calls `export`."""
        if len(self.local_shards) == self.num_shards:
            return [{shard: tf.gather(local_components(v)[c], rows[c]).numpy()
                     for c, shard in enumerate(self.local_shards)} for v in variables]
        strategy, local = self.strategy, {shard: c for c, shard in enumerate(self.local_shards)}
        wanted = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(rows[local[ctx.replica_id_in_sync_group]], tf.int64))

        def gather(rows_here: tf.Tensor) -> list[tf.Tensor]:
            context = tf.distribute.get_replica_context()
            sizes = context.all_gather(tf.shape(rows_here, out_type=tf.int64)[:1], 0)
            return [sizes] + [all_gather(context, read_rows(v, rows_here), sizes) for v in variables]

        sizes, *gathered = (strategy.experimental_local_results(t)[0].numpy()
                            for t in strategy.run(gather, args=(wanted,)))
        starts = np.concatenate([[0], np.cumsum(sizes)])
        return [{r: g[starts[r]:starts[r + 1]] for r in range(self.num_shards)} for g in gathered]

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
        groups, columns = self.grid
        if not self.indexed and len(keys) and (keys.min() < 0 or keys.max() >= self.total_rows):
            raise ValueError(f"{self.name}: keys span [{keys.min()}, {keys.max()}] but the table holds row ids "
                             f"[0, {self.total_rows})")
        owner = self.group_of_np(keys)
        owned = {shard: np.flatnonzero(owner == shard // columns) for shard in self.local_shards}
        for shard, part in owned.items():  # (a row group that evicts takes any number)
            if self.indexed and not self.lifecycle.evicts and len(part) > self.capacity:
                group = "" if groups == 1 else f" of row group {shard // columns}"
                raise ValueError(f"{self.name}: {len(part):,} keys{group} do not fit max_vocabulary_size_per_gpu="
                                 f"{self.capacity:,} rows")
        return keys, values, variables, None, owned

    def restore(self, arrays: dict[str, Any], optimizer: Any = None) -> None:
        """Load one-device rows by key (saved from any table of this width): each replica takes its
        columns of the rows of its row group (column-wise: of every row), in key order, so the
        replicas of a row group build the same key index."""
        keys, values, variables, _, owned = self._placement(arrays, optimizer)
        blocks = [1] + [self._slot_blocks(v, optimizer) for v in variables[1:]]
        clock = self._restored_clock(arrays)
        for component, shard in enumerate(self.local_shards):
            part = owned[shard]
            part = part[np.argsort(keys[part], kind="stable")] if self.indexed else part
            self._restore_shard(component, keys[part], [self._slice(v[part], shard, b) for v, b in zip(values, blocks)],
                                variables, arrays, part, clock)
