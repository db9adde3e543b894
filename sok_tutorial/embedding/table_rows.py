"""Rows by key, out of a table and into it: `EmbeddingTable`'s export, check, restore, read and
write, which checkpoints, delta exports, the training cache and the parameter server use.

`RowsByKey` is a mixin of `sok_tutorial.embedding.table.EmbeddingTable`; it works through the
table's variable, index, lifecycle and `optimizer_slots`. Sharded tables override the per-shard
pieces (`_keys_and_rows`, `_gather`, `_key_slots`, `_check_fit`, `_assign`, `_local_rows`).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import index as key_index
from sok_tutorial.embedding.ops import local_components
from sok_tutorial.embedding.precision import compute_dtype, widen


def checked_mark(since: Any) -> int | None:
    """`since` of an export: None (every row) or a mark, an int >= 0 (a clock reading); else
    TypeError or ValueError."""
    if since is None:
        return None
    if not isinstance(since, (int, np.integer)) or isinstance(since, (bool, np.bool_)):
        raise TypeError(f"since={since!r} is invalid: expected None (every row) or a mark (int)")
    if since < 0:
        raise ValueError(f"since={since!r} is invalid: expected a mark >= 0 (a reading of the table's clock)")
    return int(since)


class RowsByKey:
    """Every row in use, or chosen rows, by key, with the optimizer's per-row state beside them."""

    def _keys_and_rows(self, component: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) in use in one local shard (component)."""
        if not self.indexed:
            rows = np.arange(self.capacity, dtype=np.int64)
            return rows * self.num_shards + self.local_shards[component], rows
        if self.lifecycle.evicts:
            rows, keys, _ = self.state.local(component).live()
            return keys, rows
        index = self.index_variables(component)
        rows = np.arange(int(index.size.numpy()), dtype=np.int64)
        return tf.gather(index.row_keys, rows).numpy(), rows

    def _rows_since(self, component: int, since: int | None) -> tuple[np.ndarray, np.ndarray]:
        """`_keys_and_rows`, only those changed after mark `since` (None: all)."""
        keys, rows = self._keys_and_rows(component)
        if since is None:
            return keys, rows
        keep = np.isin(rows, self.state.local(component).changed_since(since, len(rows)))
        return keys[keep], rows[keep]

    def _gather(self, variables: Sequence[Any], component: int, rows: np.ndarray) -> list[np.ndarray]:
        return [widen(tf.gather(local_components(v)[component], rows)).numpy() for v in variables]  # float32

    def export(self, optimizer: Any = None, since: int | None = None) -> dict[str, np.ndarray]:
        """Every row in use by key: ``keys``, ``vectors`` and ``slot_<j>`` (each variable of
        `optimizer_slots`), plus ``shard`` (the replica holding each key) and ``key_slots`` (the
        layer slot of each key, table-wise placement; -1 otherwise); a table that tracks changes
        adds ``marks`` (LFU: ``counts``). `since`: only the rows changed after that mark."""
        since = checked_mark(since)
        if not self.built:  # (nothing in it yet)
            self.build()
        slots = self.optimizer_slots(optimizer)
        parts = []
        for component, shard in enumerate(self.local_shards):
            keys, rows = self._rows_since(component, since)
            values = self._gather([self.variable, *slots], component, rows)
            part = {"keys": keys, "vectors": values[0], "shard": np.full(len(keys), shard, np.int64),
                    "key_slots": self._key_slots(component, rows)}
            part.update({f"slot_{j}": v for j, v in enumerate(values[1:])})
            part.update(self._row_lifecycle(component, rows))
            parts.append(part)
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def _row_lifecycle(self, component: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """``marks`` (a table that tracks changes) and ``counts`` (LFU) of one local shard's `rows`."""
        state, out = self.state.local(component), {}
        if self.lifecycle.track_changes:
            out["marks"] = state.row_marks(rows)
        if self.lifecycle.eviction_policy == "lfu":
            out["counts"] = state.row_counts(rows)
        return out

    def _key_slots(self, component: int, rows: np.ndarray) -> np.ndarray:
        return np.full(len(rows), -1, np.int64)

    def _checked(self, arrays: dict[str, Any], optimizer: Any) -> tuple[np.ndarray, list[np.ndarray], list[Any]]:
        """(keys, [vectors, slot_0, ...], the variables they go to), after checking everything."""
        absent = [name for name in ("keys", "vectors") if name not in arrays]
        if absent:
            raise ValueError(f"{self.name}: rows by key need {' and '.join(absent)}, got the arrays {sorted(arrays)}")
        keys = np.asarray(arrays["keys"])
        if keys.dtype.kind not in "iu" or keys.ndim != 1:
            raise ValueError(f"{self.name}: keys must be a 1-D integer array, got {keys.dtype} {keys.shape}")
        checks.int64_range(f"{self.name}: keys", keys)
        keys = keys.astype(np.int64)
        variables = [self.variable, *self.optimizer_slots(optimizer)]
        names = ["vectors"] + [f"slot_{j}" for j in range(len(variables) - 1)]
        values = []
        for name, variable, shape in zip(names, variables, self._row_shapes(variables, optimizer)):
            want = (len(keys), *shape)
            value = np.asarray(arrays[name]) if name in arrays else \
                np.zeros(want, compute_dtype(variable.dtype).as_numpy_dtype)
            if value.shape != want:
                raise ValueError(f"{self.name}: {name} has shape {value.shape}, expected {want} (one-device rows "
                                 f"of {variable.path})")
            if value.dtype.kind not in "fiu":
                raise ValueError(f"{self.name}: {name} must hold real numbers, got dtype {value.dtype}")
            values.append(value)
        if len(keys) > 1 and not bool((keys[1:] > keys[:-1]).all()) and len(np.unique(keys)) != len(keys):
            raise ValueError(f"{self.name}: keys repeat")  # (keys in increasing order are distinct)
        for name in ("marks", "counts", "key_slots"):  # per key, read by the restore after the rows
            if name in arrays and np.shape(arrays[name]) != (len(keys),):
                raise ValueError(f"{self.name}: {name} has shape {np.shape(arrays[name])}, expected ({len(keys)},): "
                                 "one per key")
        if self.lifecycle.active:
            self.lifecycle.check_row_state(self.name, arrays.get("marks"), arrays.get("counts"))
        return keys, values, variables

    def _row_shapes(self, variables: list[Any], optimizer: Any) -> list[tuple]:
        """The shape of one key's row of each of `variables` in the one-device layout (a table split
        by columns stores a slice of it)."""
        return [tuple(v.shape[1:]) for v in variables]

    def check(self, arrays: dict[str, Any], optimizer: Any = None, *, fit: bool = True) -> None:
        """Raise ValueError, naming what differs, if `restore` could not load `arrays`; with
        ``fit=False`` only the shapes of the rows (their keys may not fit this table)."""
        keys, _, _ = self._checked(arrays, optimizer)
        if fit:
            self._check_fit(keys)

    def _check_fit(self, keys: np.ndarray) -> None:
        # (a table that evicts takes any number: each bucket keeps its most recent or most used keys)
        if self.indexed and not self.lifecycle.evicts and len(keys) > self.capacity:
            raise ValueError(f"{self.name}: {len(keys):,} keys do not fit max_vocabulary_size_per_gpu="
                             f"{self.capacity:,} rows")
        if not self.indexed and len(keys) and (keys.min() < 0 or keys.max() >= self.capacity):
            raise ValueError(f"{self.name}: keys span [{keys.min()}, {keys.max()}] but the table holds row ids "
                             f"[0, {self.capacity})")

    def restore(self, arrays: dict[str, Any], optimizer: Any = None) -> None:
        """Load rows by key, as `export` writes them: a dynamic table takes rows ``0 .. n-1`` in the
        order given and keeps assigning new keys from ``n``; a table with an eviction policy puts
        each key in its bucket (keys a bucket has no room for are left out, with a warning); a
        table of row ids takes each key's row. Everything is checked (`check`) before anything is
        written."""
        if not self.built:
            self.build()
        keys, values, variables = self._checked(arrays, optimizer)
        self._check_fit(keys)
        slots = self.state.reset(keys, arrays.get("marks"), arrays.get("counts")) \
            if self.lifecycle.active else None
        if slots is None:
            self._assign(0, keys, values, variables)
            return
        kept = slots >= 0  # a bucketed table: each key at its slot
        self._write_rows(0, slots[kept], [value[kept] for value in values], variables)

    def _assign(self, component: int, keys: np.ndarray, values: list[np.ndarray], variables: list[Any]) -> None:
        """Write `keys` and their rows into one local shard (rebuilding its index)."""
        if self.indexed:
            index = self.index_variables(component)
            index.slots.assign(key_index.empty_slots(index.slots.shape[0]))
            index.size.assign(0)
            key_index.lookup_or_insert(index, tf.constant(keys), self.capacity, self.name)
            rows = np.arange(len(keys), dtype=np.int64)
        else:
            rows = self._local_rows(keys)
        self._write_rows(component, rows, values, variables)

    def _write_rows(self, component: int, rows: np.ndarray, values: list[np.ndarray], variables: list[Any]) -> None:
        """Set `rows` of one local shard of each of `variables` to `values`, every other row to zero
        (a static table's vectors outside `rows` keep theirs)."""
        for j, (variable, value) in enumerate(zip(variables, values)):
            target = local_components(variable)[component]
            keep = j == 0 and not self.indexed  # rows of a static table outside `keys` keep their values
            full = target.numpy() if keep else np.zeros(target.shape, target.dtype.as_numpy_dtype)
            full[rows] = value
            target.assign(full)

    def _local_rows(self, keys: np.ndarray) -> np.ndarray:
        return keys

    def read(self, keys: Any, optimizer: Any = None) -> dict[str, np.ndarray]:
        """``vectors`` and ``slot_<j>`` of `keys` (present keys of a one-shard table)."""
        keys = tf.constant(np.asarray(keys, np.int64))
        rows, found = self.rows(keys, insert=False) if self.indexed else (keys, None)
        if found is not None and not bool(tf.reduce_all(found)):
            raise KeyError(f"{self.name}: {int(tf.reduce_sum(1 - tf.cast(found, tf.int32)))} keys have no row")
        variables = [self.variable, *self.optimizer_slots(optimizer)]
        values = [widen(tf.gather(v.value, rows)).numpy() for v in variables]
        return dict(zip(["vectors"] + [f"slot_{j}" for j in range(len(variables) - 1)], values))

    def write(self, keys: Any, arrays: dict[str, Any], optimizer: Any = None) -> None:
        """Set the rows of `keys` (a dynamic table gives new keys rows): ``vectors`` and ``slot_<j>``."""
        keys, values, variables = self._checked({"keys": keys, **arrays}, optimizer)
        rows = self.rows(tf.constant(keys), insert=True, admission=False)[0].numpy()
        placed = rows >= 0  # a bucketed table holds at most bucket_capacity keys of a bucket per call
        if not placed.all():
            warnings.warn(f"{self.name}: {int((~placed).sum()):,} of {len(keys):,} keys written found their bucket "
                          f"full of keys of the same write (bucket_capacity={self.lifecycle.bucket_capacity}) and "
                          "were left out", RuntimeWarning, stacklevel=2)
        for variable, value in zip(variables, values):
            variable.value.scatter_update(tf.IndexedSlices(tf.cast(tf.constant(value[placed]), variable.dtype),
                                                           rows[placed]))
        if len(variables) > 1:  # the slots written are the rows' state: take their fresh marks (a table that
            self.fresh_rows(tf.constant(rows[placed]))  # evicts), so no update restarts them
