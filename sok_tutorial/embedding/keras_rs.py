"""Coming from Keras-RS: `from_keras_rs` builds this library's embedding layer from the
configuration Keras-RS takes, with the same call contract.

Keras-RS's ``keras_rs.layers.DistributedEmbedding`` takes a nested structure (a dict, list or
tuple, nested at will) of ``keras_rs.layers.FeatureConfig``, each naming a
``keras_rs.layers.TableConfig``, or of TensorFlow's ``tf.tpu.experimental.embedding``
feature configs. Only TPUs with SparseCore accelerate it; elsewhere it looks each feature up on
the default device, in fixed vocabularies, unsharded. `from_keras_rs` reads the same structure
and returns a `sok_tutorial.embedding.features.FeatureEmbedding`: the same nested ids in (dense,
ragged or sparse, optionally with weights), the same nested activations out, and underneath
this library's tables::

    keras-rs                               from_keras_rs
    FeatureConfig(name, table,             Feature: ids checked against input_shape and
      input_shape, output_shape)             output_shape when the layer is built
    TableConfig(name, vocabulary_size,     one table per TableConfig, shared by the features
      embedding_dim, initializer,            naming it; initializer and combiner carried over
      optimizer, combiner, placement)        (config_options), the optimizer as its sparse twin
    placement="auto" / "sparsecore"        the planner (`plan`) places the table over the
                                             replicas of the strategy in scope: replicated, row-,
                                             column- or grid-sharded, within memory_per_replica
    placement="default_device"             a whole copy on every replica
    table_stacking, max_ids_per_partition  TPU matters, ignored

and, as keyword options for every table (``tables={"name": {...}}`` for one): ``dynamic=True``
(any int64 id, ``capacity`` rows per replica), eviction and admission
(``eviction_policy``, ``min_count``...), ``track_changes`` for delta exports
(`sok_tutorial.training.delta`), ``storage_dtype="bfloat16"``.

A table's optimizer applies as it would on a TPU, sparsely. Either compile the model with one of
`sok_tutorial.optimizers`, which hands each table to its own optimizer after the backward pass and
updates the dense layers itself (a Keras optimizer is then refused, with a message saying so: it
would update every row of every table itself, as Keras-RS does on CPU and GPU, where it ignores
``TableConfig.optimizer``); or build with ``fused=True``: each table is updated by its own
optimizer in the backward pass (`sok_tutorial.embedding.fused`), and the model compiles with any
optimizer, a Keras one as Keras-RS's examples do, for its dense layers. A table whose
``optimizer`` is None is trained by the model's.

TensorFlow's configs become features too: ``max_sequence_length > 0`` gives the sequence of
vectors ``[batch, max_sequence_length, dim]``; ``output_shape`` (without the width) is checked;
unnamed tables are called ``table_0``, ``table_1``... in order of appearance.

Errors, all raised here or when the layer is built, name the feature or table: a feature naming
a table that is not in the structure (a name where a `TableConfig` goes), two tables with one
name, an optimizer, initializer or combiner without an equivalent here, ids whose shapes do not
match the declared ones.

Example:
    >>> import keras_rs
    >>> movies = keras_rs.layers.TableConfig("movies", vocabulary_size=1000, embedding_dim=8, optimizer="adagrad")
    >>> layer = from_keras_rs({
    ...     "movie": keras_rs.layers.FeatureConfig("movie", movies, (64,), (64, 8)),
    ...     "watched": keras_rs.layers.FeatureConfig("watched", movies, (64, None), (64, 8))})
    >>> out = layer({"movie": tf.range(64), "watched": tf.ragged.constant([[1, 2, 3]] * 64)})
    >>> out["movie"].shape, out["watched"].shape, list(layer.tables)
    (TensorShape([64, 8]), TensorShape([64, 8]), ['movies'])
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import lifecycle, precision
from sok_tutorial.embedding.combiners import COMBINERS
from sok_tutorial.embedding.config_options import initializer_of, sparse_optimizer
from sok_tutorial.embedding.features import Feature, FeatureEmbedding, Table, flatten, pack, path_name
from sok_tutorial.embedding.planner import TableSpec, plan, table_bytes

EXTRA = "pip install 'sok-tutorial[keras-rs]' (or pip install keras-rs)"
PLACEMENTS = ("auto", "default_device", "sparsecore")
TABLE_OPTIONS = ("dynamic", "capacity", *lifecycle.OPTIONS, *precision.OPTIONS)
SHARDINGS = ("replicated", "row", "column", "row_column")  # one table each: "table" would pile them on one replica


def _keras_rs() -> Any:
    try:
        import keras_rs
    except ImportError:
        return None
    return keras_rs


def from_keras_rs(feature_configs: Any, *, memory_per_replica: int | None = None, global_batch: int | None = None,
                  tables: Mapping[str, Mapping[str, Any]] | None = None, name: str | None = None,
                  fused: bool = False, **table_options: Any) -> FeatureEmbedding:
    """This library's embedding layer for Keras-RS's `feature_configs` (module docstring).

    Args:
        feature_configs: a ``keras_rs.layers.FeatureConfig`` or
            ``tf.tpu.experimental.embedding.FeatureConfig``, or a nested structure of them.
        memory_per_replica: bytes of tables and optimizer state each replica may hold, for the
            planner (None: no limit, the cheapest placement of each table).
        global_batch: samples per step, for the planner's cost model (default: the batch size the
            features declare).
        tables: options of single tables, by table name, over `table_options`.
        name: the layer's name.
        fused: update each table in the backward pass, so the model may compile with any optimizer,
            a Keras one as Keras-RS's examples do (`FeatureEmbedding`).
        table_options: options of every table: ``dynamic``, ``capacity`` and those of
            `sok_tutorial.embedding.EmbeddingTable` (eviction, admission, ``track_changes``,
            ``storage_dtype``...).

    Call this in the scope of the strategy the model trains under, as Keras-RS asks: the planner
    places the tables over its replicas.
    """
    krs = _keras_rs()
    leaves = flatten(feature_configs, lambda v: not isinstance(v, (Mapping, list, tuple)))
    configs: dict[str, Any] = {}  # table name -> its config object
    owners: dict[int, str] = {}  # id(config) -> table name
    users: dict[str, list[str]] = {}  # table name -> features
    wanted: list[tuple[str, Any, Any]] = []  # (path, feature config, its table or the name it gives)
    for path, fc in leaves:
        path = path_name(path)
        if krs is not None and isinstance(fc, krs.layers.FeatureConfig):
            table = fc.table
        elif isinstance(fc, tf.tpu.experimental.embedding.FeatureConfig):
            table = fc.table
        elif krs is None:
            raise ImportError(f"from_keras_rs: the entry at {path} is a {type(fc).__name__}; reading "
                              f"keras_rs.layers.FeatureConfig needs Keras-RS, which is not installed: {EXTRA}")
        else:
            raise TypeError(f"feature_configs: the entry at {path} is a {type(fc).__name__}, expected a "
                            "keras_rs.layers.FeatureConfig or a tf.tpu.experimental.embedding.FeatureConfig")
        wanted.append((path, fc, table))
        if isinstance(table, str):
            continue
        if not hasattr(table, "vocabulary_size"):
            raise TypeError(f"feature {_feature_name(fc, path)!r} (at {path}): table is a {type(table).__name__}, "
                            "expected a TableConfig (or the name of one in the structure)")
        if id(table) not in owners:
            tname = table.name if table.name is not None else f"table_{sum(c.name is None for c in configs.values())}"
            if tname in configs:
                raise ValueError(f"two tables are named {tname!r} (features {users[tname]} use one, "
                                 f"{_feature_name(fc, path)!r} the other): pass the same TableConfig to share a "
                                 "table, or name them apart")
            owners[id(table)], configs[tname], users[tname] = tname, table, []
        users[owners[id(table)]].append(_feature_name(fc, path))
    features = []
    for path, fc, table in wanted:
        if isinstance(table, str):
            if table not in configs:
                raise ValueError(f"feature {_feature_name(fc, path)!r} (at {path}) names table {table!r}, which is "
                                 f"not in the structure: its tables are {sorted(configs)}")
            tname = table
        else:
            tname = owners[id(table)]
        features.append(_feature(fc, path, tname, configs[tname]))
    defs = [_table(tname, config, _options(tname, table_options, tables, configs))
            for tname, config in configs.items()]
    defs, placed = _place(defs, {n: getattr(c, "placement", "auto") for n, c in configs.items()}, features,
                          memory_per_replica, global_batch)
    return FeatureEmbedding(pack(feature_configs, features), defs, plan=placed, name=name, fused=fused)


def _feature_name(fc: Any, path: str) -> str:
    return fc.name if getattr(fc, "name", None) else path


def _feature(fc: Any, path: str, table: str, config: Any) -> Feature:
    dim = _dim(config)
    if isinstance(fc, tf.tpu.experimental.embedding.FeatureConfig):
        length = fc.max_sequence_length
        out = fc.output_shape
        output = None if out.rank is None else (*out.as_list(), dim)
        if length and output is None:
            output = (None, length, dim)
        return Feature(_feature_name(fc, path), table, None, output, sequence_length=length)
    shapes = []
    for arg in ("input_shape", "output_shape"):
        shape = getattr(fc, arg)
        try:
            shape = tuple(tf.TensorShape(shape).as_list())
        except (TypeError, ValueError):
            raise ValueError(f"feature {fc.name!r} (at {path}): {arg}={shape!r} is invalid: expected a shape such "
                             "as (batch,) or (batch, dim)") from None
        shapes.append(shape)
    if len(shapes[0]) < 1 or len(shapes[1]) < 2 or shapes[1][-1] not in (None, dim):
        raise ValueError(f"feature {fc.name!r} (at {path}): input_shape={fc.input_shape} and output_shape="
                         f"{fc.output_shape} are invalid: expected a batch dimension first, and the table's width "
                         f"{dim} last in output_shape")
    return Feature(fc.name, table, *shapes)


def _dim(config: Any) -> int:
    return config.embedding_dim if hasattr(config, "embedding_dim") else config.dim


def _table(name: str, config: Any, options: dict[str, Any]) -> Table:
    rows = checks.positive_int(f"table {name!r}: vocabulary_size", config.vocabulary_size)
    dim = checks.positive_int(f"table {name!r}: embedding_dim", _dim(config))
    combiner = config.combiner
    if combiner not in COMBINERS:
        raise ValueError(f"table {name!r}: combiner={combiner!r} is not supported: expected one of {COMBINERS}")
    placement = getattr(config, "placement", "auto")
    checks.one_of(f"table {name!r}: placement", placement, PLACEMENTS)
    if getattr(config, "quantization_config", None) is not None:
        raise ValueError(f"table {name!r}: quantization_config is not supported; storage_dtype='bfloat16' or "
                         "'float16' stores rows in 16 bits")
    dynamic, capacity = bool(options.pop("dynamic", False)), options.pop("capacity", None)
    if capacity is not None:
        checks.positive_int(f"table {name!r}: capacity", capacity)
        if not dynamic:
            raise ValueError(f"table {name!r}: capacity={capacity} is for a dynamic table (dynamic=True); a table of "
                             f"row ids holds its vocabulary_size={rows}")
    return Table(name, rows, dim, combiner, initializer_of(config.initializer, rows, dim, name),
                 sparse_optimizer(config.optimizer, name), dynamic, capacity, options=options)


def _options(name: str, common: dict[str, Any], per_table: Mapping[str, Mapping[str, Any]] | None,
             configs: Mapping[str, Any]) -> dict[str, Any]:
    per_table = dict(per_table or {})
    unknown = sorted(set(per_table) - set(configs))
    if unknown:
        raise ValueError(f"tables: no tables named {unknown} in the structure; its tables are {sorted(configs)}")
    options = {**common, **dict(per_table.get(name, {}))}
    bad = sorted(set(options) - set(TABLE_OPTIONS))
    if bad:
        raise ValueError(f"table {name!r}: unknown option(s) {bad}: expected some of {TABLE_OPTIONS}")
    return options


def _place(tables: list[Table], placements: dict[str, str], features: list[Feature], budget: int | None,
           global_batch: int | None) -> tuple[list[Table], Any]:
    """The tables with the planner's placement for the strategy in scope (one replica: as they are)."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    planned = [t for t in tables if placements[t.name] != "default_device"]
    if replicas == 1 or not planned:
        return tables, None
    if global_batch is None:
        global_batch = next((f.input_shape[0] for f in features if f.input_shape and f.input_shape[0]), None)
    if global_batch is None:
        raise ValueError("from_keras_rs: the features declare no batch size, which the planner needs to place the "
                         "tables over replicas: pass global_batch=")
    dtypes = {t.options.get("storage_dtype", "float32") for t in planned}
    if len(dtypes) > 1:
        raise ValueError(f"from_keras_rs: the planner places tables of one storage_dtype, got {sorted(dtypes)}; "
                         "give the tables of different types placement='default_device'")
    per_sample = {t.name: 0.0 for t in tables}
    for f in features:
        size = f.sequence_length or math.prod(d or 1 for d in (f.input_shape or (None,))[1:])
        per_sample[f.table] += size
    specs = [TableSpec(t.name, rows=t.capacity or t.vocabulary_size, dim=t.dim,
                       ids_per_sample=max(per_sample[t.name], 1.0),
                       optimizer=t.optimizer.NAME if t.optimizer is not None else "adam", dynamic=t.dynamic)
             for t in planned]
    whole = sum(table_bytes(t.capacity or t.vocabulary_size, t.dim, t.options.get("storage_dtype", "float32"),
                            t.optimizer.NAME if t.optimizer is not None else "adam", indexed=t.dynamic)
                for t in tables if placements[t.name] == "default_device")
    room = (1 << 62) if budget is None else checks.positive_int("memory_per_replica", budget) - whole
    if room < 1:
        raise ValueError(f"memory_per_replica={budget:,} is smaller than the tables placed on every replica "
                         f"(placement='default_device') need: {whole:,} bytes")
    placed = plan(specs, replicas, room, global_batch=global_batch, shardings=SHARDINGS, dtypes=tuple(dtypes))
    out = []
    for t in tables:
        if placements[t.name] == "default_device":
            out.append(t)
            continue
        p = placed[t.name]
        capacity = p.rows_per_replica if (p.sharding != "replicated" or t.dynamic) else None
        out.append(replace(t, capacity=capacity, sharding=p.sharding, column_shards=p.column_shards,
                           options={**t.options, "storage_dtype": p.storage_dtype}))
    return out, placed
