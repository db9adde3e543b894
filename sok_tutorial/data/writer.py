"""Stream chunks of rows into a dataset directory (see `sok_tutorial.data.schema`), atomically.

Rows are written into a temporary sibling of the output directory, split into parts (one per
worker) and row groups of a fixed size; ``schema.json`` and ``_file_list.txt`` are written last and
the directory is renamed into place only when everything succeeded.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kernels import checks
from sok_tutorial.atomic import abort_directory, begin_directory, commit_directory
from sok_tutorial.data.keyset import keyset_path, write_keyset
from sok_tutorial.data.schema import ColumnSchema, Schema, write_file_list
from sok_tutorial.data.tables import to_table

DEFAULT_ROW_GROUP_SIZE = 131_072  # rows; ~10-40 MiB of Criteo-like columns: big reads, fine shuffle


def as_table(chunk: Any, schema: Schema) -> pa.Table:
    """A chunk (see `to_table`) with exactly the schema's columns, in order, cast to their Arrow types."""
    table = to_table(chunk)
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise ValueError(f"chunk is missing column(s) {missing}; it has {table.column_names}")
    arrays = [_cast(table.column(c.name).combine_chunks(), c) for c in schema.columns]
    return pa.Table.from_arrays(arrays, schema=schema.arrow_schema())


def _cast(values: pa.Array, column: ColumnSchema) -> pa.Array:
    target = column.arrow_type()
    if values.type == target:
        return values
    try:
        return values.cast(target, safe=not pa.types.is_floating(target))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TypeError(f"column {column.name!r}: cannot convert {values.type} to {target} ({exc})") from exc


class PartWriter:
    """One parquet file of a dataset, written in row groups of `row_group_size` rows, measuring
    what the schema needs (list lengths, id ranges) and optionally collecting its keyset."""

    def __init__(self, path: str | os.PathLike, schema: Schema, *, row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
                 compression: str = "snappy", keyset_columns: Sequence[str] = ()):
        self.path = Path(path)
        self.schema = schema
        self.row_group_size = checks.positive_int("row_group_size", row_group_size)
        self.keyset_columns = checks.known_names("keyset_columns", keyset_columns, schema.names)
        self._writer = pq.ParquetWriter(self.path, schema.arrow_schema(), compression=compression)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._keys: list[np.ndarray] = []
        self.num_rows = 0
        self.observed: dict[str, dict[str, int]] = {}

    def write(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= self.row_group_size:
            self._flush(self.row_group_size)

    def _flush(self, n: int) -> None:
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        group, rest = table.slice(0, n), table.slice(n)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows
        self._observe(group)
        self._writer.write_table(group, row_group_size=n)
        self.num_rows += n

    def _observe(self, group: pa.Table) -> None:
        for column in self.schema.columns:
            if column.kind not in ("categorical", "list"):
                continue
            values = group.column(column.name)
            stats = self.observed.setdefault(column.name, {})
            if column.kind == "list":
                if column.nnz is not None:  # flat: slots * nnz values per row
                    lengths = pc.min_max(pc.list_value_length(values))
                    _merge(stats, "min_flat", lengths["min"].as_py(), min)
                    _merge(stats, "max_flat", lengths["max"].as_py(), max)
                elif column.slots is not None:
                    outer = pc.min_max(pc.list_value_length(values))
                    _merge(stats, "min_slots", outer["min"].as_py(), min)
                    _merge(stats, "max_slots", outer["max"].as_py(), max)
                    values = pc.list_flatten(values)
                _merge(stats, "max_nnz", pc.max(pc.list_value_length(values)).as_py(), max)
                values = pc.list_flatten(values)
            ids = pc.min_max(values)
            _merge(stats, "min_id", ids["min"].as_py(), min)
            _merge(stats, "max_id", ids["max"].as_py(), max)
            if column.name in self.keyset_columns:
                keys = pc.unique(values).to_numpy(zero_copy_only=False)
                self._keys.append(keys + (column.key_offset or 0))

    def close(self) -> dict[str, Any]:
        """Flush, close the file, write the keyset; returns the part's entry for schema.json."""
        if self._pending_rows:
            self._flush(self._pending_rows)
        self._writer.close()
        if self.keyset_columns:
            keys = np.concatenate(self._keys) if self._keys else np.zeros(0, np.int64)
            write_keyset(keyset_path(self.path), keys)
        return {"file": self.path.name, "num_rows": self.num_rows}

    def abort(self) -> None:
        try:
            self._writer.close()
        except Exception:
            pass


def _merge(stats: dict[str, int], key: str, value: int | None, fn: Any) -> None:
    if value is not None:
        stats[key] = fn(stats[key], value) if key in stats else value


def finalize_schema(schema: Schema, parts: Sequence[dict[str, Any]],
                    observed: Iterable[dict[str, dict[str, int]]]) -> Schema:
    """Merge what the parts measured into the schema; errors on ids outside a declared cardinality."""
    merged: dict[str, dict[str, int]] = {}
    for obs in observed:
        for name, stats in obs.items():
            for key, value in stats.items():
                _merge(merged.setdefault(name, {}), key, value, min if key.startswith("min") else max)
    columns = []
    for column in schema.columns:
        stats = merged.get(column.name, {})
        if column.cardinality is not None and stats:
            if stats["min_id"] < 0 or stats["max_id"] >= column.cardinality:
                raise ValueError(
                    f"column {column.name!r}: ids span [{stats['min_id']}, {stats['max_id']}] but "
                    f"cardinality={column.cardinality} declares [0, {column.cardinality})")
        updates: dict[str, Any] = {}
        if column.kind == "list" and stats and column.nnz is not None:
            width = column.slots * column.nnz
            if stats["min_flat"] != width or stats["max_flat"] != width:
                raise ValueError(f"column {column.name!r}: rows hold between {stats['min_flat']} and "
                                 f"{stats['max_flat']} keys; slots={column.slots} x nnz={column.nnz} needs {width}")
            columns.append(ColumnSchema(**{**column.to_dict(), "max_nnz": column.nnz}))
            continue
        if column.kind == "list" and stats:
            if column.max_nnz is not None and stats["max_nnz"] > column.max_nnz:
                raise ValueError(f"column {column.name!r}: a list has {stats['max_nnz']} entries, "
                                 f"more than the declared max_nnz={column.max_nnz}")
            updates["max_nnz"] = column.max_nnz or stats["max_nnz"]
            if column.slots is not None:
                if stats["min_slots"] != stats["max_slots"]:
                    raise ValueError(f"column {column.name!r}: rows have between {stats['min_slots']} and "
                                     f"{stats['max_slots']} slots; a slotted list column needs the same count")
                updates["slots"] = stats["max_slots"]
        columns.append(ColumnSchema(**{**column.to_dict(), **updates}))
    return Schema(tuple(columns), tuple(parts), dict(schema.metadata))


class DatasetWriter:
    """Write a dataset directory from a stream of chunks.

    Rows go to ``num_parts`` files. With ``total_rows`` known, part ``i`` receives a contiguous
    slice of the stream (the order is kept); otherwise whole row groups are dealt to the parts
    in turn. The directory appears at ``path`` only after `close` succeeds.

    Args:
        path: output directory; refused if it exists and is not empty, unless ``overwrite=True``.
        schema: the columns to write (`Schema`); chunks must contain at least these columns.
        num_parts: number of part files, usually one per worker.
        total_rows: rows that will be written, when known (contiguous parts).
        row_group_size: rows per parquet row group, the unit the loader reads and shuffles.
        keyset_columns: categorical/list columns whose unique keys go into ``<part>.keyset``.
        metadata: stored in ``schema.json`` (generator parameters, oracle AUC...).
        arg: the caller's name for ``path``, used in error messages.
        inputs: files the caller reads while writing; ``overwrite`` never deletes a directory holding one.

    Example:
        >>> import tempfile, pathlib, numpy as np
        >>> from sok_tutorial.data.schema import ColumnSchema, Schema
        >>> schema = Schema([ColumnSchema("item", "categorical", "int64", cardinality=10),
        ...                  ColumnSchema("label", "label", "int8")])
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "ds"
        >>> with DatasetWriter(out, schema, num_parts=2, total_rows=6) as w:
        ...     w.write({"item": np.arange(6), "label": np.array([0, 1, 0, 1, 1, 0])})
        >>> [p["num_rows"] for p in Schema.load(out).parts]
        [3, 3]
    """

    def __init__(self, path: str | os.PathLike, schema: Schema, *, num_parts: int = 1,
                 total_rows: int | None = None, row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
                 keyset_columns: Sequence[str] = (), compression: str = "snappy",
                 metadata: dict[str, Any] | None = None, overwrite: bool = False, arg: str = "path",
                 inputs: Sequence[Any] = ()):
        self.path = Path(path)
        self.schema = Schema(schema.columns, (), {**schema.metadata, **(metadata or {})})
        self.num_parts = checks.positive_int("num_parts", num_parts)
        self.total_rows = None if total_rows is None else checks.positive_int("total_rows", total_rows)
        if self.total_rows is not None and self.total_rows < self.num_parts:
            raise ValueError(f"num_parts={num_parts} is more than total_rows={total_rows}: parts would be empty")
        checks.positive_int("row_group_size", row_group_size)
        self._tmp = begin_directory(self.path, overwrite=overwrite, arg=arg, inputs=inputs)
        try:
            self._parts = [PartWriter(self._tmp / f"part-{i:05d}.parquet", self.schema,
                                      row_group_size=row_group_size, compression=compression,
                                      keyset_columns=keyset_columns) for i in range(self.num_parts)]
        except BaseException:
            abort_directory(self._tmp)
            raise
        self._rows = 0
        self._next_part = 0
        self._staged: list[pa.Table] = []
        self._staged_rows = 0
        self._row_group_size = row_group_size
        self._closed = False

    def write(self, chunk: Any) -> None:
        """Append a chunk of rows (Table, RecordBatch, DataFrame or dict of arrays)."""
        if self._closed:
            raise RuntimeError(f"DatasetWriter(path={str(self.path)!r}) is closed (or aborted): rows written now "
                               "would be lost; open a new writer")
        table = as_table(chunk, self.schema)
        if self.total_rows is None:
            self._deal(table)
        else:
            self._split(table)
        self._rows += table.num_rows

    def _split(self, table: pa.Table) -> None:
        start = self._rows
        if start + table.num_rows > self.total_rows:
            raise ValueError(f"more rows written than total_rows={self.total_rows}")
        bounds = [self.total_rows * i // self.num_parts for i in range(self.num_parts + 1)]
        for i, part in enumerate(self._parts):
            lo, hi = max(bounds[i], start), min(bounds[i + 1], start + table.num_rows)
            if lo < hi:
                part.write(table.slice(lo - start, hi - lo))

    def _deal(self, table: pa.Table) -> None:
        self._staged.append(table)
        self._staged_rows += table.num_rows
        while self._staged_rows >= self._row_group_size:
            self._deal_one(self._row_group_size)

    def _deal_one(self, n: int) -> None:
        staged = pa.concat_tables(self._staged)
        self._parts[self._next_part].write(staged.slice(0, n))
        rest = staged.slice(n)
        self._staged, self._staged_rows = ([rest] if rest.num_rows else []), rest.num_rows
        self._next_part = (self._next_part + 1) % self.num_parts

    def close(self) -> Schema:
        """Finish every part, write schema.json and _file_list.txt, move the directory into place."""
        if self._closed:
            raise RuntimeError("DatasetWriter is already closed")
        try:
            if self.total_rows is not None and self._rows != self.total_rows:
                raise ValueError(f"total_rows={self.total_rows} was declared but {self._rows} rows were written")
            if self._staged_rows:
                self._deal_one(self._staged_rows)
            entries = [p.close() for p in self._parts]
            if any(e["num_rows"] == 0 for e in entries):
                raise ValueError(f"only {self._rows} rows for num_parts={self.num_parts}: some parts are empty")
            schema = finalize_schema(self.schema, entries, [p.observed for p in self._parts])
            schema.save(self._tmp)
            write_file_list(self._tmp, [e["file"] for e in entries])
        except BaseException:
            self.abort()
            raise
        self._closed = True
        commit_directory(self._tmp, self.path)
        return schema

    def abort(self) -> None:
        """Drop everything written so far; nothing appears at `path`."""
        for part in self._parts:
            part.abort()
        abort_directory(self._tmp)
        self._closed = True

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            if not self._closed:
                self.abort()
        elif not self._closed:
            self.close()
