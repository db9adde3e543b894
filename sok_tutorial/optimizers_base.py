"""What every sparse optimizer of `sok_tutorial.optimizers` shares: `_SparseMixin` and the row helpers.

An optimizer's sparse path reads a gradient's distinct rows (`_touched`), gathers those rows of
the variable and of each slot (`_gather`), computes Keras' formula on them and writes them back
whole (`_write`). Embedding tables always take this path, even for a dense gradient (`_sparse`),
so their untouched rows and slots are never read or written.

A table that evicts keys gives an evicted key's row to a new key. The new key must not inherit
the old one's optimizer state, so each update of a table's rows asks the table once which of
them are fresh (`_fresh`, `EmbeddingTable.fresh_rows`) and starts their gathered slot values
afresh (`_restart`); a table that never reuses a row answers None, and nothing is added.
"""
from __future__ import annotations

import numbers
from typing import Any

import keras
import tensorflow as tf

from sok_tutorial.embedding.ops import UniqueRowsGradient, sum_by_position
from sok_tutorial.embedding.table import table_of


def _touched(gradient: tf.IndexedSlices, dtype: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """(distinct rows, summed gradient per row) of an IndexedSlices gradient."""
    if isinstance(gradient, UniqueRowsGradient):
        return tf.cast(gradient.indices, tf.int64), tf.cast(gradient.values, dtype)
    rows, position = tf.unique(tf.cast(gradient.indices, tf.int64), out_idx=tf.int32)
    return rows, sum_by_position(tf.cast(gradient.values, dtype), position, tf.size(rows))


def _tf(variable: Any) -> Any:
    """The tf.Variable behind a Keras variable (a tf.Variable is returned as is)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _gather(slot: Any, rows: tf.Tensor) -> tf.Tensor:
    return tf.gather(_tf(slot), rows)  # a resource gather: reads only these rows


def _write(optimizer: Any, variable: Any, rows: tf.Tensor, values: tf.Tensor) -> None:
    optimizer.assign(variable, tf.IndexedSlices(values, rows))


def _fresh(variable: Any, rows: tf.Tensor) -> tf.Tensor | None:
    """Which of `rows` (distinct) of a table went to a new key since their last update, bool ``[U]``,
    clearing the marks; None for other variables and for tables that never reuse a row. Call it
    once per update of a variable's rows, slots or not, so that the marks are cleared."""
    table = table_of(variable)
    return None if table is None else table.fresh_rows(rows)


def _restart(values: tf.Tensor, fresh: tf.Tensor | None, initial: Any = 0.0) -> tf.Tensor:
    """Gathered slot rows `values` ``[U, ...]`` with the `fresh` ones at the slot's `initial` value."""
    if fresh is None:
        return values
    mask = tf.reshape(fresh, [-1] + [1] * (values.shape.rank - 1))  # (U, 1, ...): broadcast over a row
    return tf.where(mask, tf.cast(initial, values.dtype), values)


def _sparse(gradient: Any, variable: Any) -> Any:
    """Embedding tables always take the sparse path (a dense gradient touches every row)."""
    if isinstance(gradient, tf.IndexedSlices) or table_of(variable) is None:
        return gradient
    return tf.IndexedSlices(gradient, tf.range(tf.shape(gradient, tf.int64)[0]))


def _slot_prefix(variable: Any) -> str:
    """Keras' naming of per-variable optimizer state: the variable's path with ``_`` for ``/``."""
    return getattr(variable, "path", variable.name).replace("/", "_")


def _exclude_tables_from_weight_decay(optimizer: Any, var_list: list[Any]) -> None:
    """Dense weight decay would touch every row of a table: leave tables out (Keras matches by key)."""
    excluded = set(getattr(optimizer, "_exclude_from_weight_decay", set()))
    optimizer._exclude_from_weight_decay = excluded | {optimizer._var_key(v) for v in var_list
                                                       if table_of(v) is not None}


def _sharded(variable: Any) -> bool:
    """A table whose replicas hold different rows: its gradient is per replica, never all-reduced."""
    table = table_of(variable)
    return table is not None and table.num_shards > 1


class _SparseMixin:
    """Shared by the sparse optimizers. Touched rows are read and written back whole
    (``scatter_update``), which on CPU costs about half of an in-place ``scatter_sub``.

    Subclasses create their slots in `_build_slots` (Keras' ``build`` by default).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        rate = kwargs.get("learning_rate", args[0] if args else None)
        if isinstance(rate, numbers.Real) and (isinstance(rate, bool) or not rate > 0):
            raise ValueError(f"learning_rate={rate!r} is invalid: expected a positive number (or a schedule)")
        super().__init__(*args, **kwargs)

    def build(self, var_list: list[Any]) -> None:
        if self.built:
            return
        self._build_slots(list(var_list))

    def _build_slots(self, var_list: list[Any]) -> None:
        _exclude_tables_from_weight_decay(self, var_list)
        super().build(var_list)

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> list[tuple[Any, Any]]:
        """All-reduce every gradient but those of sharded tables: each replica's shard gradient
        is already the sum over replicas of its own rows (see `sok_tutorial.embedding.sharding`),
        and `strategy.extended.update` hands each replica's gradient to its own shard."""
        pairs = list(grads_and_vars)
        local = {i for i, (g, v) in enumerate(pairs) if g is not None and _sharded(v)}
        if not local or tf.distribute.get_replica_context() is None:
            return super()._all_reduce_sum_gradients(pairs)
        rest = [(g, v) for i, (g, v) in enumerate(pairs) if i not in local]
        reduced = iter(super()._all_reduce_sum_gradients(rest) if any(g is not None for g, _ in rest) else rest)
        return [pairs[i] if i in local else next(reduced) for i in range(len(pairs))]
