"""A saved preprocessing workflow: raw rows in, model-ready columns out, the same way every time.

Fitted on training data, saved to a directory, loaded back anywhere (a serving process, the next
day's job) to transform new raw rows identically; ids never seen in training map to the OOV row.

For MovieLens: categorify ``userId`` and ``movieId``, categorify the ``genres`` lists element by
element, and turn ``rating`` into a binary label (``rating >= 4``)::

    workflow = Workflow(cat_names=["userId", "movieId"], list_names=["genres"],
                        label=("rating", 4.0), label_name="liked")
    train, valid = split_rows(ratings, valid_fraction=0.1, by="time")
    workflow.fit(train)
    to_parquet_dataset(workflow.transform(train), ..., **workflow.column_kinds())
    workflow.save("build/data/workflow")
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kernels import checks
from sok_tutorial.atomic import atomic_directory, read_json
from sok_tutorial.data.categorify import Categorify, get_embedding_sizes
from sok_tutorial.data.schema import ColumnSchema, Schema
from sok_tutorial.data.tables import to_table

_STATE = "workflow.json"


def split_rows(table: Any, *, valid_fraction: float = 0.1, by: str = "time", time_column: str = "timestamp",
               seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """(train, valid) rows: the latest `valid_fraction` of rows by `time_column`, or a seeded random
    subset. Splitting by time is the honest setting for recommenders: the model is judged on
    interactions that happen after those it learned from.

    Example:
        >>> t = pa.table({"timestamp": [5, 1, 4, 2, 3], "x": [0, 1, 2, 3, 4]})
        >>> train, valid = split_rows(t, valid_fraction=0.4)
        >>> train["timestamp"].to_pylist(), valid["timestamp"].to_pylist()
        ([1, 2, 3], [4, 5])
    """
    table = to_table(table)
    checks.fraction("valid_fraction", valid_fraction, low=0.0, high=0.99)
    checks.one_of("by", by, ("time", "random"))
    n_valid = int(round(table.num_rows * valid_fraction))
    if by == "time":
        checks.known_names("time_column", [time_column], table.column_names)
        order = pc.sort_indices(table, [(time_column, "ascending")])
    else:
        order = pa.array(np.random.default_rng(seed).permutation(table.num_rows))
    cut = table.num_rows - n_valid
    return table.take(order[:cut]), table.take(order[cut:])


class Workflow:
    """Categorify id and list columns, pass continuous ones through, derive a 0/1 label.

    Args:
        cat_names: id columns (ints or strings) -> contiguous int64 ids, 0 for OOV.
        list_names: multi-hot columns -> lists of ids, categorified element by element.
        cont_names: continuous columns, passed through as float32.
        label: ``(column, threshold)``: the label is ``column >= threshold``; or ``(column, None)``
            to pass a 0/1 column through.
        label_name: name of the label column written.
        freq_threshold: ids seen fewer times in training map to OOV.
    """

    def __init__(self, *, cat_names: Sequence[str] = (), list_names: Sequence[str] = (),
                 cont_names: Sequence[str] = (), label: tuple[str, float | None] | None = None,
                 label_name: str = "label", freq_threshold: int = 0):
        self.cat_names, self.list_names = checks.names("cat_names", cat_names), checks.names("list_names", list_names)
        self.cont_names = checks.names("cont_names", cont_names)
        if not self.cat_names + self.list_names:
            raise ValueError("Workflow needs at least one of cat_names or list_names")
        self.label = None if label is None else (str(label[0]), None if label[1] is None else float(label[1]))
        self.label_name = label_name
        self.categorify = Categorify(self.cat_names + self.list_names, freq_threshold=freq_threshold)

    @property
    def input_columns(self) -> list[str]:
        """Raw columns `transform` needs."""
        return self.cat_names + self.list_names + self.cont_names + ([self.label[0]] if self.label else [])

    def fit(self, table: Any) -> "Workflow":
        table = to_table(table)
        checks.known_names("raw columns", self.input_columns, table.column_names)
        self.categorify.fit(table.select(self.cat_names + self.list_names))
        return self

    def transform(self, table: Any, *, with_label: bool = True) -> pa.Table:
        """Model-ready columns: ids, lists of ids, float32 continuous and (optionally) the label."""
        table = to_table(table)
        needed = self.cat_names + self.list_names + self.cont_names
        if with_label and self.label:
            needed = needed + [self.label[0]]
        checks.known_names("raw columns", needed, table.column_names)
        for name in self.cat_names + self.list_names:
            atype = table.schema.field(name).type
            leaf = atype.value_type if name in self.list_names and pa.types.is_list(atype) else atype
            vocab = self.categorify.vocabularies[name].type if self.categorify.fitted else leaf
            if name in self.list_names and not pa.types.is_list(atype):
                raise TypeError(f"column {name!r} must hold lists (multi-hot), got {atype}")
            if pa.types.is_string(vocab) != (pa.types.is_string(leaf) or pa.types.is_large_string(leaf)):
                raise TypeError(f"column {name!r} holds {leaf} values; the workflow was fitted on {vocab}")
        ids = self.categorify.transform(table.select(self.cat_names + self.list_names))
        columns = {n: ids[n] for n in self.cat_names + self.list_names}
        columns.update({n: pc.cast(table[n], pa.float32()) for n in self.cont_names})
        if with_label and self.label:
            raw = table[self.label[0]]
            columns[self.label_name] = (pc.greater_equal(raw, self.label[1]) if self.label[1] is not None
                                        else raw).cast(pa.int8())
        return pa.table(columns)

    def column_kinds(self) -> dict[str, list[str]]:
        """Keyword arguments for `to_parquet_dataset` / `ParquetLoader`: columns by kind."""
        return {"cat_names": self.cat_names, "list_names": self.list_names, "cont_names": self.cont_names,
                "label_names": [self.label_name] if self.label else []}

    @property
    def output_schema(self) -> Schema:
        """The transformed columns with their kinds and cardinalities; ``metadata["embedding_sizes"]``
        holds ``{column: [rows, suggested dim]}`` (`embedding_sizes` with the default rule)."""
        cards = self.categorify.cardinalities
        cols = [ColumnSchema(n, "categorical", "int64", cardinality=cards[n]) for n in self.cat_names]
        cols += [ColumnSchema(n, "list", "int64", cardinality=cards[n]) for n in self.list_names]
        cols += [ColumnSchema(n, "continuous", "float32") for n in self.cont_names]
        if self.label:
            cols.append(ColumnSchema(self.label_name, "label", "int8"))
        sizes = {name: list(size) for name, size in self.embedding_sizes().items()}
        return Schema(cols, metadata={"embedding_sizes": sizes})

    def embedding_sizes(self, **rule: Any) -> dict[str, tuple[int, int]]:
        """``{column: (rows, suggested dim)}`` (see `get_embedding_sizes`)."""
        return get_embedding_sizes(self.categorify, **rule)

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        with atomic_directory(path, overwrite=overwrite, arg="path") as tmp:
            self.categorify.save(tmp / "categorify")
            state = {"cat_names": self.cat_names, "list_names": self.list_names, "cont_names": self.cont_names,
                     "label": list(self.label) if self.label else None, "label_name": self.label_name,
                     "freq_threshold": self.categorify.freq_threshold}
            (tmp / _STATE).write_text(json.dumps(state, indent=2) + "\n")
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Workflow":
        path = Path(path)
        if not (path / _STATE).is_file():
            raise FileNotFoundError(f"path={str(path)!r} holds no saved Workflow ({_STATE} missing)")
        state = read_json(path / _STATE, "saved Workflow")
        workflow = cls(cat_names=state["cat_names"], list_names=state["list_names"], cont_names=state["cont_names"],
                       label=tuple(state["label"]) if state["label"] else None, label_name=state["label_name"],
                       freq_threshold=state["freq_threshold"])
        workflow.categorify = Categorify.load(path / "categorify")
        return workflow

    def vocabulary(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(raw values, ids) of one column, for building lookup tables elsewhere (a SavedModel)."""
        vocab = self.categorify.vocabularies[name]
        values = vocab.to_numpy(zero_copy_only=False)
        return values, np.arange(1, len(values) + 1, dtype=np.int64)

