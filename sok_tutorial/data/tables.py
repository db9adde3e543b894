"""Chunks of rows in any common form -> pyarrow Tables (the one in-memory form used inside)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa


def dense_to_list(values: np.ndarray) -> pa.Array:
    """``[rows, nnz]`` -> ``list<>``; ``[rows, slots, nnz]`` -> ``list<list<>>`` (no Python loops)."""
    flat: pa.Array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for width in reversed(values.shape[1:]):
        offsets = pa.array(np.arange(0, len(flat) + 1, width, dtype=np.int32))
        flat = pa.ListArray.from_arrays(offsets, flat)
    return flat


def to_array(values: Any) -> pa.Array:
    """One column (pyarrow, NumPy incl. 2-D/3-D list columns, pandas, cuDF, list) as an Arrow array."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    if hasattr(values, "to_arrow"):  # cudf
        return values.to_arrow()
    if isinstance(values, np.ndarray):  # faithful: NaN stays a value (pass a mask for nulls)
        return dense_to_list(values) if values.ndim > 1 else pa.array(values)
    if hasattr(values, "dtype") and hasattr(values, "to_numpy") and values.dtype != object:
        try:
            return pa.array(values.to_numpy(), from_pandas=True)
        except (pa.ArrowInvalid, TypeError, ValueError):
            pass
    return pa.array(values, from_pandas=True)


def to_table(chunk: Any) -> pa.Table:
    """A pyarrow Table/RecordBatch, pandas or cuDF DataFrame, or dict of arrays as a Table."""
    if isinstance(chunk, pa.Table):
        return chunk
    if isinstance(chunk, pa.RecordBatch):
        return pa.Table.from_batches([chunk])
    if isinstance(chunk, Mapping):
        return pa.table({str(k): to_array(v) for k, v in chunk.items()})
    if hasattr(chunk, "to_arrow"):  # cudf
        return chunk.to_arrow()
    if hasattr(chunk, "columns") and hasattr(chunk, "iloc"):  # pandas
        # drop pandas' dtype metadata: columns change type (strings -> ids) after conversion
        return pa.Table.from_pandas(chunk, preserve_index=False).replace_schema_metadata(None)
    raise TypeError(f"a chunk of type {type(chunk).__name__} is not a Table, DataFrame or dict of arrays")
