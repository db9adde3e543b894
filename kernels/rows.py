"""Row gather/scatter between tables (``[rows, dim]`` arrays), on NumPy or CuPy.

NumPy's ``take`` / fancy assignment / ``add.at`` are the specification; on the GPU the same calls
run CuPy's own CUDA kernels (``cupy.add.at`` with atomic adds), so no hand-written ``.cu`` is
needed for a pure memory move.

These move embedding rows (and optimizer slots) between a parameter server and a device table,
and assemble loader batches. Indices are int64 row numbers; every index is bounds-checked, so a
wrong row is an error, never a silent write elsewhere.

Example:
    >>> import numpy as np
    >>> table = np.zeros((4, 2), np.float32)
    >>> scatter_rows(table, np.array([3, 1]), np.array([[1, 1], [2, 2]], np.float32))
    >>> gather_rows(table, np.array([1, 3])).tolist()
    [[2.0, 2.0], [1.0, 1.0]]
"""
from __future__ import annotations

from typing import Any

from kernels.backend import array_module_of


def _check(table: Any, rows: Any, name: str) -> None:
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= table.shape[0]):
        raise IndexError(f"{name}: row ids span [{int(rows.min())}, {int(rows.max())}] but the table has "
                         f"{table.shape[0]} rows")


def gather_rows(table: Any, rows: Any, out: Any = None) -> Any:
    """``table[rows]``, optionally into `out`."""
    xp = array_module_of(table)
    rows = xp.asarray(rows, dtype=xp.int64)
    _check(table, rows, "gather_rows")
    if out is None:
        return table[rows]
    xp.take(table, rows, axis=0, out=out)
    return out


def scatter_rows(table: Any, rows: Any, values: Any) -> None:
    """``table[rows] = values`` in place (rows must be unique: the last write would win)."""
    xp = array_module_of(table)
    rows = xp.asarray(rows, dtype=xp.int64)
    _check(table, rows, "scatter_rows")
    table[rows] = values


def scatter_add_rows(table: Any, rows: Any, values: Any) -> None:
    """``table[rows] += values`` in place; repeated rows accumulate."""
    xp = array_module_of(table)
    rows = xp.asarray(rows, dtype=xp.int64)
    _check(table, rows, "scatter_add_rows")
    xp.add.at(table, rows, values)  # CuPy: atomic adds
