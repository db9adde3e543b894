"""Keysets: the sorted unique keys of one data file, stored beside it as ``<file>.keyset``.

The format is HugeCTR's: raw little-endian int64 keys, no header. Keys live in the dataset's
global key space, ``id + key_offset`` of their column (see `ColumnSchema.key_offset`), so one
keyset covers every categorical column of the file.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from sok_tutorial.atomic import write_file

KEYSET_SUFFIX = ".keyset"


def keyset_path(data_file: str | os.PathLike) -> Path:
    """Where the keyset of `data_file` lives: ``<data_file>.keyset``."""
    return Path(f"{os.fspath(data_file)}{KEYSET_SUFFIX}")


def write_keyset(path: str | os.PathLike, keys: np.ndarray) -> Path:
    """Write the sorted unique values of `keys` (any integer array) atomically."""
    unique = np.unique(np.asarray(keys, dtype=np.int64))
    return write_file(path, unique.astype("<i8", copy=False).tobytes())


def read_keyset(path: str | os.PathLike) -> np.ndarray:
    """Read a keyset file as a sorted int64 array.

    Example:
        >>> import tempfile, numpy as np, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "part.parquet.keyset"
        >>> _ = write_keyset(p, np.array([5, 3, 5, -1]))
        >>> read_keyset(p).tolist()
        [-1, 3, 5]
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"keyset file {str(path)!r} does not exist")
    raw = path.read_bytes()
    if len(raw) % 8:
        raise ValueError(f"keyset file {str(path)!r} is {len(raw)} bytes, not a whole number of int64 keys")
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)
