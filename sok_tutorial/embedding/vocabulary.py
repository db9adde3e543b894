"""Dynamic vocabularies and key-seeded initial values.

`DynamicVocabulary` gives every new int64 key a row of an embedding table on first sight, backed
by ``kernels.hash_table.HashTable``. `keyed_initial_values` draws a key's initial vector from a
hash of the key itself: a key starts from the same vector whichever row it lands in, whichever
replica or shard meets it first, and however the table is split, so 1, 2 or 4 replicas train
identically.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import checks
from kernels.hash_table import HashTable
from kernels.hashing import mix64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SUPPORTED = "RandomUniform, RandomNormal, TruncatedNormal, Zeros, Ones, Constant (or their names)"


@dataclass(frozen=True)
class InitSpec:
    """An initializer reduced to what `keyed_initial_values` needs."""

    kind: str  # "uniform" | "normal" | "truncated_normal" | "constant"
    a: float = 0.0  # minval | mean | value
    b: float = 0.0  # maxval | stddev
    seed: int = 0


def init_spec(initializer: Any) -> InitSpec:
    """Read a Keras initializer (object, class name or ``{"class_name", "config"}``) as an `InitSpec`.

    Example:
        >>> init_spec("random_uniform")
        InitSpec(kind='uniform', a=-0.05, b=0.05, seed=0)
    """
    if initializer is None:
        initializer = "random_uniform"
    if isinstance(initializer, InitSpec):
        return initializer
    if isinstance(initializer, dict):
        name, config = initializer.get("class_name", ""), dict(initializer.get("config", {}))
    elif isinstance(initializer, str):
        name, config = initializer, {}
    else:
        name, config = type(initializer).__name__, dict(initializer.get_config())
    key = name.replace("_", "").lower()
    seed = config.get("seed")
    seed = 0 if not isinstance(seed, int) else seed
    if key in ("randomuniform", "uniform"):
        return InitSpec("uniform", float(config.get("minval", -0.05)), float(config.get("maxval", 0.05)), seed)
    if key in ("randomnormal", "normal"):
        return InitSpec("normal", float(config.get("mean", 0.0)), float(config.get("stddev", 0.05)), seed)
    if key == "truncatednormal":
        return InitSpec("truncated_normal", float(config.get("mean", 0.0)), float(config.get("stddev", 0.05)), seed)
    if key == "zeros":
        return InitSpec("constant", 0.0)
    if key == "ones":
        return InitSpec("constant", 1.0)
    if key == "constant":
        return InitSpec("constant", float(config.get("value", 0.0)))
    raise ValueError(f"embedding_initializer={initializer!r} is not supported: embedding tables draw initial "
                     f"values from each key, for these initializers: {_SUPPORTED}")


def _uniforms(keys: np.ndarray, dim: int, seed: int, stream: int) -> np.ndarray:
    """[n, dim] float64 in (0, 1), a pure function of (key, column, seed, stream)."""
    base = mix64(keys.astype(np.int64).view(np.uint64) ^ mix64(np.array([seed * 4 + stream], np.uint64))[0])
    with np.errstate(over="ignore"):
        grid = base[:, None] + (np.arange(1, dim + 1, dtype=np.uint64) * _GOLDEN)[None, :]
    bits = mix64(grid.reshape(-1)) >> np.uint64(11)
    return ((bits.astype(np.float64) + 0.5) * 2.0**-53).reshape(len(keys), dim)


def keyed_initial_values(keys: np.ndarray, dim: int, spec: InitSpec) -> np.ndarray:
    """Initial vectors ``[len(keys), dim]`` (float32), each a pure function of its key.

    Example:
        >>> v = keyed_initial_values(np.array([7, 7, 8]), 4, init_spec("random_uniform"))
        >>> bool((v[0] == v[1]).all()), bool((v[0] != v[2]).any()), bool((abs(v) <= 0.05).all())
        (True, True, True)
    """
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    if spec.kind == "constant":
        return np.full((len(keys), dim), spec.a, np.float32)
    if spec.kind == "uniform":
        return (spec.a + (spec.b - spec.a) * _uniforms(keys, dim, spec.seed, 0)).astype(np.float32)
    z = _normal(keys, dim, spec.seed, 0)
    if spec.kind == "truncated_normal":  # redraw values beyond two standard deviations
        for stream in range(1, 9):
            far = np.abs(z) > 2
            if not far.any():
                break
            z = np.where(far, _normal(keys, dim, spec.seed, stream), z)
        z = np.clip(z, -2, 2)
    return (spec.a + spec.b * z).astype(np.float32)


def _normal(keys: np.ndarray, dim: int, seed: int, stream: int) -> np.ndarray:
    u1, u2 = _uniforms(keys, dim, seed, 2 * stream + 1), _uniforms(keys, dim, seed, 2 * stream + 2)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


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
