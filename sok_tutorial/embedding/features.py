"""`FeatureEmbedding`: many features over several tables, nested ids in, nested activations out.

The layer behind `sok_tutorial.embedding.keras_rs.from_keras_rs`, with Keras-RS's call contract:
``layer(inputs, weights=None, training=None)`` takes a nested structure (dict, list, tuple) of
ids, one entry per `Feature`, and returns the same structure of activations. A feature looks
up one `Table`; features naming the same table share it (one variable, one lookup per step for
all of them: their ids are concatenated, looked up once and split again). Each table is held by
a SOK `DistributedEmbedding` layer (``layer.tables[name]`` is its `EmbeddingTable`, a
`ShardedTable` when it is sharded over the replicas of a strategy), so every option of those
tables comes along: dynamic vocabularies, eviction, admission, change tracking for delta
exports, 16-bit storage, a table's own sparse optimizer.

A feature's ids are dense (``[batch]``: one vector each; ``[batch, ..., n]``: n combined), a
``tf.RaggedTensor`` ``[batch, None]`` or a ``tf.SparseTensor`` ``[batch, n]`` (each row combined),
optionally weighted, or the uncombined sequence of a row's first ``sequence_length`` ids;
`sok_tutorial.embedding.feature_ids` draws each layout and what its activation is. Combining is
the table's ``combiner``, as Keras-RS's default-device path computes it
(``keras_rs.layers.EmbedReduce``).

Shapes are checked when the layer is built: a feature whose ids do not have the rank and
sizes of its declared ``input_shape`` (the batch dimension, the first, may be any size; a
``None`` size any), or whose activation would not have its declared ``output_shape``, is an
error naming the feature. Ids of a table that is not dynamic must lie in ``[0,
vocabulary_size)``; anything else is an error naming the table when the step runs.

Example:
    >>> layer = FeatureEmbedding({"user": Feature("user", "users"), "genres": Feature("genres", "genres")},
    ...                          [Table("users", 100, 4), Table("genres", 20, 4, combiner="sum")])
    >>> out = layer({"user": tf.constant([3, 7]), "genres": tf.ragged.constant([[1, 2, 5], []])})
    >>> out["user"].shape, out["genres"].shape, out["genres"].numpy()[1].tolist()
    (TensorShape([2, 4]), TensorShape([2, 4]), [0.0, 0.0, 0.0, 0.0])
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.common import global_state

from kernels import checks
from sok_tutorial.embedding import fused
from sok_tutorial.embedding.combiners import COMBINERS
from sok_tutorial.embedding.feature_ids import prepare
from sok_tutorial.embedding.layers import DistributedEmbedding
from sok_tutorial.embedding.nested import flatten, is_shape, pack, path_name
from sok_tutorial.embedding.ops import ids_below
from sok_tutorial.embedding.precision import DenseOptimizerGuard


@dataclass(frozen=True)
class Table:
    """One embedding table of a `FeatureEmbedding`.

    Args:
        name: the table's name (distinct within the layer).
        vocabulary_size: its rows; ids are row ids in ``[0, vocabulary_size)`` unless `dynamic`.
        dim: vector width.
        combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"``, for every feature looking it up.
        initializer: a Keras initializer the table draws each key's first vector from
            (`sok_tutorial.embedding.initializers`).
        optimizer: its own optimizer, one of `sok_tutorial.optimizers`; None: the model's.
        dynamic: any int64 id gets a row on first sight, up to `capacity` rows per replica.
        capacity: rows per replica (SOK's ``max_vocabulary_size_per_gpu``); None: `vocabulary_size`.
        sharding, column_shards: its layout over the replicas of a strategy
            (`sok_tutorial.embedding.layouts`); ``"replicated"``: a whole copy on each.
        options: further options of `EmbeddingTable` (eviction, admission, ``track_changes``,
            ``storage_dtype``...).
    """

    name: str
    vocabulary_size: int
    dim: int
    combiner: str = "mean"
    initializer: Any = "random_uniform"
    optimizer: Any = None
    dynamic: bool = False
    capacity: int | None = None
    sharding: str = "replicated"
    column_shards: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Feature:
    """One input of a `FeatureEmbedding`: the table it looks up and the shapes it declares.

    `input_shape` and `output_shape` include the batch dimension (and `output_shape` the width);
    None leaves a shape unchecked. ``sequence_length > 0``: the activation is the sequence of the
    first `sequence_length` ids' vectors, zero-padded (TensorFlow's ``max_sequence_length``)."""

    name: str
    table: str
    input_shape: tuple | None = None
    output_shape: tuple | None = None
    sequence_length: int = 0


class _OwnOptimizerGuard(DenseOptimizerGuard):
    """The constraint of a table with its own optimizer: a Keras optimizer reaching it would update
    every row with its own formula, and the table's optimizer would never run."""

    def __call__(self, w: Any) -> Any:
        raise ValueError(f"table {self.table!r} has its own optimizer ({self.storage}), but the model's optimizer is "
                         "a Keras optimizer, which would update the table itself, densely. Compile the model with "
                         "one of sok_tutorial.optimizers (e.g. sok_tutorial.optimizers.Adam()): it hands each table to "
                         "its own optimizer and updates everything else; or build the layer with fused=True, which "
                         "updates each table in the backward pass")


@contextlib.contextmanager
def _real_state() -> Iterator[None]:
    """Out of Keras' shape-only trace, for building tables. Keras traces a layer without a `build`
    of its own (a subclassed model) in a stateless scope and a scratch graph to learn its output
    shapes, and builds the layers inside it there; a sharded table writes its initial rows when it
    is built, which that scope refuses. Building is the same wherever it happens, so it happens
    eagerly, as Keras does with the variables it defers."""
    scope = global_state.get_global_attribute("stateless_scope")
    global_state.set_global_attribute("stateless_scope", None)
    try:
        with tf.init_scope():
            yield
    finally:
        global_state.set_global_attribute("stateless_scope", scope)


def _shape(shape: Any) -> tuple | None:
    if shape is None:
        return None
    shape = tf.TensorShape(shape)
    return None if shape.rank is None else tuple(shape.as_list())


def _fits(declared: tuple, actual: tuple) -> bool:
    """Same rank, and the same size wherever both know it (the batch dimension aside)."""
    return len(declared) == len(actual) and all(
        d is None or a is None or d == a for d, a in zip(declared[1:], actual[1:]))


class FeatureEmbedding(keras.layers.Layer):
    """Nested ids in, nested activations out, over several tables (module docstring).

    Args:
        features: a `Feature`, or a nested structure (dicts, lists, tuples) of them.
        tables: every `Table` the features name, each once.
        plan: the `sok_tutorial.embedding.Plan` that placed the tables, kept for display (`plan`).
        fused: update each table that has its own optimizer in the backward pass
            (`sok_tutorial.embedding.fused`), so that the model may compile with any optimizer;
            False: the model's optimizer, one of `sok_tutorial.optimizers`, hands each table to its
            own (a Keras optimizer is refused), which is faster here, all updates after the backward pass.
    """

    def __init__(self, features: Any, tables: Sequence[Table], *, plan: Any = None, fused: bool = False,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.fused = bool(fused)
        leaves = flatten(features, lambda v: not isinstance(v, (Mapping, list, tuple)))
        by_name: dict[str, Table] = {}
        for table in tables:
            if not isinstance(table, Table):
                raise TypeError(f"tables: expected Table objects, got {type(table).__name__}")
            if table.name in by_name:
                raise ValueError(f"tables: two tables are named {table.name!r}; table names must differ")
            checks.one_of(f"table {table.name!r}: combiner", table.combiner, COMBINERS)
            by_name[table.name] = table
        if not leaves:
            raise ValueError("features: expected at least one Feature")
        for path, feature in leaves:
            where = path_name(path)
            if not isinstance(feature, Feature):
                raise TypeError(f"features: the entry at {where} is a {type(feature).__name__}, expected a Feature")
            if feature.table not in by_name:
                raise ValueError(f"feature {feature.name!r} (at {where}) names table {feature.table!r}, which is not "
                                 f"among the tables: {sorted(by_name)}")
        self._features = features
        self._paths = [path_name(p) for p, _ in leaves]
        self._leaves = [f for _, f in leaves]
        self._table_defs = dict(by_name)
        self.plan = plan
        self._holders: dict[str, DistributedEmbedding] = {}

    # ------------------------------------------------------------------ tables
    @property
    def tables(self) -> dict[str, Any]:
        """The `EmbeddingTable` of each table name (built on first use)."""
        if not self.built:
            self.build(None)
        return {name: holder.table for name, holder in self._holders.items()}

    def build(self, input_shape: Any = None) -> None:
        if self.built:
            return
        if input_shape is not None:
            self._check_shapes(input_shape)
        with _real_state():
            self._build_tables()
        for name, holder in self._holders.items():  # tables with their own optimizer
            if self._table_defs[name].optimizer is None:
                continue
            if self.fused:  # updated by it in the backward pass
                fused.fuse(holder.table)
            elif holder.table.variable.constraint is None:
                holder.table.variable.constraint = _OwnOptimizerGuard(name, type(holder.table.optimizer).__name__)
        super().build(input_shape)

    def _build_tables(self) -> None:
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if self.plan is not None and self.plan.num_replicas != replicas:
            raise ValueError(f"{self.name}: its tables were placed for {self.plan.num_replicas} replicas, but it is "
                             f"built under a strategy of {replicas}: create the layer in the scope of the strategy "
                             "it trains under")
        for name, t in self._table_defs.items():
            holder = DistributedEmbedding(
                t.combiner, t.capacity or t.vocabulary_size, t.dim, slot_num=1, max_nnz=1, use_hashtable=t.dynamic,
                embedding_initializer=t.initializer, sharding=t.sharding, column_shards=t.column_shards,
                optimizer=t.optimizer, name=name, **t.options)
            holder.build()
            self._holders[name] = holder
        if self.fused and any(t.optimizer is not None for t in self._table_defs.values()):
            self._anchor = self.add_weight(name="fused_anchor", shape=(), initializer="zeros", trainable=True)

    def _check_shapes(self, input_shape: Any) -> None:
        shapes = _flat_like(self, input_shape, "input shapes", is_leaf=is_shape)
        for path, feature, shape in zip(self._paths, self._leaves, shapes):
            actual = _shape(shape)
            if actual is None:
                continue
            where = f"feature {feature.name!r} (at {path})"
            if feature.input_shape is not None and not _fits(_shape(feature.input_shape), actual):
                raise ValueError(f"{where}: ids of shape {actual} do not match its input_shape "
                                 f"{_shape(feature.input_shape)} (the batch dimension may be any size)")
            if feature.output_shape is not None:
                out = self._output_shape(feature, actual)
                if not _fits(_shape(feature.output_shape), out):
                    raise ValueError(f"{where}: ids of shape {actual} give activations of shape {out}, not its "
                                     f"output_shape {_shape(feature.output_shape)}")

    def _output_shape(self, feature: Feature, input_shape: tuple) -> tuple:
        dim = self._table_defs[feature.table].dim
        if feature.sequence_length:
            return (input_shape[0], feature.sequence_length, dim)
        return (*input_shape[:max(1, len(input_shape) - 1)], dim)

    def compute_output_shape(self, input_shape: Any) -> Any:
        shapes = _flat_like(self, input_shape, "input shapes", is_leaf=is_shape)
        out = [self._output_shape(f, _shape(s)) for f, s in zip(self._leaves, shapes)]
        return pack(self._features, out)

    # ------------------------------------------------------------------ lookups
    def call(self, inputs: Any, weights: Any = None, training: Any = None) -> Any:
        ids = _flat_like(self, inputs, "inputs")
        weights = [None] * len(ids) if weights is None else _flat_like(self, weights, "weights")
        prepared = [prepare(f"feature {f.name!r} (at {path})", x, w, self._table_defs[f.table].combiner,
                            self._table_defs[f.table].dim, f.sequence_length)
                    for path, f, x, w in zip(self._paths, self._leaves, ids, weights)]
        out: list[Any] = [None] * len(ids)
        for name, holder in self._holders.items():
            mine = [i for i, f in enumerate(self._leaves) if f.table == name]
            if not mine:
                continue
            keys = [prepared[i][0] for i in mine]
            flat = tf.concat(keys, 0) if len(keys) > 1 else keys[0]
            flat = self._checked(name, flat)
            if self.fused and self._table_defs[name].optimizer is not None:  # (n, dim): one lookup, every feature
                vectors = fused.lookup(holder.table, flat, training, self._anchor)
            else:
                vectors = holder.table.lookup(flat, training)
            parts = tf.split(vectors, [tf.size(k) for k in keys], 0) if len(keys) > 1 else [vectors]
            for i, part in zip(mine, parts):
                out[i] = tf.cast(prepared[i][1](part), self.compute_dtype)
        return pack(self._features, out)

    def _checked(self, name: str, keys: tf.Tensor) -> tf.Tensor:
        """`keys` of a table of row ids, once checked to lie in ``[0, vocabulary_size)``."""
        t = self._table_defs[name]
        if t.dynamic:
            return keys
        users = sorted({f.name for f in self._leaves if f.table == name})
        message = (f"table {name!r} (features {users}): an id lies outside [0, vocabulary_size={t.vocabulary_size}); "
                   "a dynamic table (dynamic=True) takes any int64 id")
        return ids_below(keys, t.vocabulary_size, message)

    # ------------------------------------------------------------------ whole tables
    def get_embedding_tables(self) -> dict[str, np.ndarray]:
        """Each table of row ids as an array ``[vocabulary_size, dim]`` (row ``i``: id ``i``), by
        name, whatever its layout (Keras-RS's method of the same name)."""
        out = {}
        for name, table in self.tables.items():
            t = self._static(name)
            rows = table.export()
            keep = rows["keys"] < t.vocabulary_size
            full = np.zeros((t.vocabulary_size, t.dim), np.float32)
            full[rows["keys"][keep]] = rows["vectors"][keep]
            out[name] = full
        return out

    def set_embedding_tables(self, values: Mapping[str, Any]) -> None:
        """Set tables of row ids from arrays ``[vocabulary_size, dim]`` by name (say those of a
        Keras-RS layer's ``get_embedding_tables()``); every array is checked before any is written."""
        unknown = sorted(set(values) - set(self._table_defs))
        if unknown:
            raise ValueError(f"set_embedding_tables: no tables named {unknown}; the tables are "
                             f"{sorted(self._table_defs)}")
        arrays = {}
        for name, value in values.items():
            t = self._static(name)
            array = np.asarray(value, np.float32)
            if array.shape != (t.vocabulary_size, t.dim):
                raise ValueError(f"set_embedding_tables: table {name!r} has shape {array.shape}, expected "
                                 f"{(t.vocabulary_size, t.dim)}")
            arrays[name] = array
        tables = self.tables
        for name, array in arrays.items():  # the rows change; their optimizer state stays as it is
            current = tables[name].export()
            order = np.argsort(current["keys"])
            slots = {k: v[order] for k, v in current.items() if k.startswith("slot_")}
            tables[name].restore({"keys": np.arange(len(array), dtype=np.int64), "vectors": array, **slots})

    def _static(self, name: str) -> Table:
        t = self._table_defs[name]
        if t.dynamic:
            raise ValueError(f"table {name!r} is dynamic: its rows belong to whichever ids arrived, so it has no "
                             "[vocabulary_size, dim] form; read it by key with layer.tables[name].export()")
        return t


def _flat_like(layer: FeatureEmbedding, values: Any, what: str, is_leaf: Callable[[Any], bool] | None = None) -> list:
    """`values` flattened in the order of the layer's features, once checked to have their structure."""
    flat = flatten(values, is_leaf)
    paths = [path_name(p) for p, _ in flat]
    if paths != layer._paths:
        missing = [p for p in layer._paths if p not in paths]
        extra = [p for p in paths if p not in layer._paths]
        raise ValueError(f"{layer.name}: {what} do not have the features' structure: missing {missing}, "
                         f"unexpected {extra} (features at {layer._paths})")
    return [v for _, v in flat]
