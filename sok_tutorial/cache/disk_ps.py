"""The on-disk parameter server: `DiskPS`, tables in a RocksDB directory.

Rows in RocksDB (through ``rocksdict``), one record per key. A `push` is one
``WriteBatch``: RocksDB applies it atomically and logs it to its write-ahead log before
returning, so a process killed at any moment reopens with every completed push and no part
of an interrupted one. It also keeps each table's keys in memory in a `KeyIndex` (16 bytes a
key: a scan of the store reads them on first use, every push merges its new keys after RocksDB
took it), so a pull asks RocksDB only for keys the table holds. A RocksDB point lookup costs
about as much whether the key exists or not, and a pass brings many new keys (40-60% of what
the training cache pulls in the benchmark), so this shortens a pull by the lookups of every
key the table does not hold. Record keys and values are built in NumPy (``tolist`` of a void
view), not by slicing bytes in Python.

Why RocksDB rather than LMDB: both are embedded, crash-safe, with maintained Python bindings,
and ``benchmarks/training_cache.py`` measures both on the cache's access pattern (one batch write
of a pass's rows, a shuffled batch read back; ``store_*`` rows of
``build/bench/training_cache.json``). On our 2-core machine LMDB was about 1.5-3x faster at that
size, both in the hundreds of thousands of rows/s. We still store in RocksDB, for what a table
larger than memory needs and a micro-benchmark does not show: LMDB memory-maps a file whose
largest size is fixed when it is opened (a full map fails a write half-way through a pass, and
growing it needs every reader closed); it copies a B-tree page per updated key, where RocksDB
appends a pass's batch to its log and compacts in the background; and RocksDB can compress. The
per-pass cost this choice adds is in the benchmark's ``pull_s_per_pass`` / ``write_back_s_per_pass``.

Example:
    >>> import tempfile
    >>> with DiskPS(tempfile.mkdtemp()) as ps:
    ...     ps.ensure_table("deep", width=2)
    ...     ps.push("deep", [7], [[1.0, 2.0]])
    ...     ps.pull("deep", [7, 8])[1].tolist()
    [True, False]
"""
from __future__ import annotations

import collections
import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from kernels.key_index import KeyIndex
from sok_tutorial.cache.ps import ParameterServer


class PSLocked(RuntimeError):
    """The on-disk store is opened by another process."""


class DiskPS(ParameterServer):
    """Tables in a RocksDB directory: record key = table id + big-endian int64, value = the row.

    The sorted keys of every table stay in memory (8 bytes a key) so that pulls skip absent keys.

    Args:
        path: the store's directory (created if missing; reopened with its tables if present).
        sync: fsync the write-ahead log on every push (survives power loss, not only a crash of
            this process; slower).
    """

    _META = b"\x00meta"

    def __init__(self, path: str | os.PathLike, *, sync: bool = False):
        super().__init__()
        from rocksdict import Options, Rdict, WriteOptions

        if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
            raise ValueError(f"DiskPS path={path!r} is invalid: expected the path of a directory for the store")
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(f"DiskPS path={str(self.path)!r} is a file; expected a directory for the store "
                                     "(new or one a DiskPS wrote)")
        if self.path.is_dir() and any(self.path.iterdir()) and not (self.path / "CURRENT").is_file():
            raise FileExistsError(f"DiskPS path={str(self.path)!r} holds other files; expected a new directory or "
                                  "one a DiskPS wrote (RocksDB's CURRENT is missing)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._options = Options(raw_mode=True)
        self._options.create_if_missing(True)
        self._closed, self._failed = False, False  # close() was called; a write hit a full disk
        self._db = self._open(Rdict)
        self._write_options = WriteOptions()
        self._write_options.sync = bool(sync)
        meta = self._db.get(self._META)
        self._tables: dict[str, int] = {}
        self._present: dict[str, KeyIndex] = {}  # each table's keys; read by one scan on first use
        if meta is not None:
            for name, (table_id, width) in json.loads(meta.decode()).items():
                self._tables[name], self.widths[name] = table_id, width

    def _open(self, rdict: Any = None) -> Any:
        if rdict is None:
            from rocksdict import Rdict as rdict
        try:
            return rdict(str(self.path), self._options)
        except Exception as exc:  # rocksdict raises a bare Exception carrying RocksDB's status
            if "lock" in str(exc).lower():
                raise PSLocked(f"DiskPS path={str(self.path)!r} is locked: another process (or another DiskPS in "
                               f"this one) has it open; close that one first ({exc})") from exc
            if _no_space(exc):
                raise OSError(errno.ENOSPC, f"DiskPS {str(self.path)!r}: disk full; the store cannot be reopened "
                              f"until there is room (RocksDB: {exc})") from exc
            raise

    def _check_open(self) -> None:
        if getattr(self, "_closed", True):
            raise RuntimeError(f"DiskPS(path={str(self.path)!r}) is closed; open a new DiskPS on the path")
        if self._db is None:  # a reopen after a full disk failed: try again
            with self._lock:
                if self._db is None and not self._closed:
                    self._recover()

    def _recover(self) -> None:
        """After a write failed for lack of space, RocksDB refuses every later write, even once there
        is room: close it (its log holds every write that succeeded) and open it again. Reads go on
        meanwhile; the next write (under the lock) does this first."""
        if self._closed:
            raise RuntimeError(f"DiskPS(path={str(self.path)!r}) is closed; open a new DiskPS on the path")
        if self._db is not None:
            try:
                self._db.close()
            except Exception:  # the writer's earlier error, reported again
                pass
            self._db = None
        self._db = self._open()
        self._failed = False

    def _prefix(self, name: str) -> bytes:
        return b"t" + self._tables[name].to_bytes(2, "big")

    def _record_keys(self, name: str, keys: np.ndarray) -> list[bytes]:
        records = np.empty((len(keys), 11), np.uint8)  # built in NumPy; one bytes object per key by tolist()
        records[:, :3] = np.frombuffer(self._prefix(name), np.uint8)
        records[:, 3:] = keys.astype(">i8").view(np.uint8).reshape(-1, 8)
        return records.view("V11").reshape(-1).tolist()

    def _create(self, name: str, width: int) -> None:
        from rocksdict import WriteBatch

        table_id = len(self._tables)
        meta = {**{n: (self._tables[n], self.widths[n]) for n in self._tables}, name: (table_id, width)}
        batch = WriteBatch(raw_mode=True)
        batch.put(self._META, json.dumps(meta).encode())
        with self._lock:
            self._write(batch)  # a full disk: OSError, and the table is not created
        self._tables[name] = table_id
        self._present[name] = KeyIndex(np.zeros(0, np.int64))

    def _keys_held(self, name: str) -> KeyIndex:
        if name not in self._present:
            self._present[name] = KeyIndex(self._scan_keys(name))
        return self._present[name]

    def _pull(self, name: str, keys: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        found = self._keys_held(name).contains(keys)
        if not found.any():
            return np.zeros((len(keys), width), np.float32), found
        values = self._db[self._record_keys(name, keys[found] if not found.all() else keys)]
        if values.count(None):
            raise RuntimeError(f"DiskPS {str(self.path)!r}: table {name!r} lacks {values.count(None)} keys it held "
                               "(was the store written by another program?)")
        rows = np.frombuffer(bytearray().join(values), np.float32).reshape(-1, width)  # writable: a bytearray
        if found.all():
            return rows, found
        out = np.zeros((len(keys), width), np.float32)
        out[found] = rows
        return out, found

    def _batch(self, name: str, keys: np.ndarray, rows: np.ndarray, batch: Any) -> None:
        values = rows.view(f"V{rows.shape[1] * 4}").reshape(-1).tolist()  # one bytes object per row
        collections.deque(map(batch.put, self._record_keys(name, keys), values), maxlen=0)  # no Python loop body

    def _push_all(self, updates: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """All tables' rows in one atomic ``WriteBatch``."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for name, (keys, rows) in updates.items():
            self._keys_held(name)  # before the write, so that a scan cannot fail after it
            self._batch(name, keys, rows, batch)
        self._write(batch)
        for name, (keys, _) in updates.items():
            held = self._present.pop(name)  # rebuilt by a scan should the merge fail
            new = keys[~held.contains(keys)]
            self._present[name] = held.insert(new, np.arange(len(held), len(held) + len(new)))

    def _replace_all(self, updates: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """One atomic ``WriteBatch``: the deletes of every table's keys not in its update, then its rows."""
        from rocksdict import WriteBatch

        batch, kept = WriteBatch(raw_mode=True), {}
        for name, (keys, rows) in updates.items():
            held, kept[name] = self._keys_held(name).keys, KeyIndex(keys)
            collections.deque(map(batch.delete, self._record_keys(name, held[~kept[name].contains(held)])), maxlen=0)
            self._batch(name, keys, rows, batch)
        self._write(batch)
        self._present.update(kept)

    def _write(self, batch: Any) -> None:  # (under self._lock)
        self._check_open()
        if self._failed:
            self._recover()
        try:
            self._db.write(batch, self._write_options)
        except Exception as exc:
            if _no_space(exc):
                self._failed = True
                raise OSError(errno.ENOSPC, f"DiskPS {str(self.path)!r}: disk full; the push was not applied "
                              f"(RocksDB: {exc})") from exc
            raise

    def _all_keys(self, name: str) -> np.ndarray:
        return self._keys_held(name).keys.copy()

    def _scan_keys(self, name: str) -> np.ndarray:
        prefix, out = self._prefix(name), []
        for key in self._db.keys(from_key=prefix):
            if not key.startswith(prefix):
                break
            out.append(key[3:])
        return np.frombuffer(b"".join(out), ">i8").astype(np.int64) if out else np.zeros(0, np.int64)

    def close(self) -> None:
        """Close the store; every push that returned is on disk (calling close again does nothing)."""
        with self._lock:
            db, self._db, self._closed = getattr(self, "_db", None), None, True
            if db is None:
                return
            try:
                db.close()
            except Exception as exc:
                if not self._failed:  # after a full disk RocksDB repeats that error; its log is whole
                    raise OSError(f"DiskPS {str(self.path)!r}: closing failed (RocksDB: {exc})") from exc


def _no_space(exc: BaseException) -> bool:
    return "No space" in str(exc) or "ENOSPC" in str(exc)
