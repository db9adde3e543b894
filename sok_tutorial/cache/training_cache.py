"""`EmbeddingTrainingCache`: train tables far larger than the device, one data file at a time.

HugeCTR's Embedding Training Cache, on Keras: the full tables (vectors and optimizer state)
live in a parameter server (`HostMemoryPS` or `DiskPS`); the model's embedding tables hold only
``device_capacity_rows`` rows. Before a pass over a data file, `update` pulls the rows of that
file's keyset (new keys get the table's key-seeded initial vectors and zero optimizer state)
into rows ``0 .. n-1`` of every table and its slots, and `remap` (or the loader transform from
`transform`) turns the file's keys into those rows. After the pass, `write_back` pushes the rows
back, all tables in one atomic push.

Because a key's initial vector depends only on the key, and the sparse optimizers update only
touched rows with the optimizer's global step, training through the cache gives the same losses
and the same final table as training the whole table in memory (tested).

What a pass costs besides training, and how it is kept small:

* `update` takes the rows of keys that the previous pass also held from that pass's
  write-back, which the cache keeps in host memory (they are what the server holds), and pulls
  only the others; it writes the device tables with one scatter of n rows per variable.
* `prefetch` (``fit`` calls it) pulls the next pass's other rows in a background thread while
  this pass trains. They are keys outside the active pass, so this pass's write-back cannot
  change them; the next `update` then only assembles rows and scatters them. Anything else that
  changes the server's rows in between (`load_params_from_files`) drops the prefetch, and an
  `update` of another keyset ignores it. The cache must be its tables' only writer.
* `remap` (every categorical value the loader reads) is one gather from a dense array over the
  keyset's key range, not a binary search, which costs a logarithm of the keyset per value.
  `write_back` reads each table and its slots with one gather and one concat.

``benchmarks/training_cache.py`` measures a pass with each server against the whole table in
memory (pull, write-back and training time per pass, with and without `prefetch`); the figures
of the last run are in the README. DiskPS's write-back is mostly RocksDB taking one batch of
records. On two cores `prefetch`'s background thread competes with training for the CPU and the
GIL (RocksDB reads hold it), so there what it gains varies from run to run; it is meant for
machines whose cores sit idle while the device trains.

Example:
    >>> import numpy as np, keras, tensorflow as tf
    >>> import sok_tutorial as sok
    >>> from sok_tutorial.cache import EmbeddingTrainingCache, HostMemoryPS
    >>> model = keras.Sequential([keras.Input((2,), dtype="int64"),
    ...     sok.DistributedEmbedding("sum", 4, 3, slot_num=2, max_nnz=1, use_hashtable=False, name="table"),
    ...     keras.layers.Flatten(), keras.layers.Dense(1)])
    >>> model.compile(sok.optimizers.Adam(0.01), "mse")
    >>> cache = EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=4)
    >>> cache.update(np.array([10**12, 7, 42]))  # this file's keyset: rows in key order
    >>> rows = cache.remap(np.array([[42, 7], [10**12, 42]]))
    >>> rows.tolist()
    [[1, 0], [2, 1]]
    >>> _ = model.fit(rows, np.ones((2, 1)), verbose=0)
    >>> cache.write_back()
    >>> sorted(cache.get_incremental_model()["table"][0].tolist())
    [7, 42, 1000000000000]
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kernels import checks
from kernels.key_index import KeyIndex
from sok_tutorial.cache.exports import CacheExports
from sok_tutorial.cache.passes import CachePasses
from sok_tutorial.cache.ps import ParameterServer
from sok_tutorial.cache.staging import Prefetch, as_keys
from sok_tutorial.data.transforms import Transform
from sok_tutorial.embedding.table import tables_of


class KeysetRemap(Transform):
    """Loader transform: per-column ids + the column's key offset -> rows of the cache's keyset."""

    def __init__(self, cache: EmbeddingTrainingCache, offsets: Mapping[str, int]):
        super().__init__(list(offsets))
        self.cache, self.offsets = cache, {c: int(o) for c, o in offsets.items()}

    def transform(self, values: Any, column: str) -> Any:
        return self.cache.remap(np.asarray(values, dtype=np.int64) + self.offsets[column])


class EmbeddingTrainingCache(CachePasses, CacheExports):
    """Keep a model's embedding tables in a parameter server and train them file by file.

    Args:
        model: a compiled, built Keras model (functional, ``Sequential`` or subclassed) holding the
            sparse layers: the cache manages every `EmbeddingTable` of the model (`tables_of`; the SOK
            layers hold one each), each with ``use_hashtable=False`` (rows addressed directly), not
            sharded, and with at least ``device_capacity_rows`` rows. Each is one table of the
            server, named after it (a SOK layer's table bears the layer's name). A model only: bare
            layers (or a list of them) are not accepted; wrap them in the model you train, e.g.
            ``keras.Sequential([keras.Input(...), layer, ...])``, call it on a batch and compile it
            (or pass `optimizer`).
        ps: a `HostMemoryPS` or `DiskPS`.
        device_capacity_rows: most keys one pass may hold on the device.
        train_from_scratch: start from empty tables (the server must not hold rows of them yet);
            ``False`` continues from `dest_sparse_models` (saved by `save_params_to_files`) or,
            without it, from the rows the server already holds.
        dest_sparse_models: the directory `save_params_to_files` writes by default and
            ``train_from_scratch=False`` loads.
        optimizer: defaults to ``model.optimizer``; built here if it is not yet.

    Attributes:
        history: one record per pass that trained (``keys``, ``pull_s``, ``write_back_s``; `fit`
            adds its own), in order. Evaluation passes (`evaluate`, or `discard` after `update`)
            leave none.
    """

    def __init__(self, model: Any, ps: ParameterServer, device_capacity_rows: int, *, train_from_scratch: bool = True,
                 dest_sparse_models: str | Path | None = None, optimizer: Any = None):
        self.model, self.ps = model, ps
        self.capacity = checks.positive_int("device_capacity_rows", device_capacity_rows)
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if self.optimizer is None:
            if not isinstance(model, keras.Model):
                raise TypeError(f"model={type(model).__name__} {getattr(model, 'name', '')!r} is a layer: "
                                "EmbeddingTrainingCache takes a Keras model holding the sparse layers, compiled with "
                                "an optimizer (or pass optimizer=)")
            raise ValueError("EmbeddingTrainingCache needs an optimizer: compile the model first or pass optimizer=")
        self.dest = None if dest_sparse_models is None else Path(dest_sparse_models)
        self.tables = tables_of(model)
        if not self.tables:
            raise ValueError("the model has no embedding tables of sok_tutorial (EmbeddingTable, or the layers "
                             "DistributedEmbedding and All2AllDenseEmbedding) for the cache to manage")
        for table in self.tables:
            if not table.built:
                raise ValueError(f"table {table.name!r} is not built: call the model on a batch first")
            if table.dynamic or table.num_shards > 1:
                raise ValueError(f"table {table.name!r} is {'dynamic' if table.dynamic else 'sharded'}; the cache "
                                 "assigns rows itself: build it with use_hashtable=False (dynamic=False) and "
                                 "sharding='replicated'")
            if table.capacity < self.capacity:
                raise ValueError(f"device_capacity_rows={self.capacity} is more than table {table.name!r} holds "
                                 f"({table.capacity} rows)")
        if not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        self.slots = {table.name: [(v, int(np.prod(v.shape[1:]))) for v in table.optimizer_slots(self.optimizer)]
                      for table in self.tables}
        self.widths = {table.name: table.dim + sum(w for _, w in self.slots[table.name]) for table in self.tables}
        ps.ensure_tables(self.widths)
        self._index: KeyIndex | None = None  # the active pass's keys
        self._before: dict[str, np.ndarray] = {}  # the server's rows of the active pass, to find changes
        self._known: tuple[KeyIndex, dict[str, np.ndarray]] | None = None  # the server's rows of the last pass
        self._prefetch: tuple[np.ndarray, KeyIndex | None, Prefetch] | None = None
        self._updated: dict[str, list[np.ndarray]] = {name: [] for name in self.widths}
        self.history: list[dict[str, float]] = []
        self._pushed = False  # whether the active pass pushed rows (a sync before its end)
        self._mark = 0  # incremental models written so far: the marks of its deltas
        if train_from_scratch:
            sizes = {name: ps.size(name) for name in self.widths}  # one scan of each table
            held = {name: n for name, n in sizes.items() if n}
            if held:
                raise ValueError(f"train_from_scratch=True but the parameter server already holds rows {held}; "
                                 "pass train_from_scratch=False to continue from them, or use a new store")
        elif self.dest is not None:
            self._load_params(self.dest, report=False)  # (where the model starts: no change to report)

    # ------------------------------------------------------------------ layout
    def _read(self, table: Any, n: int) -> np.ndarray:
        """Server rows of the device table's rows ``0 .. n-1``."""
        return self._pack(table, table.read(np.arange(n), self.optimizer))

    def _write(self, table: Any, rows: np.ndarray) -> None:
        """Server `rows` into the device table's rows ``0 .. n-1`` (a scatter of n rows; a slice
        assign costs ~3x)."""
        table.write(np.arange(len(rows)), self._unpack(table, rows), self.optimizer)

    def _pack(self, table: Any, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """A server row per key: the vector, then each optimizer slot flattened."""
        n = len(arrays["vectors"])
        parts = [arrays["vectors"]] + [np.asarray(arrays[f"slot_{j}"]).reshape(n, -1) if f"slot_{j}" in arrays
                                       else np.zeros((n, width), np.float32)
                                       for j, (_, width) in enumerate(self.slots[table.name])]
        return np.concatenate([np.asarray(p, np.float32) for p in parts], 1)

    def _unpack(self, table: Any, rows: np.ndarray) -> dict[str, np.ndarray]:
        widths = [table.dim] + [w for _, w in self.slots[table.name]]
        parts = np.split(rows, np.cumsum(widths)[:-1], axis=1)
        out = {"vectors": parts[0]}
        for j, ((slot, _), part) in enumerate(zip(self.slots[table.name], parts[1:])):
            out[f"slot_{j}"] = part.reshape(len(rows), *slot.shape[1:]).astype(slot.dtype)
        return out

    # ------------------------------------------------------------------ passes
    @property
    def active(self) -> bool:
        return self._index is not None

    def update(self, keyset: Any) -> None:
        """Load the rows of `keyset` (an int64 array or a keyset file) into the device tables."""
        if self.active:
            raise RuntimeError("a pass is active: call write_back() before update() loads the next keyset")
        keys = self._checked_keyset(keyset)
        start = time.perf_counter()
        index, known = KeyIndex(keys), self._known
        pos = known[0].lookup(keys) if known is not None else np.full(len(keys), -1, np.int64)
        old = pos >= 0  # rows the cache holds from the last pass, as the server has them
        pulled = self._prefetched(keys)
        if pulled is None:
            pulled = self._pull_rows(keys[~old])
        rows = {}
        for table in self.tables:
            if old.any():
                rows[table.name] = np.empty((len(keys), self.widths[table.name]), np.float32)
                rows[table.name][old] = known[1][table.name][pos[old]]
                rows[table.name][~old] = pulled[table.name]
            else:
                rows[table.name] = pulled[table.name]
            self._write(table, rows[table.name])
        self._index, self._before, self._known = index, rows, (index, rows)
        self._pushed = False
        self.history.append({"keys": len(keys), "pull_s": time.perf_counter() - start, "write_back_s": 0.0})

    def prefetch(self, keyset: Any) -> None:
        """Start pulling the rows of the next pass's `keyset` in the background (call it after `update`).

        The next `update` of the same keys takes them from there; an `update` of other keys drops
        them. Only keys outside the active pass are pulled: a write-back pushes that pass's keys
        only, so the server's rows of the others cannot change before the next `update`, which
        takes the rows of keys in both passes from this pass's write-back.
        """
        keys = self._checked_keyset(keyset)
        self._cancel_prefetch()
        exclude = self._known[0] if self._known is not None else None
        rest = keys if exclude is None else keys[exclude.lookup(keys) < 0]
        self._prefetch = (keys, exclude, Prefetch(self._pull_rows, rest))

    def _prefetched(self, keys: np.ndarray) -> dict[str, np.ndarray] | None:
        """The rows a `prefetch` of `keys` pulled, if it still holds; None otherwise."""
        if self._prefetch is None:
            return None
        wanted, exclude, job = self._prefetch
        self._prefetch = None
        if exclude is not (self._known[0] if self._known is not None else None) or not np.array_equal(wanted, keys):
            job.cancel()
            return None
        return job.result()

    def _cancel_prefetch(self) -> None:
        if self._prefetch is not None:
            self._prefetch[2].cancel()
            self._prefetch = None

    def _pull_rows(self, keys: np.ndarray) -> dict[str, np.ndarray]:
        """``{table: rows}`` of `keys` from the server; keys it lacks get initial vectors, zero state."""
        out = {}
        for table in self.tables:
            rows, found = self.ps.pull(table.name, keys)
            if not found.all():
                rows[~found, :table.dim] = table.initial_values(keys[~found])
            out[table.name] = rows
        return out

    def _checked_keyset(self, keyset: Any) -> np.ndarray:
        keys = as_keys(keyset)
        if len(keys) > self.capacity:
            raise ValueError(f"the keyset holds {len(keys):,} keys but device_capacity_rows={self.capacity:,}: "
                             "split the file, or give the layers and the cache more rows")
        return keys

    def remap(self, keys: Any) -> np.ndarray:
        """Rows of `keys` (any shape) in the active keyset; keys outside it are an error."""
        index = self._index  # once: loader threads call this while the main thread may end the pass
        if index is None:
            raise RuntimeError("no active pass: call update(keyset) first")
        keys = np.asarray(keys, dtype=np.int64)
        pos = index.lookup(keys)
        bad = pos < 0
        if bad.any():
            missing = np.unique(keys[bad])
            raise KeyError(f"{len(missing)} keys are not in the active keyset (e.g. {missing[:5].tolist()}): is the "
                           "keyset from another dataset, or are the key offsets of the columns wrong?")
        return pos

    def transform(self, offsets: Mapping[str, int]) -> KeysetRemap:
        """A `ParquetLoader` transform mapping ``{column: key offset}`` columns through `remap`."""
        return KeysetRemap(self, offsets)

    def _sync(self) -> None:
        start, keys = time.perf_counter(), self._index.keys
        updates, changed = {}, {}
        for table in self.tables:
            rows = self._read(table, len(keys))
            changed[table.name] = keys[(rows[:, :table.dim] != self._before[table.name][:, :table.dim]).any(axis=1)]
            updates[table.name] = (keys, rows)
        self.ps.push_tables(updates)  # all tables or none (rows that are not finite: none, and the pass stays)
        for name, keys_changed in changed.items():
            self._updated[name].append(keys_changed)
        self._before = {name: rows for name, (_, rows) in updates.items()}
        self._known = (self._index, self._before)
        self._pushed = True
        self.history[-1]["write_back_s"] += time.perf_counter() - start

    def write_back(self) -> None:
        """Push the active pass's rows (vectors and optimizer state) to the server; end the pass."""
        if not self.active:
            raise RuntimeError("no active pass to write back: call update(keyset) first")
        self._sync()
        self._index, self._before = None, {}

    def discard(self) -> None:
        """End the active pass without writing it back (after an evaluation-only pass).

        Its record leaves `history`, unless `get_incremental_model` or `save_params_to_files`
        pushed its rows before the end (those stay on the server). Without an active pass,
        nothing happens.
        """
        if self.active and not self._pushed:
            self.history.pop()
        self._index, self._before = None, {}
