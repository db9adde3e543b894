"""Parameter servers: the full embedding tables, key -> row, outside the model.

A row is a table's vector followed by its optimizer state for that key (Adam's ``m | v``, say),
float32, ``width`` wide; the training cache decides the layout, the server only stores rows.
Every call works on whole batches of keys, and `push` is all or nothing.

* `HostMemoryPS`: rows in a NumPy array per table, found through a ``kernels.key_index.KeyIndex``
  of the table's keys (a push merges its new keys in with one insert). A hash table whose NumPy
  insert works in probe rounds and rehashes every key when it grows was slower on the
  benchmark's passes (``benchmarks/training_cache.py``, 40-60% of a pass's keys new), for pushes
  and pulls alike. The merge copies the key arrays (16 bytes a key), so a push grows with the
  table.
* `DiskPS` (`sok_tutorial.cache.disk_ps`): rows in RocksDB, one record per key.

Calls are serialised by a lock: the training cache pulls the next keyset in a background
thread while it pushes the current one.

Example:
    >>> import numpy as np
    >>> ps = HostMemoryPS()
    >>> ps.ensure_table("deep", width=3)
    >>> ps.push("deep", np.array([7, -2]), np.array([[1, 1, 1], [2, 2, 2]], np.float32))
    >>> rows, found = ps.pull("deep", np.array([-2, 5]))
    >>> rows.tolist(), found.tolist()
    ([[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]], [True, False])
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from kernels import checks
from kernels.key_index import KeyIndex
from kernels.rows import gather_rows, scatter_rows


def _keys(keys: Any) -> np.ndarray:
    keys = np.asarray(keys)
    if keys.dtype.kind not in "iu":
        raise TypeError(f"keys must be integers, got dtype {keys.dtype}")
    checks.int64_range("keys", keys)
    return keys.astype(np.int64, copy=False).reshape(-1)


class ParameterServer:
    """Tables of float32 rows by int64 key. Subclasses store them; this class checks arguments."""

    def __init__(self) -> None:
        self.widths: dict[str, int] = {}
        self._lock = threading.RLock()  # the training cache pulls in a background thread while it pushes

    def ensure_table(self, name: str, width: int) -> None:
        """Declare table `name` with rows `width` floats wide (again: the width must match)."""
        self.ensure_tables({name: width})

    def ensure_tables(self, widths: dict[str, int]) -> None:
        """Declare each table of `widths` (``{name: row width}``), all or none: every name and width
        is checked against the store before the first new table is created."""
        self._check_open()
        for name, width in widths.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"table name={name!r} is invalid: expected a non-empty str (a store gives its tables "
                                 "back by name, as str)")
            checks.positive_int("width", width)
        clash = [f"table {name!r} holds rows of width {self.widths[name]}, not {width}"
                 for name, width in widths.items() if self.widths.get(name, width) != width]
        if clash:
            raise ValueError("; ".join(clash) + " (a model or optimizer with other slots than the one that wrote this "
                             "parameter server?)")
        for name, width in widths.items():
            if name not in self.widths:
                self._create(name, int(width))  # first: a store that cannot record the table does not list it
                self.widths[name] = int(width)

    def _check_open(self) -> None:
        """Raise if the store was closed (subclasses that hold a resource say so)."""

    def _width(self, name: str) -> int:
        self._check_open()
        if name not in self.widths:
            raise KeyError(f"no table {name!r} in this parameter server (tables: {sorted(self.widths)})")
        return self.widths[name]

    def pull(self, name: str, keys: Any) -> tuple[np.ndarray, np.ndarray]:
        """(rows ``[n, width]``, found ``[n]``) for `keys`; absent keys get zero rows."""
        width, keys = self._width(name), _keys(keys)
        with self._lock:
            self._check_open()  # (closed meanwhile by another thread?)
            return self._pull(name, keys, width)

    def _checked(self, name: str, keys: Any, rows: Any) -> tuple[np.ndarray, np.ndarray]:
        width, keys = self._width(name), _keys(keys)
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.shape != (len(keys), width):
            raise ValueError(f"push to {name!r}: rows have shape {rows.shape}, expected ({len(keys)}, {width})")
        if not bool(np.all(keys[1:] > keys[:-1])) and len(np.unique(keys)) != len(keys):  # sorted: unique
            raise ValueError(f"push to {name!r}: keys must be unique")
        bad = ~np.isfinite(rows).all(axis=1)
        if bad.any():  # (a NaN stored would be served, and trained on, from then on)
            raise ValueError(f"push to {name!r}: the rows of {int(bad.sum())} keys hold NaN or inf (keys "
                             f"{keys[bad][:5].tolist()}{' ...' if bad.sum() > 5 else ''}): expected finite values (did "
                             "training diverge?); nothing was written")
        return keys, rows

    def push(self, name: str, keys: Any, rows: Any) -> None:
        """Insert or overwrite the rows of `keys` (unique), all or nothing."""
        self.push_tables({name: (keys, rows)})

    def push_tables(self, updates: dict[str, tuple[Any, Any]]) -> None:
        """Push several tables at once: ``{name: (keys, rows)}``, all or nothing across tables."""
        checked = {name: self._checked(name, keys, rows) for name, (keys, rows) in updates.items()}
        with self._lock:
            self._push_all(checked)

    def replace_tables(self, updates: dict[str, tuple[Any, Any]]) -> None:
        """Make each table of `updates` (``{name: (keys, rows)}``) hold exactly these rows: its
        other keys are deleted. All or nothing across tables, as `push_tables` (a rollback to a
        save: keys first pushed after it do not stay behind with their newer rows).

        Example:
            >>> ps = HostMemoryPS()
            >>> ps.ensure_table("t", 1)
            >>> ps.push("t", [1, 2], [[1.0], [2.0]])
            >>> ps.replace_tables({"t": ([2, 3], [[20.0], [30.0]])})
            >>> ps.keys("t").tolist(), ps.pull("t", [1, 2])[0].ravel().tolist()
            ([2, 3], [0.0, 20.0])
        """
        checked = {name: self._checked(name, keys, rows) for name, (keys, rows) in updates.items()}
        with self._lock:
            self._check_open()
            self._replace_all(checked)

    def keys(self, name: str) -> np.ndarray:
        """Every key of table `name`, sorted."""
        self._width(name)
        with self._lock:
            return np.sort(self._all_keys(name))

    def size(self, name: str) -> int:
        return len(self.keys(name))

    def close(self) -> None:
        pass

    def __enter__(self) -> ParameterServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # subclasses
    def _create(self, name: str, width: int) -> None:
        raise NotImplementedError

    def _pull(self, name: str, keys: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _push_all(self, updates: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        raise NotImplementedError

    def _replace_all(self, updates: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        raise NotImplementedError

    def _all_keys(self, name: str) -> np.ndarray:
        raise NotImplementedError


class HostMemoryPS(ParameterServer):
    """Tables in host memory: a `KeyIndex` from key to store row, rows in a growing NumPy array."""

    def __init__(self, initial_rows: int = 1 << 16):
        super().__init__()
        self.initial_rows = checks.positive_int("initial_rows", initial_rows)
        self._index: dict[str, KeyIndex] = {}  # key -> its row of the store
        self._rows: dict[str, np.ndarray] = {}

    def _create(self, name: str, width: int) -> None:
        self._index[name] = KeyIndex(np.zeros(0, np.int64))
        self._rows[name] = np.zeros((self.initial_rows, width), np.float32)

    def _pull(self, name: str, keys: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        slots = self._index[name].lookup(keys)
        found = slots >= 0
        if found.all():
            return gather_rows(self._rows[name], slots, out=np.empty((len(keys), width), np.float32)), found
        rows = np.zeros((len(keys), width), np.float32)
        rows[found] = gather_rows(self._rows[name], slots[found])
        return rows, found

    def _push_all(self, updates: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Allocate everything (grown stores, merged key arrays) first, then write: all or nothing."""
        staged = {}
        for name, (keys, rows) in updates.items():
            index, store = self._index[name], self._rows[name]
            slots = index.lookup(keys)
            new = slots < 0
            size, added = len(index), int(new.sum())
            slots[new] = np.arange(size, size + added)
            if size + added > len(store):
                grown = np.zeros((max(size + added, 2 * len(store)), store.shape[1]), np.float32)
                grown[:size] = store[:size]
                store = grown
            staged[name] = (store, slots, rows, index.insert(keys[new], slots[new]))
        for name, (store, slots, rows, index) in staged.items():
            scatter_rows(store, slots, rows)
            self._rows[name], self._index[name] = store, index

    def _replace_all(self, updates: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """New stores and indexes for every table first, then swapped in: all or nothing."""
        staged = {}
        for name, (keys, rows) in updates.items():
            store = np.zeros((max(len(keys), self.initial_rows), rows.shape[1]), np.float32)
            store[:len(keys)] = rows
            staged[name] = (store, KeyIndex(keys))  # key i: row i
        for name, (store, index) in staged.items():
            self._rows[name], self._index[name] = store, index

    def _all_keys(self, name: str) -> np.ndarray:
        return self._index[name].keys.copy()

    def nbytes(self) -> int:
        return int(sum(r[: len(self._index[n])].nbytes for n, r in self._rows.items()))
