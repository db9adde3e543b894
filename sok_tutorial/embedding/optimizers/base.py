"""What every sparse optimizer of `sok_tutorial.optimizers` shares: `SparseOptimizer` and the row helpers.

An optimizer's sparse path reads a gradient's distinct rows (`touched`), gathers those rows of
each slot (`gather`), computes Keras' formula on them and writes them back whole (`write`). The
variable's own rows come from the lookup that produced the gradient, which read them already
(`current`): each row of a table is read once per step. Embedding tables always take this
path, even for a dense gradient (`as_sparse`), so their untouched rows and slots are never read
or written.

A table that evicts keys gives an evicted key's row to a new key. The new key must not inherit
the old one's optimizer state, so each update of a table's rows asks the table once which of
them are fresh (`fresh_rows_of`, `EmbeddingTable.fresh_rows`) and starts their gathered slot values
afresh (`restart`); a table that never reuses a row answers None, and nothing is added.

A table may have its own optimizer (``EmbeddingTable(..., optimizer=...)``, the SOK layers'
``optimizer=``). The model's optimizer then hands that table's variable over: `build` builds it
into the table's optimizer, `apply` (which ``model.fit`` reaches through ``apply_gradients``)
passes its gradient to that optimizer's own `apply`, in the same replica context, so each
optimizer all-reduces its own gradients under ``tf.distribute``, and follows its own learning
rate schedule, step count, clipping, gradient accumulation and EMA. `variables` lists the
tables' optimizers' variables after the model optimizer's own, so a checkpoint of the model's
optimizer (`sok_tutorial.training.checkpoint`) keeps their step counts along with their slots.
(``keras.saving.load_model`` gives tables back without their optimizer: ``EmbeddingTable``'s
config does not hold it.)

A table stored in float16 or bfloat16 (`sok_tutorial.embedding.precision`) is updated in
float32: `gather` casts the rows and slots it reads up, every formula runs unchanged on them,
and `write` rounds what it writes back to the variable's type, to nearest or stochastically
(the table's ``stochastic_rounding``, with the optimizer's step count in the noise's seed).
Slots are created in the table's ``slot_dtype`` (`slot_dtype`).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

import tensorflow as tf

from sok_tutorial.embedding import huge_pages, precision
from sok_tutorial.embedding.collectives import all_gather_slices
from sok_tutorial.embedding.dedup import PARTS_FROM, distinct, sum_by_position
from sok_tutorial.embedding.ops import UniqueRowsGradient, read_rows, write_rows
from sok_tutorial.embedding.table import table_of


def touched(gradient: tf.IndexedSlices, dtype: Any, num_rows: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """(distinct rows, summed gradient per row) of an IndexedSlices gradient of a variable of
    `num_rows` rows (None: not known while tracing).

    A variable of fewer than `PARTS_FROM` rows has no more distinct rows than that (`distinct`'s
    ``most``): one ``tf.unique`` and one segment sum, two ops where `distinct`'s parts and
    `sum_by_position`'s two products, which pay off on large tables only, take about ninety. A
    step with many small tables, each updated on each replica (replicated tables' gathered
    gradients), has that many fewer ops per update to trace and optimize at its first call.
    """
    if isinstance(gradient, UniqueRowsGradient):
        return tf.cast(gradient.indices, tf.int64), tf.cast(gradient.values, dtype)
    rows, position = distinct(tf.cast(gradient.indices, tf.int64), any_order=True, most=num_rows)
    values = tf.cast(gradient.values, dtype)
    if num_rows is not None and num_rows < PARTS_FROM:
        return rows, tf.math.unsorted_segment_sum(values, position, tf.size(rows))
    return rows, sum_by_position(values, position, tf.size(rows))  # (each row's sum in key order)


def current(gradient: tf.IndexedSlices, variable: Any, rows: tf.Tensor) -> tf.Tensor:
    """The values of `rows` of `variable` now, for the update: the rows a table's lookup read in
    this step when its gradient arrives as it left the lookup (`UniqueRowsGradient.read`, so the
    step reads each row once), else a gather."""
    if isinstance(gradient, UniqueRowsGradient) and gradient.read is not None:
        return gradient.read
    return gather(variable, rows)


def gather(slot: Any, rows: tf.Tensor) -> tf.Tensor:
    """Rows of a variable or slot (a resource gather: reads only these rows), float16 and bfloat16 in float32."""
    return precision.widen(read_rows(slot, rows))


def write(optimizer: Any, variable: Any, rows: tf.Tensor, values: tf.Tensor) -> None:
    """Write rows back, rounded to the variable's type when it is narrower (as its table rounds), in
    scatters that run side by side (`write_rows`)."""
    dtype = tf.as_dtype(variable.dtype)
    if values.dtype != dtype:
        table, stream = table_of(variable), 0
        if table is None:
            table, stream = precision.slot_owner(variable)
        stochastic = table is not None and table.precision.stochastic_rounding
        values = precision.narrow(values, dtype, rows, stochastic=stochastic, step=optimizer.iterations,
                                  seed=table.init.seed if stochastic else 0, stream=stream)
    write_rows(variable, rows, values)


def slot_dtype(variable: Any) -> Any:
    """The dtype of `variable`'s per-row slots: its table's ``slot_dtype``, else its own."""
    table = table_of(variable)
    return variable.dtype if table is None else table.precision.slot


def fresh_rows_of(variable: Any, rows: tf.Tensor) -> tf.Tensor | None:
    """Which of `rows` (distinct) of a table went to a new key since their last update, bool ``[U]``,
    clearing the marks; None for other variables and for tables that never reuse a row. Call it
    once per update of a variable's rows by an optimizer with per-row slots, so that the marks are
    cleared (plain SGD, which has none, skips it: a mark it leaves set restarts, at the first update
    by another optimizer, slots that start at zero anyway)."""
    table = table_of(variable)
    return None if table is None else table.fresh_rows(rows)


def restart(values: tf.Tensor, fresh: tf.Tensor | None, initial: Any = 0.0) -> tf.Tensor:
    """Gathered slot rows `values` ``[U, ...]`` with the `fresh` ones at the slot's `initial` value."""
    if fresh is None:
        return values
    mask = tf.reshape(fresh, [-1] + [1] * (values.shape.rank - 1))  # (U, 1, ...): broadcast over a row
    return tf.where(mask, tf.cast(initial, values.dtype), values)


def as_sparse(gradient: Any, variable: Any) -> Any:
    """Embedding tables always take the sparse path (a dense gradient touches every row)."""
    if isinstance(gradient, tf.IndexedSlices) or table_of(variable) is None:
        return gradient
    return tf.IndexedSlices(gradient, tf.range(tf.shape(gradient, tf.int64)[0]))


def slot_prefix(variable: Any) -> str:
    """Keras' naming of per-variable optimizer state: the variable's path with ``_`` for ``/``."""
    return getattr(variable, "path", variable.name).replace("/", "_")


def exclude_tables_from_weight_decay(optimizer: Any, var_list: list[Any]) -> None:
    """Dense weight decay would touch every row of a table: leave tables out (Keras matches by key)."""
    excluded = set(getattr(optimizer, "_exclude_from_weight_decay", set()))
    optimizer._exclude_from_weight_decay = excluded | {optimizer._var_key(v) for v in var_list
                                                       if table_of(v) is not None}


def unscaled(gradient: Any, scale: float | None) -> Any:
    """`gradient` of a loss that the model's optimizer scaled by `scale` (``loss_scale_factor``), unscaled."""
    if scale is None or gradient is None:
        return gradient
    if isinstance(gradient, tf.IndexedSlices):  # keeps UniqueRowsGradient's promise of distinct rows
        return type(gradient)(gradient.values / scale, gradient.indices, gradient.dense_shape)
    return gradient / scale


def sharded(variable: Any) -> bool:
    """A table whose replicas hold different rows: its gradient is per replica, never all-reduced."""
    table = table_of(variable)
    return table is not None and table.num_shards > 1


@dataclass(frozen=True)
class SlotLayout:
    """An optimizer's state for one table, declared once by the optimizer (`SparseOptimizer.slot_layout`).

    `slots` are the slot variables it keeps for a table: (name, values per element of a row,
    values per row beside them). `splits_by_column`: whether a column-sharded table may split the
    state by columns (False for a per-row value that mixes every column of the row, as
    `RowWiseAdagrad`'s accumulator). The planner prices a table's state from `per_element` and
    `per_row`; column sharding slices each slot by its values per element.

    Example:
        >>> SlotLayout((("moments", 2, 1),)).per_element, SlotLayout((("moments", 2, 1),)).per_row
        (2, 1)
    """

    slots: tuple[tuple[str, int, int], ...] = ()
    splits_by_column: bool = True

    @property
    def per_element(self) -> int:
        return sum(s[1] for s in self.slots)

    @property
    def per_row(self) -> int:
        return sum(s[2] for s in self.slots)

    def of(self, variable_name: str) -> tuple[int, int]:
        """(values per element, values per row) of the slot variable named `variable_name`
        (Keras names a table's slot ``<table variable path>_<slot name>``)."""
        for name, per_element, per_row in self.slots:
            if variable_name.split(":")[0].endswith(f"_{name}"):
                return per_element, per_row
        raise ValueError(f"optimizer slot {variable_name!r} is not one of {[s[0] for s in self.slots]}")


LAYOUTS: dict[str, type] = {}  # the planner's optimizer names -> classes (each registers itself)


def slot_layout(optimizer: Any) -> SlotLayout:
    """The `SlotLayout` of an optimizer, or of the one named `optimizer` with its defaults
    (``"sgd"``, ``"adam"``, ``"lazyadam"``, ``"adagrad"``, ``"ftrl"``, ``"rowwise_adagrad"``).

    Example:
        >>> slot_layout("lazyadam").per_element, slot_layout("lazyadam").per_row
        (2, 1)
    """
    if isinstance(optimizer, str):
        if optimizer not in LAYOUTS:
            raise ValueError(f"optimizer={optimizer!r} is invalid: expected one of {sorted(LAYOUTS)}")
        return LAYOUTS[optimizer].LAYOUT
    return optimizer.slot_layout()


class SparseOptimizer:
    """Shared by the sparse optimizers. Touched rows are read and written back whole
    (``scatter_update``), which on CPU costs about half of an in-place ``scatter_sub``.

    Subclasses create their slots in `_build_slots` (Keras' ``build`` by default). Variables of a
    table with its own optimizer go to that one (module docstring).
    """

    NAME: ClassVar[str] = ""  # the planner's name for it (`LAYOUTS`)
    LAYOUT: ClassVar[SlotLayout] = SlotLayout()  # its state for a table, with default arguments
    _delegates: tuple[Any, ...] = ()  # the tables' own optimizers, found by build
    _built_for: list[Any] | None = None  # every variable build was given: apply(grads) without variables

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("NAME"):
            LAYOUTS[cls.NAME] = cls

    def slot_layout(self) -> SlotLayout:
        """This optimizer's state for a table (its arguments may change it: momentum, amsgrad)."""
        return self.LAYOUT

    def __init__(self, *args: Any, **kwargs: Any):
        rate = kwargs.get("learning_rate", args[0] if args else None)
        if isinstance(rate, numbers.Real) and (isinstance(rate, bool) or not rate > 0):
            raise ValueError(f"learning_rate={rate!r} is invalid: expected a positive number (or a schedule)")
        super().__init__(*args, **kwargs)

    def build(self, var_list: list[Any]) -> None:
        if self.built:
            return
        variables = list(var_list)
        own, others = self._split(variables)
        for other, positions in others:
            other.build([variables[i] for i in positions])
        self._refuse_column_splits([variables[i] for i in own])
        # plain attributes, out of Keras' and TF's tracking: the model's variables and other
        # optimizers are not this optimizer's state
        object.__setattr__(self, "_built_for", variables)
        object.__setattr__(self, "_delegates", tuple(other for other, _ in others))
        self._build_slots([variables[i] for i in own])
        for variable in variables:
            table = table_of(variable)
            if table is None:
                continue
            slots = table.optimizer_slots(self)
            huge_pages.advise(slots)  # (new: not updated yet)
            if table.precision.low:  # slots of low-precision tables round as their table does
                for slot in slots:
                    precision.own_slot(table, slot)

    def _refuse_column_splits(self, variables: list[Any]) -> None:
        """A column-sharded table cannot split state that mixes a row's columns: refused before any
        slot exists (a step would train each replica's columns with its own per-row value)."""
        if self.slot_layout().splits_by_column:
            return
        for variable in variables:
            table = table_of(variable)
            if table is not None and table.column_groups > 1:
                raise ValueError(f"{table.name}: {type(self).__name__} keeps one value per row of all columns, which "
                                 f"a column-sharded table (sharding={getattr(table, 'sharding', None)!r}) cannot "
                                 "split; use sharding='row' or another optimizer")

    def add_variable_from_reference(self, reference_variable: Any, name: str | None = None,
                                    initializer: Any = "zeros") -> Any:
        """Keras' slot of a variable, in its table's ``slot_dtype`` for a table."""
        dtype = slot_dtype(reference_variable)
        if dtype == reference_variable.dtype:
            return super().add_variable_from_reference(reference_variable, name, initializer)
        return self.add_variable(shape=reference_variable.shape, initializer=initializer, dtype=dtype,
                                 name=f"{slot_prefix(reference_variable)}_{name or 'var'}")

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Dense gradients of other variables: Keras' own update. Everything else (a table's
        gradient always): `_sparse_step` on the distinct touched rows and their summed gradients."""
        gradient = as_sparse(gradient, variable)
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = precision.compute_dtype(variable.dtype)  # float32 for a low-precision table
        rows, g = touched(gradient, dtype, variable.shape[0])
        return self._sparse_step(variable, rows, g, tf.cast(learning_rate, dtype), current(gradient, variable, rows))

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor, w: tf.Tensor) -> None:
        """Update `rows` (distinct) of `variable` from their summed gradients `g` and their values
        now, `w` (``[U, ...]``, in the compute dtype), writing them back with `write`."""
        raise NotImplementedError

    def _build_slots(self, var_list: list[Any]) -> None:
        exclude_tables_from_weight_decay(self, var_list)
        super().build(var_list)

    def _table_optimizer(self, variable: Any) -> Any:
        """The own optimizer of `variable`'s table, or None when this one updates the variable."""
        table = table_of(variable)
        other = None if table is None else table.optimizer
        if other is None or other is self:
            return None
        if not isinstance(other, SparseOptimizer):
            kind = f"{type(other).__module__}.{type(other).__qualname__}"
            raise TypeError(f"table {table.name!r}: optimizer={kind} is invalid: expected one of "
                            "sok_tutorial.optimizers (SGD, Adagrad, Adam, LazyAdam, Ftrl, RowWiseAdagrad), which "
                            "update only the rows a step touched")
        if other.loss_scale_factor is not None:
            raise ValueError(f"table {table.name!r}: its optimizer has loss_scale_factor={other.loss_scale_factor!r}, "
                             "expected None: the model's optimizer scales the loss and unscales every gradient")
        return other

    def _split(self, variables: list[Any]) -> tuple[list[int], list[tuple[Any, list[int]]]]:
        """(positions of `variables` this optimizer updates, [(a table's optimizer, its positions)]),
        having checked every table's optimizer, so that a bad one fails before anything changes."""
        own: list[int] = []
        others: dict[int, tuple[Any, list[int]]] = {}
        for i, variable in enumerate(variables):
            other = self._table_optimizer(variable)
            if other is None:
                own.append(i)
            else:
                others.setdefault(id(other), (other, []))[1].append(i)
        return own, list(others.values())

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        """Keras' ``apply``, once the pairs of tables with their own optimizer went to theirs. The
        step counts even when only those tables had gradients."""
        grads = list(grads)
        if trainable_variables is None and self._delegates:
            trainable_variables = self._built_for
        if trainable_variables is None:
            with precision.sparse_update(self._built_for or getattr(self, "_trainable_variables", [])):
                return super().apply(grads)
        variables = list(trainable_variables)
        with precision.sparse_update(variables):
            return self._apply(grads, variables)

    def _apply(self, grads: list[Any], variables: list[Any]) -> None:
        own, others = self._split(variables)
        if not others:
            return super().apply(grads, variables)
        if not self.built:
            self.build(variables)
        handed_over = False
        for other, positions in others:
            pairs = [(unscaled(grads[i], self.loss_scale_factor), variables[i]) for i in positions
                     if grads[i] is not None]
            if pairs:
                other.apply([g for g, _ in pairs], [v for _, v in pairs])
                handed_over = True
        own_grads = [grads[i] for i in own]
        if handed_over and all(g is None for g in own_grads):
            self._iterations.assign_add(1)  # a step all the same (Keras refuses an apply without gradients)
        else:
            super().apply(own_grads, [variables[i] for i in own])
        return None

    @property
    def variables(self) -> list[Any]:
        """This optimizer's variables, then those of the tables' own optimizers."""
        own = super().variables
        seen = {id(v) for v in own}
        return own + [v for other in self._delegates for v in other.variables if id(v) not in seen]

    def finalize_variable_values(self, var_list: list[Any]) -> None:
        """End of ``model.fit``: each optimizer finalizes its own variables (EMA overwrite)."""
        variables = list(var_list)
        own, others = self._split(variables)
        for other, positions in others:
            other.finalize_variable_values([variables[i] for i in positions])
        super().finalize_variable_values([variables[i] for i in own])

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> list[tuple[Any, Any]]:
        """All-reduce every gradient but those of sharded tables: each replica's shard gradient
        is already the sum over replicas of its own rows (see `sok_tutorial.embedding.sharding`),
        and `strategy.extended.update` hands each replica's gradient to its own shard. Sparse
        gradients (replicated tables') are gathered all together (`all_gather_slices`), the dense
        ones all-reduced by Keras."""
        pairs = list(grads_and_vars)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return super()._all_reduce_sum_gradients(pairs)
        out = list(pairs)  # a sharded table's pair stays as it is
        kept = [i for i, (g, v) in enumerate(pairs) if not (g is not None and sharded(v))]
        sparse = [i for i in kept if isinstance(pairs[i][0], tf.IndexedSlices)]
        for i, g in zip(sparse, all_gather_slices(context, [pairs[i][0] for i in sparse])):
            out[i] = (g, pairs[i][1])
        dense = [i for i in kept if i not in sparse]
        if any(pairs[i][0] is not None for i in dense):
            for i, pair in zip(dense, super()._all_reduce_sum_gradients([pairs[i] for i in dense])):
                out[i] = pair
        return out
