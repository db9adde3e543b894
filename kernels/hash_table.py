"""HashTable: an open-addressing map from int64 keys to int64 values, on NumPy or CuPy.

Any int64 is a key (0, negatives and ``2**63 - 1`` included): slot occupancy is kept apart from
the keys. The start slot of a key is ``mix64(key) & (capacity - 1)``; collisions probe the next
slot. The table doubles before its load factor passes 1/2. The NumPy implementation works on
all keys of a call at once, in rounds (one round per probe step), never key by key in Python;
the CUDA implementation (``hash_table.cu``) gives every key a thread.

``lookup_or_insert`` assigns new keys the values ``len(table), len(table) + 1, ...`` in sorted
key order, so the same calls give the same values on either device.

Example:
    >>> import numpy as np
    >>> table = HashTable(capacity=4)
    >>> table.lookup_or_insert(np.array([42, -7, 42, 2**63 - 1])).tolist()
    [1, 0, 1, 2]
    >>> table.lookup(np.array([-7, 5])).tolist()
    [0, -1]
    >>> len(table), table.capacity
    (3, 8)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kernels import backend, checks
from kernels.hashing import mix64
from kernels.unique import unique

_MIN_CAPACITY = 8


def _power_of_two(n: int) -> int:
    return 1 << max(int(np.ceil(np.log2(max(n, 1)))), 3)


class HashTable:
    """int64 -> int64 map. Args: ``capacity`` (initial slots, grown as needed), ``device``."""

    def __init__(self, capacity: int = 1024, *, device: str = "cpu"):
        checks.positive_int("capacity", capacity)
        self.device = backend.resolve_device(device)
        self.xp = backend.array_module(self.device)
        self._size = 0
        self._allocate(_power_of_two(capacity))

    def _allocate(self, capacity: int) -> None:
        xp = self.xp
        self._keys = xp.zeros(capacity, xp.int64)
        self._values = xp.full(capacity, -1, xp.int64)
        self._state = xp.zeros(capacity, xp.int32)  # 0 empty, 2 full (1 only transiently on the GPU)
        self._mask = capacity - 1

    @property
    def capacity(self) -> int:
        return self._mask + 1

    def __len__(self) -> int:
        return self._size

    # ------------------------------------------------------------------ public API
    def lookup(self, keys: Any) -> Any:
        """Values of `keys` (any shape), ``-1`` where a key is absent."""
        keys = self._keys_in(keys)
        flat = keys.reshape(-1)
        out = self._lookup_cuda(flat) if self.xp is not np else self._lookup_numpy(flat)
        return out.reshape(keys.shape)

    def insert(self, keys: Any, values: Any) -> None:
        """Set ``table[keys[i]] = values[i]``; for a key repeated in one call the last value wins."""
        keys = self._keys_in(keys).reshape(-1)
        values = self.xp.asarray(values, dtype=self.xp.int64).reshape(-1)
        if keys.shape != values.shape:
            raise ValueError(f"insert: {keys.size} keys but {values.size} values")
        if keys.size == 0:
            return
        # keep the last occurrence of each key
        rev_unique, rev_index = self._unique_last(keys)
        self._reserve(self._size + rev_unique.size)
        self._insert_unique(rev_unique, values[rev_index])

    def lookup_or_insert(self, keys: Any) -> Any:
        """Values of `keys`; absent keys are inserted first, numbered from ``len(self)`` in sorted
        key order."""
        keys = self._keys_in(keys)
        found = self.lookup(keys).reshape(-1)
        missing = found < 0
        if bool(missing.any()):  # deduplicate only the absent keys: cheap once the table is warm
            new_keys, inverse, _ = unique(keys.reshape(-1)[missing])
            fresh = self.xp.arange(self._size, self._size + new_keys.size, dtype=self.xp.int64)
            self._reserve(self._size + new_keys.size)
            self._insert_unique(new_keys, fresh)
            found[missing] = fresh[inverse]
        return found.reshape(keys.shape)

    def keys(self) -> Any:
        """All keys, ordered by their values."""
        return self._export()[0]

    def values(self) -> Any:
        """All values, in increasing order (aligned with `keys`)."""
        return self._export()[1]

    # --------------------------------------------------------------------- helpers
    def _keys_in(self, keys: Any) -> Any:
        keys = self.xp.asarray(keys)
        if keys.dtype != self.xp.int64:
            raise TypeError(f"keys have dtype {keys.dtype}, expected int64")
        return keys

    def _unique_last(self, keys: Any) -> tuple[Any, Any]:
        xp = self.xp
        reversed_keys = keys[::-1]
        uniq, first = xp.unique(reversed_keys, return_index=True)
        return uniq, keys.size - 1 - first

    def _export(self) -> tuple[Any, Any]:
        full = self._state == 2
        keys, values = self._keys[full], self._values[full]
        order = self.xp.argsort(values, kind="stable")
        return keys[order], values[order]

    def _reserve(self, size: int) -> None:
        """Grow (rehash) so that `size` entries keep the load factor at most 1/2."""
        if 2 * size <= self.capacity:
            return
        keys, values = self._export()
        self._allocate(_power_of_two(2 * size))
        self._size = 0
        if keys.size:
            self._insert_unique(keys, values)

    def _start(self, keys: Any) -> Any:
        xp = self.xp
        if xp is np:
            return (mix64(keys.view(np.uint64)) & np.uint64(self._mask)).astype(np.int64)
        return None  # the CUDA kernels hash on the device

    # -------------------------------------------------------------------- NumPy
    def _lookup_numpy(self, keys: np.ndarray) -> np.ndarray:
        out = np.full(keys.size, -1, np.int64)
        active = np.arange(keys.size)
        slot = self._start(keys)
        while active.size:
            s = slot[active]
            full = self._state[s] == 2
            hit = full & (self._keys[s] == keys[active])
            out[active[hit]] = self._values[s[hit]]
            go_on = full & ~hit  # occupied by another key: probe the next slot
            active = active[go_on]
            slot[active] = (s[go_on] + 1) & self._mask
        return out

    def _insert_unique(self, keys: Any, values: Any) -> None:
        if self.xp is not np:
            return self._insert_cuda(keys, values)
        active = np.arange(keys.size)
        slot = self._start(keys)
        while active.size:
            s = slot[active]
            full = self._state[s] == 2
            hit = full & (self._keys[s] == keys[active])
            self._values[s[hit]] = values[active[hit]]
            empty = ~full
            # several keys may reach the same empty slot in one round: the first of them claims it
            claim_slots, first = np.unique(s[empty], return_index=True)
            winners = active[empty][first]
            self._keys[claim_slots] = keys[winners]
            self._values[claim_slots] = values[winners]
            self._state[claim_slots] = 2
            self._size += winners.size
            won = np.zeros(active.size, bool)
            won[np.flatnonzero(empty)[first]] = True
            done = hit | won  # keys that lost a claim retry the same slot, now full with the winner
            move = full & ~hit
            slot[active[move]] = (s[move] + 1) & self._mask
            active = active[~done]

    # --------------------------------------------------------------------- CUDA
    def _lookup_cuda(self, keys: Any) -> Any:
        from kernels import _cuda

        out = self.xp.empty(keys.size, self.xp.int64)
        if keys.size:
            _cuda.function("hash_table", "lookup")(
                _cuda.grid(keys.size), (_cuda.THREADS,),
                (self._keys, self._values, self._state, np.uint64(self._mask), keys, out, np.int64(keys.size)))
        return out

    def _insert_cuda(self, keys: Any, values: Any) -> None:
        from kernels import _cuda

        inserted = self.xp.zeros(1, self.xp.uint64)
        _cuda.function("hash_table", "insert")(
            _cuda.grid(keys.size), (_cuda.THREADS,),
            (self._keys, self._values, self._state, np.uint64(self._mask), self.xp.ascontiguousarray(keys),
             self.xp.ascontiguousarray(values), np.int64(keys.size), inserted))
        self._size += int(inserted[0])
