"""A model summary for recommender models: every layer with its input and output shapes, and the
parameter count split into embedding tables (large, sparse, memory-bound) and dense layers."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.table import table_of


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shape(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_shape(v) for v in value) + ")"
    shape = getattr(value, "shape", None)
    return "?" if shape is None else str(tuple(None if d is None else int(d) for d in shape))


def keras_embeddings(model: Any) -> list[Any]:
    """The ``keras.layers.Embedding`` layers of a model (tables of plain Keras, beside ours)."""
    layers = model._flatten_layers(include_self=True) if hasattr(model, "_flatten_layers") else []
    return [layer for layer in layers if isinstance(layer, keras.layers.Embedding)]


def composed_embedding_weights(model: Any) -> list[Any]:
    """The weights of layers that compose embeddings from several tables and projections
    (`QREmbedding`, `MixedDimensionEmbedding`: their ``embedding_weights``)."""
    layers = model._flatten_layers(include_self=True) if hasattr(model, "_flatten_layers") else []
    return [v for layer in layers for v in getattr(layer, "embedding_weights", ())]


def _is_table(variable: Any, keras_tables: set[int]) -> bool:
    return table_of(variable) is not None or id(variable) in keras_tables


def parameter_report(model: Any) -> dict[str, int]:
    """Parameters and bytes of embedding tables vs everything else (trainable variables).

    Tables are this package's embedding variables and the weights of ``keras.layers.Embedding``
    layers, so a model built either way reports the same split; the projections of a
    `MixedDimensionEmbedding` count as embedding (they are part of its vectors).
    """
    tables = {id(v) for layer in keras_embeddings(model) for v in layer.trainable_variables}
    tables |= {id(v) for v in composed_embedding_weights(model)}
    emb = [v for v in model.trainable_variables if _is_table(v, tables)]
    dense = [v for v in model.trainable_variables if not _is_table(v, tables)]

    def count(vs: list[Any]) -> int:
        return int(sum(int(np.prod(v.shape)) for v in vs))

    def nbytes(vs: list[Any]) -> int:
        return int(sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in vs))

    return {"embedding_parameters": count(emb), "dense_parameters": count(dense),
            "embedding_bytes": nbytes(emb), "dense_bytes": nbytes(dense)}


def model_summary(model: Any, sample: Any, print_fn: Callable[[str], None] | None = print) -> list[dict[str, Any]]:
    """Run `model` on `sample` (one batch of features) and report each layer it calls.

    Returns rows ``{"layer", "type", "inputs", "outputs", "parameters", "kind"}`` (kind is
    ``embedding`` for table layers), and prints them as a table unless ``print_fn=None``.
    """
    rows: list[dict[str, Any]] = []
    layers = model._flatten_layers(include_self=False)
    held = {id(sub) for layer in layers
            if getattr(layer, "table", None) is not None or hasattr(layer, "embedding_weights")
            for sub in layer._flatten_layers(include_self=False)}
    layers = [layer for layer in layers if id(layer) not in held]  # a SOK layer's tables are part of that layer
    originals = {}

    def wrap(layer: Any) -> Callable[..., Any]:
        original = layer.call

        def call(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if not any(r["layer"] == layer.name for r in rows):
                params = int(sum(int(np.prod(v.shape)) for v in layer.trainable_variables))
                kind = "embedding" if (isinstance(layer, keras.layers.Embedding) or any(
                    table_of(v) is not None for v in layer.trainable_variables)) else "dense"
                rows.append({"layer": layer.name, "type": type(layer).__name__, "inputs": _shape(args[0] if args else
                             kwargs), "outputs": _shape(out), "parameters": params, "kind": kind})
            return out

        return call

    for layer in layers:
        originals[id(layer)] = layer.call
        layer.call = wrap(layer)
    try:
        model(sample, training=False)
    finally:
        for layer in layers:
            layer.call = originals[id(layer)]
    if print_fn is not None:
        widths = [max(len(str(r[k])) for r in rows + [{k: k for k in rows[0]}]) for k in rows[0]] if rows else []
        header = list(rows[0]) if rows else []
        print_fn("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for r in rows:
            print_fn("  ".join(str(r[h]).ljust(w) for h, w in zip(header, widths)))
        report = parameter_report(model)
        print_fn(f"embedding parameters {report['embedding_parameters']:,} "
                 f"({report['embedding_bytes'] / 2**20:.1f} MiB), dense parameters "
                 f"{report['dense_parameters']:,} ({report['dense_bytes'] / 2**20:.1f} MiB)")
    return rows
