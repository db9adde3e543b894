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
``{"probability": [batch]}``. `load_export` wraps it for Python callers.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pyarrow as pa
import tensorflow as tf

from sok_tutorial.atomic import atomic_directory
from sok_tutorial.data.workflow import Workflow, rows_to_table
from sok_tutorial.training.summary import model_summary, parameter_report

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

    Embedding layers with a dynamic vocabulary are frozen into static tables for the SavedModel.
    """
    frozen = []
    for layer in model._flatten_layers(include_self=False):
        if getattr(layer, "vocabulary", None) is not None:
            layer.freeze_vocabulary()
            frozen.append(layer._frozen)
    layers = model_summary(model, sample, print_fn=None)
    with atomic_directory(path, overwrite=overwrite, arg="path") as tmp:
        model.save_weights(tmp / "model.weights.h5")
        workflow.save(tmp / "workflow")
        serving = _Serving(model, workflow, from_logits)
        archive = keras.export.ExportArchive()  # Keras' own SavedModel writer for Keras models
        archive.track(model)
        for table in list(serving.tables.values()) + frozen:
            archive.track(table)
        archive.add_endpoint(name="serving_default", fn=serving, input_signature=[_raw_spec(workflow)])
        archive.write_out(str(tmp / "saved_model"), verbose=False)
        graph = {"model": type(model).__name__, "layers": layers, "parameters": parameter_report(model),
                 "inputs": {n: s.dtype.name for n, s in _raw_spec(workflow).items()},
                 "list_separator": SEPARATOR, "output": "probability"}
        (tmp / "graph.json").write_text(json.dumps(graph, indent=2) + "\n")
    return Path(path)


class Predictor:
    """Raw rows in, click probabilities out, through an exported SavedModel."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        graph = json.loads((self.path / "graph.json").read_text())
        self.inputs: dict[str, str] = graph["inputs"]
        self._fn = tf.saved_model.load(str(self.path / "saved_model")).signatures["serving_default"]

    def predict(self, rows: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Probabilities for raw rows (a dict of columns or a list of dicts); lists of values for
        multi-hot columns are joined here, strings like ``"Action|Comedy"`` pass as they are."""
        table = rows_to_table(rows)
        missing = [n for n in self.inputs if n not in table.column_names]
        if missing:
            raise ValueError(f"rows are missing column(s) {missing}; the model takes {list(self.inputs)}")
        feed = {}
        for name, dtype in self.inputs.items():
            column = table[name]
            try:
                if dtype == "string":
                    values = [v if isinstance(v, str) else SEPARATOR.join(map(str, v or [])) if isinstance(v, list)
                              else str(v) for v in column.to_pylist()]
                    feed[name] = tf.constant(values, tf.string)
                else:
                    arr = np.asarray(column.to_pylist(), dtype=np.int64 if dtype == "int64" else np.float32)
                    feed[name] = tf.constant(arr)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"column {name!r}: cannot pass {column.type} values as {dtype} ({exc})") from exc
        return self._fn(**feed)["probability"].numpy()


def load_export(path: str | os.PathLike) -> Predictor:
    """Open an export directory for prediction."""
    path = Path(path)
    if not (path / "saved_model").is_dir() or not (path / "graph.json").is_file():
        raise FileNotFoundError(f"path={str(path)!r} is not an export (saved_model/ and graph.json expected)")
    return Predictor(path)
