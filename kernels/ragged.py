"""Ragged (CSR) arrays: ``values`` plus ``offsets`` with ``offsets[0] == 0``; row ``i`` is
``values[offsets[i]:offsets[i + 1]]``::

    values  = [a b c | d | | e f]      three keys, one, none, two
    offsets = [0, 3, 4, 4, 6]          len(offsets) == rows + 1

Written once against the array module of the inputs (NumPy, or CuPy on the GPU, where CuPy's
own kernels do the work), vectorised: no Python loop over rows.
"""
from __future__ import annotations

from typing import Any

from kernels.backend import array_module_of


def lengths_to_offsets(lengths: Any) -> Any:
    """``[l0, l1, ...] -> [0, l0, l0 + l1, ...]`` (int64)."""
    xp = array_module_of(lengths)
    offsets = xp.zeros(len(lengths) + 1, dtype=xp.int64)
    xp.cumsum(lengths, out=offsets[1:])
    return offsets


def take(values: Any, offsets: Any, rows: Any) -> tuple[Any, Any]:
    """Rows `rows` (int array, any order, repeats allowed) of a ragged array.

    Example:
        >>> import numpy as np
        >>> v, o = take(np.array([1, 2, 3, 4, 5, 6]), np.array([0, 3, 4, 4, 6]), np.array([3, 0, 2]))
        >>> v.tolist(), o.tolist()
        ([5, 6, 1, 2, 3], [0, 2, 5, 5])
    """
    xp = array_module_of(values)
    starts = offsets[:-1][rows]
    lengths = offsets[1:][rows] - starts
    new_offsets = lengths_to_offsets(lengths)
    total = int(new_offsets[-1])
    # element j of output row r comes from starts[r] + (j - new_offsets[r])
    index = xp.arange(total, dtype=xp.int64)
    index += xp.repeat(starts - new_offsets[:-1], lengths)
    return values[index], new_offsets


def slice_rows(values: Any, offsets: Any, start: int, stop: int) -> tuple[Any, Any]:
    """Rows ``start:stop`` as views (values) and rebased offsets."""
    lo, hi = int(offsets[start]), int(offsets[stop])
    return values[lo:hi], offsets[start:stop + 1] - lo


def concat(parts: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """Rows of several ragged arrays, one after another."""
    xp = array_module_of(parts[0][0])
    values = xp.concatenate([v for v, _ in parts])
    lengths = xp.concatenate([o[1:] - o[:-1] for _, o in parts])
    return values, lengths_to_offsets(lengths)


def to_dense(values: Any, offsets: Any, width: int, pad: int = 0) -> Any:
    """``[rows, width]`` array, rows padded with `pad` (rows longer than `width` are an error)."""
    xp = array_module_of(values)
    rows = len(offsets) - 1
    lengths = offsets[1:] - offsets[:-1]
    if rows and int(lengths.max()) > width:
        raise ValueError(f"a row has {int(lengths.max())} values, more than width={width}")
    out = xp.full((rows, width), pad, dtype=values.dtype)
    if len(values):
        row_of = xp.repeat(xp.arange(rows, dtype=xp.int64), lengths)
        col = xp.arange(len(values), dtype=xp.int64) - offsets[:-1][row_of]
        out[row_of, col] = values
    return out


def truncate(values: Any, offsets: Any, width: int) -> tuple[Any, Any]:
    """Keep at most the first `width` values of every row."""
    xp = array_module_of(values)
    lengths = offsets[1:] - offsets[:-1]
    kept = xp.minimum(lengths, width)
    if bool((kept == lengths).all()):
        return values, offsets
    row_of = xp.repeat(xp.arange(len(lengths), dtype=xp.int64), lengths)
    position = xp.arange(len(values), dtype=xp.int64) - offsets[:-1][row_of]
    return values[position < width], lengths_to_offsets(kept)
