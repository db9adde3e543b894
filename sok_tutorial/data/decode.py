"""Decoding one planned piece of a row group (a `Segment`) into checked, transformed columns: the
loader's per-row-group work, run by its decode threads (`sok_tutorial.data.loader_base`).

On the host pyarrow decodes the row group and the columns become NumPy arrays (continuous values
with NaN filling, ids and labels checked, lists as `Ragged`); with ``device="gpu"`` and cuDF
the decode lands straight in GPU memory. Bad data raises `LoaderError`, naming file and column.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kernels import backend, ragged
from sok_tutorial.data import columns as cols


@dataclass(frozen=True)
class Segment:
    """Rows ``start:stop`` of row group `row_group` of file `file` (an index into the files)."""

    file: int
    row_group: int
    start: int
    stop: int


class LoaderError(ValueError):
    """Bad data met while loading; the message names the file (and column)."""


class SegmentDecoder:
    """Decoding and checking for `LoaderCore`, which sets the attributes used here (`files`,
    `names`, the column kinds, `device`, `transforms`, `fill_nan`, `label_range`...)."""

    _local: threading.local

    def _handle(self, file: int) -> pq.ParquetFile:
        """This thread's reader of `file` (sharing the footer parsed at construction)."""
        handles = self._local.__dict__.setdefault("handles", {})
        if file not in handles:
            handles[file] = pq.ParquetFile(self.files[file], metadata=self._pf[file].metadata)
        return handles[file]

    def read_segment(self, seg: Segment, pool: cols.BufferPool | None = None) -> cols.Columns:
        if self.device == "gpu" and backend.cudf is not None:
            return self._transform(self._read_segment_cudf(seg))
        path = self.files[seg.file]
        try:
            table = self._handle(seg.file).read_row_group(seg.row_group, columns=self.names, use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise LoaderError(f"cannot read row group {seg.row_group} of {str(path)!r}: {exc}") from exc
        if seg.start or seg.stop < table.num_rows:
            table = table.slice(seg.start, seg.stop - seg.start)
        out: cols.Columns = {}
        for name in self.names:
            column = table.column(name)
            if name in self.list_names:
                try:
                    col = cols.from_arrow_list(column, self.slots[name], self.nnz[name])
                except ValueError as exc:
                    raise LoaderError(f"column {name!r} of {str(path)!r}: {exc}") from exc
                out[name] = self._check_nnz(col, name, path)
            else:
                out[name] = self._scalar(column, name, path, pool)  # zero-copy where Arrow allows
        return self._transform(cols.to_device(out, self.xp))

    def _read_segment_cudf(self, seg: Segment) -> cols.Columns:
        """The GPU read: cuDF decodes straight into device memory; no host copy of the data."""
        cupy, path = backend.cupy, self.files[seg.file]
        try:
            df = backend.cudf.read_parquet(path, columns=self.names, row_groups=[[seg.row_group]])
        except Exception as exc:
            raise LoaderError(f"cannot read row group {seg.row_group} of {str(path)!r}: {exc}") from exc
        df = df.iloc[seg.start:seg.stop]
        out: cols.Columns = {}
        for name in self.names:
            series = df[name]
            if name in self.list_names:
                slots, nnz = self.slots[name], self.nnz[name]
                if nnz:  # stored flat: slots * nnz keys per row
                    values = series.list.leaves.values.astype(cupy.int64)
                    out[name] = cols.Ragged(values, cupy.arange(0, len(values) + 1, nnz, dtype=cupy.int64), slots)
                    continue
                inner = series.explode() if slots else series  # one row per inner list
                lengths = inner.list.len().fillna(0).values.astype(cupy.int64)
                values = inner.list.leaves.values.astype(cupy.int64)
                out[name] = self._check_nnz(cols.Ragged(values, ragged.lengths_to_offsets(lengths), slots), name, path)
            elif name in self.cont_names:
                values = series.astype("float32").fillna(np.nan).values
                bad = cupy.isnan(values)
                if bool(bad.any()):
                    if self.fill_nan is None:
                        raise LoaderError(f"column {name!r} of {str(path)!r} has {int(bad.sum())} missing/NaN "
                                          "values in one row group; pass fill_nan=<value> to replace them")
                    values = cupy.where(bad, cupy.float32(self.fill_nan), values)
                out[name] = values
            else:
                if series.null_count:
                    raise LoaderError(f"column {name!r} of {str(path)!r} has {series.null_count} nulls; "
                                      "categorical and label columns must be complete")
                out[name] = series.values.astype(cupy.int64 if name in self.cat_names else cupy.float32)
                if name in self.label_names:
                    self._check_labels(out[name], name, path)
        return out

    def _scalar(self, column: pa.ChunkedArray, name: str, path: Path, pool: cols.BufferPool | None) -> np.ndarray:
        if name in self.cont_names:
            fill = np.nan if self.fill_nan is None else self.fill_nan
            values = cols.from_arrow_float(column, fill, pool)
            bad = np.isnan(values)
            if bad.any():
                if self.fill_nan is None:
                    raise LoaderError(f"column {name!r} of {str(path)!r} has {int(bad.sum())} missing/NaN values "
                                      "in one row group; pass fill_nan=<value> to replace them")
                if not values.flags.writeable:
                    values = values.copy()
                np.copyto(values, np.float32(self.fill_nan), where=bad)
            return values
        if column.null_count:
            raise LoaderError(f"column {name!r} of {str(path)!r} has {column.null_count} nulls; "
                              "categorical and label columns must be complete")
        values = cols.from_arrow_numeric(column, np.int64 if name in self.cat_names else np.float32)
        if name in self.label_names:
            self._check_labels(values, name, path)
        return values

    def _check_nnz(self, col: cols.Ragged, name: str, path: Path) -> cols.Ragged:
        limit = self.max_nnz[name]
        lengths = col.lengths()
        if len(lengths) and int(lengths.max()) > limit:
            if not self.truncate_lists:
                raise LoaderError(f"column {name!r} of {str(path)!r} has a list of {int(lengths.max())} values, "
                                  f"more than max_nnz={limit}; pass truncate_lists=True to cut lists")
            return cols.Ragged(*ragged.truncate(col.values, col.offsets, limit), col.slots)
        return col

    def _transform(self, chunk: cols.Columns) -> cols.Columns:
        for t in self.transforms:
            for name in self.cat_names + self.list_names:
                if t.applies_to(name):
                    col = chunk[name]
                    chunk[name] = (cols.Ragged(t.transform(col.values, name), col.offsets, col.slots)
                                   if isinstance(col, cols.Ragged) else t.transform(col, name))
        return chunk

    def _check_labels(self, values: Any, name: str, path: Path) -> None:
        """Labels are finite and, with a `label_range`, inside it: a NaN label trains to NaN weights."""
        finite = backend.array_module_of(values).isfinite(values)  # host values when decoded by pyarrow
        if not bool(finite.all()):
            raise LoaderError(f"label column {name!r} of {str(path)!r} has {int((~finite).sum())} NaN or infinite "
                              "values in one row group; labels must be finite numbers")
        if self.label_range is not None and len(values):
            low, high = float(values.min()), float(values.max())
            if low < self.label_range[0] or high > self.label_range[1]:
                raise LoaderError(f"label column {name!r} of {str(path)!r} has values in [{low}, {high}], outside "
                                  f"label_range={self.label_range}; pass label_range=(low, high), or None for any "
                                  "finite label")
