"""Transforms the loader applies to categorical and list columns, per chunk, on its device.

* `HashBucket(num_buckets)`: ``kernels.hash_bucket``, a deterministic 64-bit hash that gives the
  same bucket on CPU and GPU (the "online hashing" of the accelerated DLRM pipeline).
* a fitted `Categorify` (from ``Categorify.load``): raw integer keys -> the contiguous ids of
  the saved mapping, unseen keys -> 0 (the OOV row), through a ``kernels.key_index.KeyIndex`` of
  the vocabulary (a dense table over a narrow span of keys, a binary search otherwise).

Each transform takes ``columns`` (default: every categorical and list column of the loader).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from kernels import checks
from kernels.backend import array_module_of
from kernels.hash_bucket import hash_bucket
from kernels.key_index import KeyIndex
from sok_tutorial.data.categorify import OOV, Categorify


class Transform:
    """Base class: ``transform(values, column)`` maps int64 keys to int64 ids (any shape)."""

    def __init__(self, columns: Sequence[str] | None = None):
        self.columns = None if columns is None else list(columns)

    def applies_to(self, column: str) -> bool:
        return self.columns is None or column in self.columns

    def transform(self, values: Any, column: str) -> Any:
        raise NotImplementedError

    def cardinality(self, column: str) -> int | None:
        """Rows the column's embedding table needs after this transform (None: unchanged)."""
        return None


class HashBucket(Transform):
    """Hash keys into ``num_buckets`` buckets (an int for every column, or ``{column: n}``).

    Example:
        >>> import numpy as np
        >>> HashBucket(10).transform(np.array([7, 7, 123456789]), "C1").tolist()
        [3, 3, 1]
    """

    def __init__(self, num_buckets: int | Mapping[str, int], columns: Sequence[str] | None = None, seed: int = 0):
        if isinstance(num_buckets, Mapping):
            self.num_buckets = {c: checks.positive_int(f"num_buckets[{c!r}]", n) for c, n in num_buckets.items()}
            columns = list(num_buckets) if columns is None else columns
        else:
            self.num_buckets = checks.positive_int("num_buckets", num_buckets)
        super().__init__(columns)
        self.seed = checks.positive_int("seed", seed, allow_zero=True)

    def _buckets(self, column: str) -> int:
        if isinstance(self.num_buckets, dict):
            if column not in self.num_buckets:
                raise KeyError(f"HashBucket has no num_buckets for column {column!r}")
            return self.num_buckets[column]
        return self.num_buckets

    def transform(self, values: Any, column: str) -> Any:
        return hash_bucket(values, self._buckets(column), self.seed)

    def cardinality(self, column: str) -> int | None:
        return self._buckets(column)

    def __repr__(self) -> str:
        return f"HashBucket({self.num_buckets!r}, columns={self.columns!r}, seed={self.seed})"


class CategorifyLookup(Transform):
    """Map raw integer keys through a fitted `Categorify` (what the loader builds from one)."""

    def __init__(self, categorify: Categorify, columns: Sequence[str] | None = None):
        if not categorify.fitted:
            raise ValueError("the Categorify passed as a loader transform is not fitted")
        super().__init__(categorify.columns if columns is None else columns)
        self.categorify = categorify
        self._indexes: dict[str, KeyIndex] = {}
        for name in self.columns:
            if name not in categorify.vocabularies:
                raise ValueError(f"the Categorify has no vocabulary for column {name!r}")
            vocab = categorify.vocabularies[name]
            if not pa.types.is_integer(vocab.type):
                raise TypeError(f"column {name!r}: the Categorify vocabulary holds {vocab.type} values; the loader "
                                "remaps integer keys (convert string columns with to_parquet_dataset instead)")
            keys = vocab.to_numpy().astype(np.int64)
            self._indexes[name] = KeyIndex(keys, np.arange(1, len(keys) + 1))  # id i+1 for vocab row i
        self._device_indexes: dict[tuple[str, str], KeyIndex] = {}

    def transform(self, values: Any, column: str) -> Any:
        xp = array_module_of(values)
        key = (column, xp.__name__)
        if key not in self._device_indexes:  # one copy of the index per device, made on first use
            index = self._indexes[column]
            self._device_indexes[key] = index if xp is np else KeyIndex(xp.asarray(index.keys), xp.asarray(index.ids))
        return self._device_indexes[key].lookup(values, OOV)

    def cardinality(self, column: str) -> int | None:
        return self.categorify.cardinalities[column]


def as_transforms(transforms: Sequence[Any]) -> list[Transform]:
    """Accept `Transform` objects and fitted `Categorify` instances."""
    out = []
    for i, t in enumerate(transforms):
        if isinstance(t, Categorify):
            out.append(CategorifyLookup(t))
        elif isinstance(t, Transform):
            out.append(t)
        else:
            raise TypeError(f"transforms[{i}] is a {type(t).__name__}: expected HashBucket or a fitted Categorify")
    return out
