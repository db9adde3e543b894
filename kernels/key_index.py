"""KeyIndex: int64 key -> int64 id through a sorted key array, on NumPy or CuPy.

The one key -> row structure outside the TensorFlow graph. The parameter servers find a key's
store row with it, the training cache maps a pass's keys to device rows, and the loader's
Categorify transform maps raw keys to contiguous ids. (Inside the graph, a dynamic
embedding table has its own index: ``sok_tutorial.embedding.index``.)

An index holds its keys sorted, unique, with the id of each. A lookup takes one of two paths:

* dense: when the keys span at most ``DENSE_FACTOR`` times their number (or ``DENSE_MIN``
  values, 16 MiB), a lookup table over the span answers with one gather per value. The table is
  built on first use: a gather per value instead of a binary search's logarithm of the keyset.
* sparse: otherwise, a binary search (``searchsorted``) and one equality test per value.

Both paths give the same ids; any int64 is a key (``-2**63`` and ``2**63 - 1`` included).
`insert` merges new keys in and returns a new index, leaving this one as it was, so a caller
can stage several changes and commit them together. Merging copies the key arrays (16 bytes a
key), so an insert's time grows with the index, not only with the keys inserted.

The NumPy implementation is the specification. Its CUDA twin is the same code on CuPy arrays:
CuPy's own kernels (``searchsorted``, ``take``, ``argsort``) run it on the device, with no
``.cu`` source of this package. An index lives on the device of its keys, and values must be
looked up on that device.

Example:
    >>> import numpy as np
    >>> index = KeyIndex(np.array([9, -5, 2**63 - 1]), ids=np.array([1, 2, 3]))
    >>> index.lookup(np.array([[-5, 7], [2**63 - 1, 9]])).tolist()
    [[2, -1], [3, 1]]
    >>> index.lookup(np.array([7]), default=0).tolist()
    [0]
    >>> grown = index.insert(np.array([7]), np.array([4]))
    >>> len(index), len(grown), grown.keys.tolist()
    (3, 4, [-5, 7, 9, 9223372036854775807])
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kernels.backend import array_module_of

DENSE_FACTOR = 64  # a dense lookup table holds at most this many entries per key ...
DENSE_MIN = 1 << 21  # ... or this many entries, whatever the number of keys


def _int_keys(xp: Any, keys: Any, name: str) -> Any:
    keys = xp.asarray(keys)
    if keys.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer keys, got dtype {keys.dtype}")
    return keys.astype(xp.int64, copy=False).reshape(-1)


class KeyIndex:
    """Sorted unique int64 keys and the id of each.

    Args:
        keys: 1-D integer array of distinct keys, in any order (NumPy or CuPy).
        ids: int64 ids ``>= 0`` aligned with `keys`; ``None`` gives key ``keys[i]`` the id ``i``.
    """

    def __init__(self, keys: Any, ids: Any = None):
        xp = array_module_of(keys)
        keys = _int_keys(xp, keys, "keys")
        ids = xp.arange(len(keys), dtype=xp.int64) if ids is None else xp.asarray(ids, dtype=xp.int64).reshape(-1)
        if ids.shape != keys.shape:
            raise ValueError(f"ids has {ids.size} entries but keys has {keys.size}")
        if keys.size > 1 and not bool((keys[1:] > keys[:-1]).all()):
            order = xp.argsort(keys, kind="stable")
            keys, ids = keys[order], ids[order]
            if bool((keys[1:] == keys[:-1]).any()):
                raise ValueError(f"keys must be distinct; e.g. {int(keys[1:][keys[1:] == keys[:-1]][0])} repeats")
        self.xp, self.keys, self.ids = xp, keys, ids
        self._table: Any = None  # the dense lookup table, built on first use when the span allows

    @classmethod
    def _sorted(cls, xp: Any, keys: Any, ids: Any) -> KeyIndex:
        index = cls.__new__(cls)
        index.xp, index.keys, index.ids, index._table = xp, keys, ids, None
        return index

    def __len__(self) -> int:
        return int(self.keys.size)

    def _dense(self) -> Any:
        """The dense table ``[span + 1]`` (last entry: absent), or None when the span is too wide."""
        if self._table is None and self.keys.size:
            xp, keys = self.xp, self.keys
            span = int(keys[-1]) - int(keys[0]) + 1
            if span <= max(DENSE_FACTOR * keys.size, DENSE_MIN):
                dtype = xp.int32 if int(self.ids.max()) < 2**31 - 1 else xp.int64
                table = xp.full(span + 1, -1, dtype)
                table[keys - keys[0]] = self.ids.astype(dtype)
                self._table = table
            else:
                self._table = False
        return self._table if self._table is not False else None

    def lookup(self, values: Any, default: int = -1) -> Any:
        """int64 ids of `values` (any shape, same device as the index); `default` for absent keys."""
        xp = self.xp
        values = xp.asarray(values)
        if values.dtype.kind not in "iu":
            raise TypeError(f"values must be integer keys, got dtype {values.dtype}")
        values = values.astype(xp.int64, copy=False)
        if not self.keys.size:
            return xp.full(values.shape, default, xp.int64)
        table = self._dense()
        if table is not None:  # the int64 difference wraps; as unsigned, values outside are >= span
            offset = (values - self.keys[0]).view(xp.uint64)
            out = table[xp.minimum(offset, xp.uint64(table.size - 1))].astype(xp.int64, copy=False)
            return out if default == -1 else xp.where(out < 0, default, out)
        pos = xp.minimum(xp.searchsorted(self.keys, values), self.keys.size - 1)
        return xp.where(self.keys[pos] == values, self.ids[pos], default)

    def contains(self, values: Any) -> Any:
        """Whether each of `values` is a key of the index."""
        return self.lookup(values) >= 0

    def insert(self, keys: Any, ids: Any) -> KeyIndex:
        """A new index with `keys` (distinct, none of them present) added with `ids`."""
        xp = self.xp
        keys = _int_keys(xp, keys, "keys")
        ids = xp.asarray(ids, dtype=xp.int64).reshape(-1)
        if ids.shape != keys.shape:
            raise ValueError(f"ids has {ids.size} entries but keys has {keys.size}")
        if not keys.size:
            return self
        added = KeyIndex(keys, ids)
        if bool(self.contains(added.keys).any()):
            raise ValueError("insert: some keys are already in the index")
        at = xp.searchsorted(self.keys, added.keys)
        if xp is np:
            return KeyIndex._sorted(xp, np.insert(self.keys, at, added.keys), np.insert(self.ids, at, added.ids))
        merged = xp.concatenate([self.keys, added.keys])  # CuPy has no insert: a stable sort merges
        order = xp.argsort(merged, kind="stable")
        return KeyIndex._sorted(xp, merged[order], xp.concatenate([self.ids, added.ids])[order])
