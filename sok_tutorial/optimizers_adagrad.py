"""The accumulator optimizers, sparse: `Adagrad`, `RowWiseAdagrad` and `Ftrl` (FTRL-Proximal).

Adagrad and FTRL keep a running sum of squared gradients per coordinate (FTRL adds a ``linear``
slot from which it recomputes the weights); `RowWiseAdagrad` keeps one per table row, which
costs a table 1 float per row of optimizer state instead of ``dim``. On a table, only the
touched rows and their slots are read and written (`sok_tutorial.optimizers_base`).
`sok_tutorial.optimizers` re-exports all three.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from sok_tutorial.embedding.table import table_of
from sok_tutorial.optimizers_base import (
    _exclude_tables_from_weight_decay,
    _fresh,
    _gather,
    _restart,
    _slot_dtype,
    _slot_prefix,
    _SparseMixin,
    _write,
)


@keras.saving.register_keras_serializable(package="sok_tutorial")
class Adagrad(_SparseMixin, keras.optimizers.Adagrad):
    """``keras.optimizers.Adagrad`` that updates only the touched rows (and accumulators)."""

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor) -> None:
        accumulator = self._accumulators[self._get_variable_index(variable)]
        acc = _restart(_gather(accumulator, rows), _fresh(variable, rows), self.initial_accumulator_value)
        acc = acc + tf.square(g)
        _write(self, accumulator, rows, acc)
        _write(self, variable, rows, _gather(variable, rows) - lr * g / tf.sqrt(acc + self.epsilon))
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

    def _build_slots(self, var_list: list[Any]) -> None:
        for var in var_list:  # one accumulator per row sums over every column: no column slices
            table = table_of(var)
            sharding = getattr(table, "sharding", None)
            if table is not None and sharding in ("column", "row_column"):
                raise ValueError(f"{table.name}: RowWiseAdagrad keeps one accumulator per row of all columns, which "
                                 f"a column-sharded table (sharding={sharding!r}) cannot split; use sharding='row' "
                                 "or another optimizer")
        keras.optimizers.Optimizer.build(self, var_list)
        start = keras.initializers.Constant(self.initial_accumulator_value)
        self._accumulators = [
            self.add_variable((int(var.shape[0]),), initializer=start, dtype=_slot_dtype(var),
                              name=f"{_slot_prefix(var)}_accumulator")
            if table_of(var) is not None else self.add_variable_from_reference(var, "accumulator", initializer=start)
            for var in var_list]
        _exclude_tables_from_weight_decay(self, var_list)

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor) -> None:
        if table_of(variable) is None:  # another variable's sparse gradient: plain Adagrad
            return super()._sparse_step(variable, rows, g, lr)
        accumulator = self._accumulators[self._get_variable_index(variable)]
        acc = _restart(_gather(accumulator, rows), _fresh(variable, rows), self.initial_accumulator_value)
        acc = acc + tf.reduce_mean(tf.square(g), axis=1)  # (U,)
        _write(self, accumulator, rows, acc)
        scale = lr / (tf.sqrt(acc) + self.epsilon)
        _write(self, variable, rows, _gather(variable, rows) - scale[:, None] * g)
        return None


@keras.saving.register_keras_serializable(package="sok_tutorial")
class Ftrl(_SparseMixin, keras.optimizers.Ftrl):
    """``keras.optimizers.Ftrl`` (FTRL-Proximal) that updates only the touched rows and their slots.

    Same arguments and maths as Keras' Ftrl (``learning_rate_power``, ``initial_accumulator_value``,
    ``l1_regularization_strength``, ``l2_regularization_strength``,
    ``l2_shrinkage_regularization_strength``, ``beta``), applied to the rows a step touched; a
    touched row ends where Keras would put it. Keras' dense update also rewrites every untouched
    weight from its ``linear`` slot (``w = (clip(z, -l1, l1) - z) / quadratic``, which is zero for
    a row never trained, whatever its initial value); here untouched rows keep their values, as in
    TensorFlow's ``SparseApplyFtrl``.

    Example:
        >>> from sok_tutorial.embedding import EmbeddingTable
        >>> table = EmbeddingTable(3, 1, dynamic=False)
        >>> table.build()
        >>> _ = table.variable.assign([[1.0], [2.0], [3.0]])
        >>> opt = Ftrl(learning_rate=0.1, l1_regularization_strength=0.01)
        >>> opt.apply([tf.IndexedSlices(tf.constant([[0.5]]), tf.constant([2]))], [table.variable])
        >>> [round(float(x), 4) for x in table.variable.numpy().ravel()]  # only row 2 moved
        [1.0, 2.0, 1.3102]

    References:
        McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013.
    """

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor) -> None:
        index = self._get_variable_index(variable)
        accumulator, linear = self._accumulators[index], self._linears[index]
        fresh = _fresh(variable, rows)
        acc = _restart(_gather(accumulator, rows), fresh, self.initial_accumulator_value)
        z, w = _restart(_gather(linear, rows), fresh), _gather(variable, rows)
        # Keras' order of operations, so that a touched row matches its dense update to rounding
        power = -self.learning_rate_power
        l2 = self.l2_regularization_strength + self.beta / (2.0 * lr)
        new_acc = acc + tf.square(g)
        new_z = z + ((g + 2 * self.l2_shrinkage_regularization_strength * w)
                     - (tf.pow(new_acc, power) - tf.pow(acc, power)) / lr * w)
        quadratic = tf.pow(new_acc, power) / lr + 2 * l2
        l1 = self.l1_regularization_strength
        _write(self, linear, rows, new_z)
        _write(self, variable, rows, (tf.clip_by_value(new_z, -l1, l1) - new_z) / quadratic)
        _write(self, accumulator, rows, new_acc)
        return None
