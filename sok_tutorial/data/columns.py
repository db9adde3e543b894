"""Rows in the loader: a dict of columns on one device (NumPy or CuPy arrays).

Scalar columns are 1-D arrays. List columns are `Ragged`: ``values`` and ``offsets`` over the
inner lists; a slotted column (SOK's ``[batch, slot, nnz]``) has ``slots`` inner lists per row::

    slots=2:   row 0 = [[a b] [c]]   row 1 = [[] [d e f]]
    values  = [a b c d e f]
    offsets = [0 2 3 3 6]            one entry per inner list, + 1

Row operations (gather, concat) never loop over rows in Python.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kernels import ragged
from kernels.backend import array_module_of


class Ragged(NamedTuple):
    values: Any
    offsets: Any  # int64, len = rows * (slots or 1) + 1, offsets[0] == 0
    slots: int | None = None

    @property
    def rows(self) -> int:
        return (len(self.offsets) - 1) // (self.slots or 1)

    def lengths(self) -> Any:
        return self.offsets[1:] - self.offsets[:-1]


Columns = dict[str, Any]
ALIGN = 64  # bytes; TensorFlow refuses (aborts on) CPU memory aligned to less


def _aligned(raw: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + n * dtype.itemsize].view(dtype)


def aligned_empty(n: int, dtype: Any) -> np.ndarray:
    """An uninitialised 1-D NumPy array whose data starts on an `ALIGN`-byte boundary."""
    dtype = np.dtype(dtype)
    return _aligned(np.empty(n * dtype.itemsize + ALIGN, np.uint8), n, dtype)


class BufferPool:
    """Reuses aligned host buffers whose every view (and zero-copy TF tensor) has been released.

    Freshly allocated chunk-sized arrays cost a page fault per 4 KiB on first write, which on a
    two-core machine is as expensive as the shuffle itself. A buffer is handed out again only
    when its reference count shows nothing but the pool holds it, so reuse is always safe.
    """

    def __init__(self) -> None:
        # grows only to the peak number of buffers in use at once (bounded by the pipeline's depth)
        self._buffers: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = n * dtype.itemsize + ALIGN
        with self._lock:  # the view is made under the lock: its reference marks the buffer taken
            owned = self._buffers.setdefault(nbytes, [])
            for raw in owned:
                if sys.getrefcount(raw) <= 3:  # the list, this loop variable, the call's argument
                    return _aligned(raw, n, dtype)
            raw = np.empty(nbytes, np.uint8)
            owned.append(raw)
            return _aligned(raw, n, dtype)


def is_aligned(array: np.ndarray) -> bool:
    return array.ctypes.data % ALIGN == 0


def num_rows(columns: Columns) -> int:
    first = next(iter(columns.values()))
    return first.rows if isinstance(first, Ragged) else len(first)


def _inner_rows(col: Ragged, rows: Any) -> Any:
    if not col.slots:
        return rows
    xp = array_module_of(rows)
    return (rows[:, None] * col.slots + xp.arange(col.slots, dtype=xp.int64)[None, :]).reshape(-1)


def gather(pieces: list[tuple[Columns, Any]], pool: BufferPool | None = None) -> Columns:
    """The rows of several ``(columns, rows)`` pieces, one after another, as one set of columns.

    ``rows`` is a slice or an int64 index array (on the columns' device). Each scalar column is
    written once, straight into one aligned (pooled) buffer: a batch that spans two chunks, or
    that takes its rows in a permuted order, costs one copy of its bytes and no more.

    Example:
        >>> a, b = {"x": np.arange(5)}, {"x": np.arange(10, 13)}
        >>> gather([(a, np.array([4, 0])), (b, slice(1, 3))])["x"].tolist()
        [4, 0, 11, 12]
    """
    sizes = [_count(rows) for _, rows in pieces]
    total = sum(sizes)
    empty = pool.empty if pool is not None else aligned_empty
    out: Columns = {}
    for name, first in pieces[0][0].items():
        if isinstance(first, Ragged):
            parts = [_ragged_rows(columns[name], rows) for columns, rows in pieces]
            out[name] = parts[0] if len(parts) == 1 else Ragged(*ragged.concat([p[:2] for p in parts]), first.slots)
        elif isinstance(first, np.ndarray):
            if len(pieces) == 1 and isinstance(pieces[0][1], slice):
                view = first[pieces[0][1]]
                if view.flags.writeable and is_aligned(view):  # already ours: hand it over as it is
                    out[name] = view
                    continue
            dst, position = empty(total, first.dtype), 0
            for (columns, rows), size in zip(pieces, sizes):
                part, src = dst[position:position + size], columns[name]
                if isinstance(rows, slice):
                    np.copyto(part, src[rows])
                else:
                    if size * _PREFETCH_RATIO >= len(src):
                        _touch(src)
                    # mode="clip": the rows are valid, and "raise" would buffer `out` (an extra copy)
                    np.take(src, rows, out=part, mode="clip")
                position += size
            out[name] = dst
        else:
            parts = [columns[name][rows] for columns, rows in pieces]
            out[name] = parts[0] if len(parts) == 1 else array_module_of(first).concatenate(parts)
    return out


# A chunk's column is read cold from memory: a random gather then waits on DRAM for every value,
# while one sequential pass first (which the hardware prefetches) brings the column into the
# CPU cache for the gather to hit. Worth it when the piece takes at least 1/_PREFETCH_RATIO of
# the column (measured with benchmarks/loader.py: about 1.5x faster gathers).
_PREFETCH_RATIO = 8


def _touch(column: np.ndarray) -> None:
    np.bitwise_or.reduce(column.view(f"u{column.itemsize}"))


def _count(rows: Any) -> int:
    return rows.stop - rows.start if isinstance(rows, slice) else len(rows)


def _ragged_rows(col: Ragged, rows: Any) -> Ragged:
    if isinstance(rows, slice):
        k = col.slots or 1
        return Ragged(*ragged.slice_rows(col.values, col.offsets, rows.start * k, rows.stop * k), col.slots)
    return Ragged(*ragged.take(col.values, col.offsets, _inner_rows(col, rows)), col.slots)


def concat(parts: list[Columns], pool: BufferPool | None = None) -> Columns:
    if len(parts) == 1:
        return parts[0]
    out: Columns = {}
    for name, first in parts[0].items():
        if isinstance(first, Ragged):
            values, offsets = ragged.concat([(p[name].values, p[name].offsets) for p in parts])
            out[name] = Ragged(values, offsets, first.slots)
        elif pool is not None and isinstance(first, np.ndarray):
            out[name] = np.concatenate([p[name] for p in parts], out=pool.empty(sum(len(p[name]) for p in parts),
                                                                                first.dtype))
        else:
            out[name] = array_module_of(first).concatenate([p[name] for p in parts])
    return out


# ------------------------------------------------------------------------------ from Arrow
def _offsets(array: pa.Array) -> np.ndarray:
    offsets = array.offsets.to_numpy().astype(np.int64)
    return offsets - offsets[0]


def from_arrow_list(array: pa.Array, slots: int | None, nnz: int | None = None) -> Ragged:
    """A ``list<int>`` or ``list<list<int>>`` Arrow column as host `Ragged` (nulls -> empty).

    With `nnz` the column is a flat ``list<int>`` of ``slots * nnz`` values per row."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if nnz:
        width = slots * nnz
        lengths = pc.min_max(pc.list_value_length(array).fill_null(0))
        if len(array) and (lengths["min"].as_py() != width or lengths["max"].as_py() != width):
            raise ValueError(f"rows hold between {lengths['min'].as_py()} and {lengths['max'].as_py()} keys, "
                             f"expected slots x nnz = {width}")
        values = pc.list_flatten(array).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return Ragged(values, np.arange(0, len(values) + 1, nnz, dtype=np.int64), slots)
    if slots:
        lengths = pc.list_value_length(array).fill_null(0)
        bounds = pc.min_max(lengths)
        if len(array) and (bounds["min"].as_py() != slots or bounds["max"].as_py() != slots):
            raise ValueError(f"rows have between {bounds['min'].as_py()} and {bounds['max'].as_py()} slots, "
                             f"expected exactly {slots}")
        array = pc.list_flatten(array)
    values = pc.list_flatten(array).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return Ragged(values, _offsets(array), slots)


def from_arrow_numeric(array: pa.ChunkedArray | pa.Array, dtype: Any) -> np.ndarray:
    """A null-free numeric Arrow column as a NumPy array of `dtype`; a view of Arrow's own buffer
    (no copy, writable like the buffer) when the column is one chunk of that type already."""
    dtype = np.dtype(dtype)
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    if array.null_count == 0 and array.type == pa.from_numpy_dtype(dtype):
        return np.frombuffer(array.buffers()[1], dtype, count=array.offset + len(array))[array.offset:]
    return array.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def from_arrow_float(array: pa.ChunkedArray | pa.Array, fill: float, pool: BufferPool | None) -> np.ndarray:
    """A numeric Arrow column as float32 with nulls replaced by `fill`; zero-copy without nulls."""
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    if array.type != pa.float32():
        array = array.cast(pa.float32())
    n = len(array)
    data = np.frombuffer(array.buffers()[1], np.float32, count=array.offset + n)[array.offset:]
    if array.null_count == 0:
        return data
    # Select on the bit patterns, branch-free: slots under a null may hold anything, even NaN.
    bits = np.frombuffer(array.buffers()[0], np.uint8)
    keep = np.unpackbits(bits, bitorder="little")[array.offset:array.offset + n].astype(np.uint32)
    np.negative(keep, out=keep)  # 1 -> 0xFFFFFFFF, 0 -> 0
    out = pool.empty(n, np.float32) if pool is not None else aligned_empty(n, np.float32)
    word = out.view(np.uint32)
    np.bitwise_and(data.view(np.uint32), keep, out=word)
    np.invert(keep, out=keep)
    keep &= np.float32(fill).view(np.uint32)
    word |= keep
    return out


def to_device(columns: Columns, xp: Any) -> Columns:
    """Move host columns to the device of `xp` (a no-op for NumPy)."""
    if xp is np:
        return columns
    return {n: Ragged(xp.asarray(c.values), xp.asarray(c.offsets), c.slots) if isinstance(c, Ragged)
            else xp.asarray(c) for n, c in columns.items()}
