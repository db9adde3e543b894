"""`Adagrad` and `RowWiseAdagrad`, sparse.

Adagrad keeps a running sum of squared gradients per coordinate; `RowWiseAdagrad` keeps one per
table row, which
costs a table 1 float per row of optimizer state instead of ``dim``. On a table, only the
touched rows and their slots are read and written (`sok_tutorial.embedding.optimizers.base`).
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from sok_tutorial.embedding.optimizers.base import (
    SlotLayout,
    SparseOptimizer,
    exclude_tables_from_weight_decay,
    fresh_rows_of,
    gather,
    restart,
    slot_dtype,
    slot_prefix,
    write,
)
from sok_tutorial.embedding.table import table_of


@keras.saving.register_keras_serializable(package="sok_tutorial")
class Adagrad(SparseOptimizer, keras.optimizers.Adagrad):
    """``keras.optimizers.Adagrad`` that updates only the touched rows (and accumulators)."""

    NAME, LAYOUT = "adagrad", SlotLayout((("accumulator", 1, 0),))

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor, w: tf.Tensor) -> None:
        accumulator = self._accumulators[self._get_variable_index(variable)]
        acc = restart(gather(accumulator, rows), fresh_rows_of(variable, rows), self.initial_accumulator_value)
        acc = acc + tf.square(g)
        write(self, accumulator, rows, acc)
        write(self, variable, rows, w - lr * g / tf.sqrt(acc + self.epsilon))
        return None


@keras.saving.register_keras_serializable(package="sok_tutorial")
class RowWiseAdagrad(Adagrad):
    """Row-wise Adagrad (TorchRec's ``EXACT_ROWWISE_ADAGRAD``): one accumulator per table row.

    For each touched row ``r`` of an embedding table, with ``g`` its summed gradient ``[dim]``::

        acc[r] += mean(g ** 2)                 # one scalar per row: slot shape [rows]
        w[r]   -= learning_rate * g / (sqrt(acc[r]) + epsilon)

    A table's optimizer state is then 1 float per row instead of ``dim`` (Adagrad) or ``2 * dim``
    (Adam). Variables that are not embedding tables (dense layers) get plain `Adagrad`, an
    accumulator per element, as TorchRec leaves them to a dense optimizer.

    Args:
        learning_rate: float or a Keras schedule.
        initial_accumulator_value: each accumulator's start (Keras' Adagrad default, 0.1;
            TorchRec starts at 0).
        epsilon: added to ``sqrt(acc)`` (outside the root, as in TorchRec; Keras' Adagrad adds
            it inside).
        **kwargs: the other arguments of ``keras.optimizers.Adagrad`` (clipnorm, name...).

    Example:
        >>> from sok_tutorial.embedding import EmbeddingTable
        >>> table = EmbeddingTable(3, 2, dynamic=False)
        >>> table.build()
        >>> _ = table.variable.assign(tf.ones([3, 2]))
        >>> opt = RowWiseAdagrad(learning_rate=0.1, initial_accumulator_value=0.0, epsilon=0.0)
        >>> opt.apply([tf.IndexedSlices(tf.constant([[3.0, 4.0]]), tf.constant([1]))], [table.variable])
        >>> [round(float(x), 4) for x in table.variable.numpy()[1]]  # acc = (9 + 16) / 2
        [0.9151, 0.8869]
        >>> [tuple(v.shape) for v in table.optimizer_slots(opt)]  # one accumulator per row
        [(3,)]

    References:
        Duchi et al., "Adaptive Subgradient Methods for Online Learning and Stochastic
        Optimization", JMLR 2011; FBGEMM's ``rowwise_adagrad`` embedding update.
    """

    NAME, LAYOUT = "rowwise_adagrad", SlotLayout((("accumulator", 0, 1),), splits_by_column=False)

    def _build_slots(self, var_list: list[Any]) -> None:
        keras.optimizers.Optimizer.build(self, var_list)
        start = keras.initializers.Constant(self.initial_accumulator_value)
        self._accumulators = [
            self.add_variable((int(var.shape[0]),), initializer=start, dtype=slot_dtype(var),
                              name=f"{slot_prefix(var)}_accumulator")
            if table_of(var) is not None else self.add_variable_from_reference(var, "accumulator", initializer=start)
            for var in var_list]
        exclude_tables_from_weight_decay(self, var_list)

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor, w: tf.Tensor) -> None:
        if table_of(variable) is None:  # another variable's sparse gradient: plain Adagrad
            return super()._sparse_step(variable, rows, g, lr, w)
        accumulator = self._accumulators[self._get_variable_index(variable)]
        acc = restart(gather(accumulator, rows), fresh_rows_of(variable, rows), self.initial_accumulator_value)
        acc = acc + tf.reduce_mean(tf.square(g), axis=1)  # (U,)
        write(self, accumulator, rows, acc)
        scale = lr / (tf.sqrt(acc) + self.epsilon)
        write(self, variable, rows, w - scale[:, None] * g)
        return None
