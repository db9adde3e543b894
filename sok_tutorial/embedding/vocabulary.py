"""Dynamic vocabularies: `DynamicVocabulary` gives every new int64 key a row of an embedding
table on first sight, backed by ``kernels.hash_table.HashTable``."""
from __future__ import annotations

import threading

import numpy as np

from kernels import checks
from kernels.hash_table import HashTable


class VocabularyExhausted(RuntimeError):
    """More distinct keys than the table has rows."""


class DynamicVocabulary:
    """int64 key -> table row, assigned on first sight; thread-safe (replicas share one).

    Args:
        capacity: rows available; one key more is a `VocabularyExhausted` error naming both.
        name: used in error messages.

    Example:
        >>> vocab = DynamicVocabulary(capacity=3, name="items")
        >>> rows, fresh_rows, fresh_keys = vocab.lookup_or_insert(np.array([900, -5, 900]))
        >>> rows.tolist(), fresh_keys.tolist(), len(vocab)
        ([1, 0, 1], [-5, 900], 2)
    """

    def __init__(self, capacity: int, *, name: str = "embedding"):
        self.capacity = checks.positive_int("capacity", capacity)
        self.name = name
        self._table = HashTable(capacity=min(2 * capacity, 1 << 16))
        self.lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._table)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Rows of `keys`, ``-1`` for keys never seen (nothing is inserted)."""
        with self.lock:
            return self._table.lookup(np.asarray(keys, dtype=np.int64))

    def lookup_or_insert(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows of `keys`, rows created by this call, their keys); new keys are numbered in
        sorted key order."""
        keys = np.asarray(keys, dtype=np.int64)
        with self.lock:
            rows = self._table.lookup(keys)
            missing = rows < 0
            if not missing.any():
                return rows, np.zeros(0, np.int64), np.zeros(0, np.int64)
            fresh_keys = np.unique(keys[missing])
            if len(self) + len(fresh_keys) > self.capacity:
                raise VocabularyExhausted(
                    f"{self.name}: vocabulary exhausted: {len(self) + len(fresh_keys):,} distinct keys need rows but "
                    f"max_vocabulary_size_per_gpu={self.capacity:,}; raise it, or hash keys into fewer buckets "
                    "(HashBucket) before the layer")
            rows = self._table.lookup_or_insert(keys)
            fresh_rows = self._table.lookup(fresh_keys)
            return rows, fresh_rows, fresh_keys

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows), ordered by row."""
        with self.lock:
            return self._table.keys().copy(), self._table.values().copy()

    def restore(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Replace the mapping by ``keys[i] -> rows[i]`` (as saved by `export`)."""
        keys, rows = np.asarray(keys, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        if len(keys) != len(rows) or len(keys) > self.capacity or (len(rows) and rows.max() >= self.capacity):
            raise ValueError(f"{self.name}: cannot restore {len(keys)} keys into a vocabulary of "
                             f"{self.capacity} rows")
        if len(rows) and not np.array_equal(np.sort(rows), np.arange(len(rows))):
            raise ValueError(f"{self.name}: restored rows must be 0..n-1 without gaps")
        with self.lock:
            self._table = HashTable(capacity=max(2 * len(keys), 1 << 10))
            self._table.insert(keys, rows)
