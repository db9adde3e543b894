"""Categorify: arbitrary ids or strings -> contiguous int64 ids, fitted on data, saved, reused.

Id 0 is the out-of-vocabulary row: nulls, values never seen during fit, and values seen fewer
than ``freq_threshold`` times all map to it. Known values get ids 1..n, most frequent first
(ties broken by value), so frequent keys share the first rows of a table. List columns
(multi-hot) are categorified element by element and keep their row lengths.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kernels import checks
from sok_tutorial.atomic import atomic_directory, read_json
from sok_tutorial.data.tables import to_table

OOV = 0
_STATE_FILE = "categorify.json"


def _flat(values: pa.ChunkedArray) -> tuple[pa.Array, pa.Array | None]:
    """(element values, list offsets or None) of a column."""
    values = values.combine_chunks()
    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        offsets = values.offsets
        return pc.list_flatten(values), pc.subtract(offsets, offsets[0])
    return values, None


class Categorify:
    """Fit a vocabulary per column and map values to contiguous ids (0 = OOV/null/rare).

    Args:
        columns: names of the columns to categorify (scalar or list columns).
        freq_threshold: values seen fewer times than this during fit map to the OOV id.
        max_size: keep at most this many known values per column (the most frequent).

    Example:
        >>> import pandas as pd
        >>> cat = Categorify(["city"]).fit(pd.DataFrame({"city": ["b", "a", "b", None]}))
        >>> cat.transform(pd.DataFrame({"city": ["a", "b", "zzz"]}))["city"].to_pylist()
        [2, 1, 0]
        >>> cat.cardinalities
        {'city': 3}
    """

    def __init__(self, columns: Sequence[str], *, freq_threshold: int = 0, max_size: int | None = None):
        if isinstance(columns, str) or not columns:
            raise ValueError(f"columns={columns!r} is invalid: expected a non-empty list of column names")
        self.columns = list(columns)
        self.freq_threshold = checks.positive_int("freq_threshold", freq_threshold, allow_zero=True)
        self.max_size = None if max_size is None else checks.positive_int("max_size", max_size)
        self._counts: dict[str, list[pa.Table]] = {c: [] for c in self.columns}
        self.vocabularies: dict[str, pa.Array] | None = None
        self.frequencies: dict[str, pa.Array] | None = None

    # ------------------------------------------------------------------ fit
    def partial_fit(self, chunk: Any) -> "Categorify":
        """Count the values of one chunk (call repeatedly, then `finish_fit`)."""
        table = to_table(chunk)
        checks.known_names("columns", self.columns, table.column_names)
        for name in self.columns:
            values, _ = _flat(table.column(name))
            counts = pc.value_counts(values.drop_null())
            self._counts[name].append(pa.table({"value": counts.field("values"),
                                                "count": counts.field("counts")}))
            if len(self._counts[name]) >= 32:
                self._counts[name] = [_sum_counts(self._counts[name])]
        return self

    def merge(self, other: "Categorify") -> "Categorify":
        """Add another instance's partial counts (e.g. from a worker that saw other files)."""
        for name in self.columns:
            self._counts[name].extend(other._counts[name])
        return self

    def finish_fit(self) -> "Categorify":
        """Turn the counts into vocabularies; afterwards the instance can transform."""
        self.vocabularies, self.frequencies = {}, {}
        for name in self.columns:
            counts = _sum_counts(self._counts[name]) if self._counts[name] else None
            if counts is None or counts.num_rows == 0:
                raise ValueError(f"column {name!r} has no non-null values to fit a vocabulary on")
            if self.freq_threshold > 1:
                counts = counts.filter(pc.greater_equal(counts["count"], self.freq_threshold))
            counts = counts.sort_by([("count", "descending"), ("value", "ascending")])
            if self.max_size is not None:
                counts = counts.slice(0, self.max_size)
            self.vocabularies[name] = counts["value"].combine_chunks()
            self.frequencies[name] = counts["count"].combine_chunks()
        self._counts = {c: [] for c in self.columns}
        return self

    def fit(self, data: Any) -> "Categorify":
        """Fit on one table/DataFrame or an iterable of chunks."""
        chunks = [data] if isinstance(data, (pa.Table, pa.RecordBatch, Mapping)) or hasattr(data, "columns") else data
        for chunk in chunks:
            self.partial_fit(chunk)
        return self.finish_fit()

    # ------------------------------------------------------------ transform
    @property
    def fitted(self) -> bool:
        return self.vocabularies is not None

    @property
    def cardinalities(self) -> dict[str, int]:
        """Rows an embedding table needs per column: known values + the OOV row."""
        self._require_fitted()
        return {name: len(vocab) + 1 for name, vocab in self.vocabularies.items()}

    def transform(self, chunk: Any) -> pa.Table:
        """Replace each categorified column by its int64 ids; other columns pass through."""
        self._require_fitted()
        table = to_table(chunk)
        checks.known_names("columns", self.columns, table.column_names)
        for name in self.columns:
            values, offsets = _flat(table.column(name))
            vocab = self.vocabularies[name]
            if values.type != vocab.type:
                try:
                    values = values.cast(vocab.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise TypeError(f"column {name!r}: values of type {values.type} cannot be matched "
                                    f"against a vocabulary of type {vocab.type}") from exc
            ids = pc.index_in(values, value_set=vocab)
            ids = pc.fill_null(pc.add(ids.cast(pa.int64()), 1), OOV)
            if offsets is not None:
                ids = pa.ListArray.from_arrays(offsets, ids)
            table = table.set_column(table.column_names.index(name), name, ids)
        return table

    def _require_fitted(self) -> None:
        if self.vocabularies is None:
            raise RuntimeError("Categorify is not fitted: call fit() (or partial_fit() then finish_fit()) first")

    # ---------------------------------------------------------- save / load
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the vocabularies (one parquet per column, row i = id i+1) and settings."""
        self._require_fitted()
        with atomic_directory(path, overwrite=overwrite, arg="path") as tmp:
            for i, name in enumerate(self.columns):
                pq.write_table(pa.table({"value": self.vocabularies[name], "count": self.frequencies[name]}),
                               tmp / f"{i:03d}.parquet")
            state = {"columns": self.columns, "freq_threshold": self.freq_threshold,
                     "max_size": self.max_size, "cardinalities": self.cardinalities}
            (tmp / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Categorify":
        path = Path(path)
        if not (path / _STATE_FILE).is_file():
            raise FileNotFoundError(f"path={str(path)!r} holds no saved Categorify ({_STATE_FILE} missing)")
        state = read_json(path / _STATE_FILE, "saved Categorify")
        cat = cls(state["columns"], freq_threshold=state["freq_threshold"], max_size=state["max_size"])
        cat.vocabularies, cat.frequencies = {}, {}
        for i, name in enumerate(cat.columns):
            table = pq.read_table(path / f"{i:03d}.parquet")
            cat.vocabularies[name] = table["value"].combine_chunks()
            cat.frequencies[name] = table["count"].combine_chunks()
        return cat


def _sum_counts(tables: Iterable[pa.Table]) -> pa.Table:
    tables = list(tables)
    if len(tables) == 1:
        return tables[0]
    merged = pa.concat_tables(tables, promote_options="permissive").group_by("value").aggregate([("count", "sum")])
    return merged.rename_columns(["value", "count"])


def get_embedding_sizes(cardinalities: Mapping[str, int] | Any, *, multiplier: float = 1.6,
                        exponent: float = 0.56, min_size: int = 16, max_size: int = 512) -> dict[str, tuple[int, int]]:
    """Suggest ``(rows, dim)`` per column: ``dim = clip(multiplier * rows ** exponent)``.

    The rule of thumb popularised by fast.ai (and used by NVTabular): width grows a little
    slower than the square root of the vocabulary, bounded to ``[min_size, max_size]``.

    Args:
        cardinalities: ``{column: rows}``, a fitted `Categorify`, or a `Schema`.

    Example:
        >>> get_embedding_sizes({"genres": 21, "userId": 162542})
        {'genres': (21, 16), 'userId': (162542, 512)}
    """
    if isinstance(cardinalities, Categorify):
        cardinalities = cardinalities.cardinalities
    elif hasattr(cardinalities, "columns") and hasattr(cardinalities, "names_of"):  # Schema
        cardinalities = {c.name: c.cardinality for c in cardinalities.columns
                         if c.kind in ("categorical", "list") and c.cardinality}
    sizes = {}
    for name, rows in cardinalities.items():
        rows = checks.positive_int(f"cardinality of {name!r}", rows)
        dim = int(round(multiplier * rows ** exponent))
        sizes[name] = (rows, max(min_size, min(max_size, dim)))
    return sizes

