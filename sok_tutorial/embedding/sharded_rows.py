"""Rows by key out of a `ShardedTable` and into it, in the one-device layout: `export` joins each
row group's column slices into full-width rows, and `restore` puts each key in the row group its
layout (and, with an eviction policy, its bucket) gives it now, with its columns on each replica
of the group. So checkpoints and deltas move between one device and any layout and replica
count: a row-wise checkpoint of 2 replicas restores onto 4, onto a grid, or onto one device.

Over worker processes (``MultiWorkerMirroredStrategy``) a layout with column groups gathers the
other processes' slices with a collective, so every worker must call `export` (as
`sok_tutorial.training.save_checkpoint` and `export_delta` do); each row group is exported by the
process holding its first replica, so the workers' exports together hold every key once.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.collectives import all_gather, gather_counts
from sok_tutorial.embedding.ops import local_components, read_rows
from sok_tutorial.embedding.precision import widen
from sok_tutorial.embedding.table_rows import RowsByKey, checked_mark


class ShardedRows(RowsByKey):
    """`RowsByKey` for `sok_tutorial.embedding.sharding.ShardedTable` (module docstring)."""

    def _keys_and_rows(self, component: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.indexed:  # row j of replica r is key j * R + its row group
            rows = np.arange(self.capacity, dtype=np.int64)
            return rows * self.layout.rows + self.group(self.local_shards[component]), rows
        return super()._keys_and_rows(component)

    def _local_rows(self, keys: np.ndarray) -> np.ndarray:
        return keys // self.layout.rows

    def _key_slots(self, component: int, rows: np.ndarray) -> np.ndarray:
        if not self.needs_slots:
            return super()._key_slots(component, rows)
        return tf.gather(local_components(self.row_slots)[component], rows).numpy()

    def _blocks(self, variables: list[Any], optimizer: Any) -> list[int]:
        """Slices of the width each of `variables` holds (1, or Adam's fused ``m | v (| v_hat)``), the
        rest per row, as its optimizer declares (`sok_tutorial.embedding.optimizers.SlotLayout`)."""
        if self.slices.whole:
            return [1] * len(variables)
        from sok_tutorial.embedding.optimizers import slot_layout  # (the optimizers import the tables)

        layout = slot_layout(self.optimizer if self.optimizer is not None else optimizer)
        return [1] + [layout.of(v.name)[0] for v in variables[1:]]

    def export(self, optimizer: Any = None, since: int | None = None) -> dict[str, np.ndarray]:
        """Every row in use by key, full width (the one-device layout): ``keys``, ``vectors``,
        ``slot_<j>``, ``shard`` (the first replica of the key's row group), ``key_slots`` (each
        key's layer slot, table-wise; -1 otherwise), and with change tracking ``marks`` (LFU:
        ``counts``). `since`: only the rows changed after that mark. Each row group is exported
        by the process holding its first replica (module docstring)."""
        since = checked_mark(since)
        variables = [self.variable, *self.optimizer_slots(optimizer)]
        blocks = self._blocks(variables, optimizer)
        # (component, keys, rows) of each local replica: the C replicas of a group agree
        chosen = [(c, *self._rows_since(c, since)) for c in range(len(self.local_shards))]
        slices = self._slices(variables, [rows for _, _, rows in chosen])
        parts, heads = [], set(self.group_components())
        for component, keys, rows in chosen:
            shard = self.local_shards[component]
            if component not in heads:
                continue
            replicas = [[by_replica[shard + j] for j in range(self.layout.columns)] for by_replica in slices]
            part = {"keys": keys, "shard": np.full(len(keys), shard, np.int64),
                    "key_slots": self._key_slots(component, rows)}
            values = [self.slices.join(p, b) for p, b in zip(replicas, blocks)]
            part.update({"vectors": values[0], **{f"slot_{j}": v for j, v in enumerate(values[1:])}})
            part.update(self._row_lifecycle(component, rows))
            parts.append(part)
        if not parts:  # every row group of this process is exported by another (worker) process
            empty = [np.zeros((0, int(v.shape[1])), np.float32) for v in variables]
            values = [self.slices.join([e] * self.layout.columns, b) for e, b in zip(empty, blocks)]
            parts = [{"keys": np.zeros(0, np.int64), "shard": np.zeros(0, np.int64),
                      "key_slots": np.zeros(0, np.int64), "vectors": values[0],
                      **{f"slot_{j}": v for j, v in enumerate(values[1:])}}]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def _slices(self, variables: list[Any], rows: list[np.ndarray]) -> list[dict[int, np.ndarray]]:
        """For each of `variables`, the float32 rows `rows[c]` of each local replica c by replica id,
        and with column groups those of every replica: replicas in other processes (worker
        processes) send theirs through an all_gather, which every process must call."""
        if self.slices.whole or len(self.local_shards) == self.num_shards:
            return [{shard: widen(tf.gather(local_components(v)[c], rows[c])).numpy()
                     for c, shard in enumerate(self.local_shards)} for v in variables]
        strategy, local = self.strategy, {shard: c for c, shard in enumerate(self.local_shards)}
        wanted = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(rows[local[ctx.replica_id_in_sync_group]], tf.int64))

        def gather(rows_here: tf.Tensor) -> list[tf.Tensor]:
            context = tf.distribute.get_replica_context()
            sizes = gather_counts(context, tf.shape(rows_here, out_type=tf.int64)[:1])
            return [sizes] + [all_gather(context, widen(read_rows(v, rows_here)), sizes) for v in variables]

        sizes, *gathered = (strategy.experimental_local_results(t)[0].numpy()
                            for t in strategy.run(gather, args=(wanted,)))
        starts = np.concatenate([[0], np.cumsum(sizes)])
        return [{r: g[starts[r]:starts[r + 1]] for r in range(self.num_shards)} for g in gathered]

    def _row_shapes(self, variables: list[Any], optimizer: Any) -> list[tuple]:
        return [(int(v.shape[1]) + blocks * (self.dim - self.slices.width),)
                for v, blocks in zip(variables, self._blocks(variables, optimizer))]

    def check(self, arrays: dict[str, Any], optimizer: Any = None, *, fit: bool = True) -> None:
        if fit:
            self._placement(arrays, optimizer)
        else:
            super().check(arrays, optimizer, fit=False)

    def _placement(self, arrays: dict[str, Any], optimizer: Any) -> tuple:
        """(keys, values, variables, key_slots, {replica: positions of the keys it takes}), checked."""
        keys, values, variables = self._checked(arrays, optimizer)
        if not self.indexed and len(keys) and (keys.min() < 0 or keys.max() >= self.total_rows):
            raise ValueError(f"{self.name}: keys span [{keys.min()}, {keys.max()}] but the table holds row ids "
                             f"[0, {self.total_rows})")
        key_slots = np.asarray(arrays.get("key_slots", np.full(len(keys), -1)), np.int64)
        slots = self.layout.slot_sizes if self.needs_slots else None
        if slots is not None and not (len(key_slots) == len(keys) and (
                not len(keys) or (key_slots.min() >= 0 and key_slots.max() < len(slots)))):
            raise ValueError(f"{self.name}: the checkpoint does not say which of the {len(slots)} slots each key "
                             "belongs to; a table-wise table restores from checkpoints of table-wise tables only")
        groups = self.group_of_np(keys, key_slots if slots is not None else None)
        owned = {shard: np.flatnonzero(groups == self.group(shard)) for shard in self.local_shards}
        for shard, part in owned.items():  # (a row group that evicts takes any number: the newest stay)
            if self.indexed and not self.lifecycle.evicts and len(part) > self.capacity:
                group = "" if self.layout.rows == 1 else f" of row group {self.group(shard)}"
                raise ValueError(f"{self.name}: {len(part):,} keys{group} do not fit max_vocabulary_size_per_gpu="
                                 f"{self.capacity:,} rows")
        return keys, values, variables, key_slots, owned

    def restore(self, arrays: dict[str, Any], optimizer: Any = None) -> None:
        """Load one-device rows by key saved from any table of this width and layout family: each
        replica takes its columns of the rows of its row group, in key order, so the replicas of a
        group build the same key index (a table-wise table needs each key's slot: ``key_slots``,
        as `export` writes it). Everything is checked before anything is written."""
        keys, values, variables, key_slots, owned = self._placement(arrays, optimizer)
        blocks = self._blocks(variables, optimizer)
        marks = arrays.get("marks")
        clock = int(np.max(marks)) if self.lifecycle.track_changes and marks is not None and len(marks) else 0
        for component, shard in enumerate(self.local_shards):
            part = owned[shard]
            part = part[np.argsort(keys[part], kind="stable")] if self.indexed else part
            rows = self._restore_shard(component, keys[part], [self.slices.slice(v[part], shard, b)
                                                               for v, b in zip(values, blocks)],
                                       variables, arrays, part, clock)
            if self.needs_slots:
                full = np.full(self.capacity, -1, np.int64)
                full[rows[rows >= 0]] = key_slots[part][rows >= 0]
                local_components(self.row_slots)[component].assign(full)

    def _restore_shard(self, component: int, keys: np.ndarray, values: list[np.ndarray], variables: list[Any],
                       arrays: dict[str, Any], part: np.ndarray, clock: int) -> np.ndarray:
        """Write one local replica's `keys` (positions `part` of the checkpoint's) and their rows: into
        its buckets with their marks and counts (a policy; every replica's clock at least `clock`,
        the latest mark of all rows), else rows ``0 .. n-1``. Returns the row of each key (-1: left
        out, its bucket full)."""
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
