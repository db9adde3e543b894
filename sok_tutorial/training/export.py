"""Export for inference: everything a serving process needs, in one directory.

::

    export/
        graph.json          layers with shapes, table sizes, raw inputs of the signature
        model.weights.h5    the Keras weights
        workflow/           the preprocessing workflow (raw rows -> ids)
        saved_model/        a TF SavedModel: raw columns in, click probability out

The SavedModel's ``serving_default`` signature takes the raw columns of the workflow: ids as
int64 (or strings, as the workflow was fitted), multi-hot lists as ``|``-joined strings (the
MovieLens file layout, ``"Action|Comedy"``), continuous values as float32; it maps them with
lookup tables built from the workflow's vocabularies (unseen -> the OOV row) and returns
``{"probability": [batch]}``. `load_export` wraps it for Python callers, and checks types first:
ids must be integers (a float id is never truncated, a numeric string never parsed) and
continuous values numbers.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from sok_tutorial.atomic import atomic_directory, read_json
from sok_tutorial.data.tables import to_array, to_table
from sok_tutorial.data.workflow import Workflow
from sok_tutorial.embedding.table import tables_of
from sok_tutorial.training.summary import keras_embeddings, model_summary, parameter_report

SEPARATOR = "|"


def _lookup(values: np.ndarray, ids: np.ndarray) -> tf.lookup.StaticHashTable:
    keys = tf.constant(values.astype(str) if values.dtype.kind in "OUS" else values.astype(np.int64))
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, tf.constant(ids)), default_value=0)


def _raw_spec(workflow: Workflow) -> dict[str, tf.TensorSpec]:
    spec = {}
    for name in workflow.cat_names:
        vocab = workflow.categorify.vocabularies[name]
        dtype = tf.string if pa.types.is_string(vocab.type) or pa.types.is_large_string(vocab.type) else tf.int64
        spec[name] = tf.TensorSpec([None], dtype, name=name)
    spec.update({n: tf.TensorSpec([None], tf.string, name=n) for n in workflow.list_names})
    spec.update({n: tf.TensorSpec([None], tf.float32, name=n) for n in workflow.cont_names})
    return spec


def _tables(model: Any) -> list[dict[str, Any]]:
    """Rows and width of every embedding table: this package's tables and ``keras.layers.Embedding``."""
    tables = [{"layer": t.name, "rows": getattr(t, "total_rows", t.capacity), "dim": t.dim} for t in tables_of(model)]
    return tables + [{"layer": layer.name, "rows": int(layer.input_dim), "dim": int(layer.output_dim)}
                     for layer in keras_embeddings(model)]


class _Serving:
    """Raw columns -> features -> probability, as one traced function over the model and tables."""

    def __init__(self, model: Any, workflow: Workflow, from_logits: bool):
        self.model = model
        self.tables = {name: _lookup(*workflow.vocabulary(name)) for name in workflow.cat_names + workflow.list_names}
        self.cat_names, self.list_names = list(workflow.cat_names), list(workflow.list_names)
        self.cont_names, self.from_logits = list(workflow.cont_names), from_logits
        self.int_lists = {n: not pa.types.is_string(workflow.categorify.vocabularies[n].type) for n in self.list_names}

    def __call__(self, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        features: dict[str, Any] = {n: self.tables[n].lookup(raw[n]) for n in self.cat_names}
        for name in self.list_names:
            parts = tf.strings.split(raw[name], SEPARATOR)  # (B, None) strings
            parts = tf.ragged.boolean_mask(parts, tf.strings.length(parts) > 0)
            if self.int_lists[name]:
                parts = tf.strings.to_number(parts, tf.int64)
            features[name] = tf.ragged.map_flat_values(self.tables[name].lookup, parts)
        features.update({n: raw[n] for n in self.cont_names})
        out = tf.reshape(self.model(features, training=False), [-1])
        return {"probability": tf.sigmoid(out) if self.from_logits else out}


def export_model(model: Any, workflow: Workflow, path: str | os.PathLike, *, sample: Mapping[str, Any],
                 from_logits: bool = True, overwrite: bool = False) -> Path:
    """Write `model` and `workflow` for serving (see the module docstring).

    Args:
        sample: one batch of model features, to record layer shapes in ``graph.json``.

    Dynamic tables go into the SavedModel as they are: their key index is graph state, so the
    served model maps keys to rows itself, and keys it never saw embed to zeros.
    """
    layers = model_summary(model, sample, print_fn=None)
    with atomic_directory(path, overwrite=overwrite, arg="path") as tmp:
        model.save_weights(tmp / "model.weights.h5")
        workflow.save(tmp / "workflow")
        serving = _Serving(model, workflow, from_logits)
        archive = keras.export.ExportArchive()  # Keras' own SavedModel writer for Keras models
        archive.track(model)
        for table in serving.tables.values():
            archive.track(table)
        archive.add_endpoint(name="serving_default", fn=serving, input_signature=[_raw_spec(workflow)])
        archive.write_out(str(tmp / "saved_model"), verbose=False)
        graph = {"model": type(model).__name__, "layers": layers, "parameters": parameter_report(model),
                 "tables": _tables(model), "inputs": {n: s.dtype.name for n, s in _raw_spec(workflow).items()},
                 "list_separator": SEPARATOR, "output": "probability"}
        (tmp / "graph.json").write_text(json.dumps(graph, indent=2) + "\n")
    return Path(path)


class Predictor:
    """Raw rows in, click probabilities out, through an exported SavedModel."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        graph = read_json(self.path / "graph.json", "export description")
        self.inputs: dict[str, str] = graph["inputs"]
        self._fn = tf.saved_model.load(str(self.path / "saved_model")).signatures["serving_default"]

    def predict(self, rows: Any) -> np.ndarray:
        """Probabilities for raw rows: a dict of columns (lists, NumPy, pandas or Arrow arrays), a
        DataFrame or Arrow table, or a list of dicts.

        Ids (int64 inputs) must be integers and continuous values (float32) numbers; anything else
        raises ValueError naming the column, the type found and the type expected. Multi-hot
        columns take lists of values, joined here, or strings like ``"Action|Comedy"``.
        """
        columns = _raw_columns(rows)
        missing = [n for n in self.inputs if n not in columns]
        if missing:
            raise ValueError(f"rows are missing column(s) {missing}; the model takes {list(self.inputs)}")
        arrays = {name: _column(name, columns[name], dtype) for name, dtype in self.inputs.items()}
        lengths = {name: len(a) for name, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns differ in length: {lengths}")
        feed = {name: _tensor(name, arrays[name], dtype) for name, dtype in self.inputs.items()}
        return self._fn(**feed)["probability"].numpy()


def _raw_columns(rows: Any) -> dict[str, Any]:
    """``{name: values}`` of raw rows, each column still as given (converted one by one later)."""
    if isinstance(rows, Mapping):
        return dict(rows)
    if isinstance(rows, (pa.Table, pa.RecordBatch)) or hasattr(rows, "iloc") or hasattr(rows, "to_arrow"):
        table = to_table(rows)
        return {name: table[name] for name in table.column_names}
    records = list(rows)
    if not all(isinstance(r, Mapping) for r in records):
        raise TypeError("rows: expected a dict of columns, a DataFrame or table, or a list of dicts")
    names = dict.fromkeys(k for r in records for k in r)
    return {name: [r.get(name) for r in records] for name in names}


def _column(name: str, values: Any, dtype: str) -> pa.Array:
    try:
        array = to_array(values)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise ValueError(f"column {name!r}: values of mixed or unsupported types, expected {dtype} ({exc})") from exc
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _tensor(name: str, array: pa.Array, dtype: str) -> tf.Tensor:
    """One raw column as the signature's dtype, refusing any conversion that could change a value."""
    kind = array.type

    def refuse(detail: str = "") -> ValueError:
        return ValueError(f"column {name!r}: got {kind} values, expected {dtype}{detail}")

    if dtype == "int64":
        if not pa.types.is_integer(kind):
            raise refuse(" (integer ids; floats, strings and bools are not converted)")
        if array.null_count:
            raise ValueError(f"column {name!r}: {array.null_count} missing value(s), expected an int64 id in every row")
        try:
            return tf.constant(pc.cast(array, pa.int64()).to_numpy())
        except pa.ArrowInvalid as exc:
            raise refuse(f" ({exc})") from exc
    if dtype == "float32":
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
            raise refuse(" (numbers)")
        values = pc.cast(array, pa.float32(), safe=False).fill_null(float("nan"))  # missing -> NaN, as before
        return tf.constant(values.to_numpy(zero_copy_only=False))
    # string: ids of a string vocabulary, or multi-hot lists (joined with SEPARATOR)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        inner = kind.value_type
        if not (pa.types.is_string(inner) or pa.types.is_large_string(inner) or pa.types.is_integer(inner)
                or pa.types.is_null(inner)):
            raise refuse(" (lists of strings or integer ids)")
        text = ["" if v is None else SEPARATOR.join(str(x) for x in v if x is not None) for v in array.to_pylist()]
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind):
        text = ["" if v is None else str(v) for v in array.to_pylist()]
    else:
        raise refuse(" (strings, integer ids or lists of them)")
    return tf.constant(text, tf.string)


def load_export(path: str | os.PathLike) -> Predictor:
    """Open an export directory for prediction."""
    path = Path(path)
    if not (path / "saved_model").is_dir() or not (path / "graph.json").is_file():
        raise FileNotFoundError(f"path={str(path)!r} is not an export (saved_model/ and graph.json expected)")
    return Predictor(path)
