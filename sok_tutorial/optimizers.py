"""Sparse optimizers for Keras 3: a step reads and writes only the table rows it touched.

An embedding lookup's gradient is a ``tf.IndexedSlices`` over the rows a batch used. Keras'
own optimizers turn it into a dense tensor the size of the whole table and update every row
(and every slot) each step. These subclasses of the Keras optimizers apply the very same update
formulas to the touched rows only: one gather and one scatter of the rows and one of each slot
variable, and every other row and its slots stay bit-identical. A table's own gradient
(`sok_tutorial.embedding.ops.UniqueRowsGradient`) already holds distinct rows with summed
gradients; any other sparse gradient is first deduplicated (``tf.unique``, then one sparse
matrix product sums the repeats). Dense gradients go to the Keras implementation unchanged, so
one optimizer serves a whole model, in ``model.fit`` and under ``tf.distribute``.

* `SGD` (with optional momentum), `Adagrad`, `Adam`: Keras' maths on the touched rows; Adam's
  bias correction uses the optimizer's step count, exactly as Keras does.
* `LazyAdam`: Adam whose bias correction counts, per row, the steps that updated the row, so a
  rarely seen row is corrected as fully as a frequent one. For a row touched at every step it
  equals `Adam`.
* `Ftrl`: Keras' FTRL-Proximal on the touched rows; untouched rows keep their values, where
  Keras' dense FTRL recomputes every weight.
* `RowWiseAdagrad`: TorchRec's row-wise Adagrad, one accumulator scalar per table row (1 float
  of state per row instead of ``dim``); plain Adagrad for other variables.

`Adagrad`, `Ftrl` and `RowWiseAdagrad` live in `sok_tutorial.optimizers_adagrad`, the shared
machinery in `sok_tutorial.optimizers_base`; all are importable from here.

A table may have its own optimizer (``EmbeddingTable(..., optimizer=Ftrl(...))`` or the SOK
layers' ``optimizer=``): the model's optimizer, any of these, hands that table's gradients to it
and updates everything else itself (`sok_tutorial.optimizers_base`), in ``model.fit`` as in a
custom loop. A row that a table gives to a new key after evicting the old one
(`EmbeddingTable.fresh_rows`) starts its slots afresh: zeros for momenta, Adam's moments,
LazyAdam's count and FTRL's linear slot, ``initial_accumulator_value`` for accumulators.
Weight decay, when set, applies to dense variables only (it would otherwise touch every row).

Example:
    >>> from sok_tutorial.embedding import EmbeddingTable
    >>> wide = EmbeddingTable(10, 2, dynamic=False, optimizer=Ftrl(0.1), name="wide")
    >>> deep = EmbeddingTable(10, 2, dynamic=False, name="deep")
    >>> wide.build()
    >>> deep.build()
    >>> opt = Adam(0.01)  # the model's optimizer: deep's rows; wide's go to its Ftrl
    >>> grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([4]))
    >>> opt.apply([grad, grad], [wide.variable, deep.variable])
    >>> int(opt.iterations), int(wide.optimizer.iterations)
    (1, 1)
    >>> [v.name.split("_")[-1] for v in wide.optimizer_slots(opt)]  # wide's state is Ftrl's
    ['accumulator', 'linear']
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from sok_tutorial.embedding.table import table_of
from sok_tutorial.optimizers_adagrad import Adagrad, Ftrl, RowWiseAdagrad
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

__all__ = ["SGD", "Adagrad", "Adam", "LazyAdam", "Ftrl", "RowWiseAdagrad"]


@keras.saving.register_keras_serializable(package="sok_tutorial")
class SGD(_SparseMixin, keras.optimizers.SGD):
    """``keras.optimizers.SGD`` that updates only the touched rows of sparse gradients."""

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor) -> None:
        if self.momentum == 0:  # no per-row state: a fresh-row mark left set only restarts slots still at zero
            _write(self, variable, rows, _gather(variable, rows) - g * lr)
            return None
        fresh = _fresh(variable, rows)
        momentum = tf.cast(self.momentum, g.dtype)
        m = self.momentums[self._get_variable_index(variable)]
        m_new = _restart(_gather(m, rows), fresh) * momentum - g * lr
        _write(self, m, rows, m_new)
        step = m_new * momentum - g * lr if self.nesterov else m_new
        _write(self, variable, rows, _gather(variable, rows) + step)
        return None


@keras.saving.register_keras_serializable(package="sok_tutorial")
class Adam(_SparseMixin, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` that updates only the touched rows (and their moments).

    An embedding table's moments live in one slot variable ``[rows, k * dim]`` (``m | v``, then
    ``v_hat`` with amsgrad, then a per-row step count for `LazyAdam`): one gather and one write
    per step instead of one per moment. Other variables keep Keras' own slots.
    """

    _row_counts = False  # LazyAdam: keep a per-row step count in the fused slot

    def _build_slots(self, var_list: list[Any]) -> None:
        keras.optimizers.Optimizer.build(self, var_list)  # Keras Adam's slots only where needed
        self._momentums, self._velocities, self._velocity_hats, self._fused, self._row_steps = [], [], [], [], []
        for var in var_list:
            rows = int(var.shape[0]) if len(var.shape) else 1
            if table_of(var) is not None:
                width = int(var.shape[-1]) * (3 if self.amsgrad else 2) + (1 if self._row_counts else 0)
                self._fused.append(self.add_variable((rows, width), name=f"{_slot_prefix(var)}_moments",
                                                     dtype=_slot_dtype(var)))
                self._momentums.append(None)
                self._velocities.append(None)
                self._velocity_hats.append(None)
                self._row_steps.append(None)
            else:
                self._fused.append(None)
                self._momentums.append(self.add_variable_from_reference(var, "momentum"))
                self._velocities.append(self.add_variable_from_reference(var, "velocity"))
                self._velocity_hats.append(self.add_variable_from_reference(var, "velocity_hat")
                                           if self.amsgrad else None)
                self._row_steps.append(self.add_variable((rows,), name=f"{_slot_prefix(var)}_row_steps",
                                                         dtype=var.dtype) if self._row_counts else None)
        if not self.amsgrad:
            self._velocity_hats = []
        _exclude_tables_from_weight_decay(self, var_list)

    def _alpha(self, learning_rate: Any, dtype: Any, steps: tf.Tensor) -> tf.Tensor:
        if steps.shape.rank:  # LazyAdam's count per row: exp(n log beta), vectorised where pow is not (3x cheaper)
            beta_1_power = tf.exp(steps * tf.math.log(tf.cast(self.beta_1, dtype)))
            beta_2_power = tf.exp(steps * tf.math.log(tf.cast(self.beta_2, dtype)))
        else:
            beta_1_power = tf.pow(tf.cast(self.beta_1, dtype), steps)
            beta_2_power = tf.pow(tf.cast(self.beta_2, dtype), steps)
        return tf.cast(learning_rate, dtype) * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor) -> None:
        fresh = _fresh(variable, rows)
        index = self._get_variable_index(variable)
        slot = self._fused[index]
        if slot is not None:  # an embedding table: all its moments in one slot
            dim = int(variable.shape[-1])
            moments = _restart(_gather(slot, rows), fresh)  # m, v, v_hat and LazyAdam's count all start at 0
            m_rows, v_rows = moments[:, :dim], moments[:, dim:2 * dim]
            v_hat_rows = moments[:, 2 * dim:3 * dim] if self.amsgrad else None
            steps = moments[:, -1:] + 1 if self._row_counts else None
        else:  # another variable that received a sparse gradient: Keras' separate slots
            m_rows, v_rows = _gather(self._momentums[index], rows), _gather(self._velocities[index], rows)
            v_hat_rows = _gather(self._velocity_hats[index], rows) if self.amsgrad else None
            if self._row_counts:
                shape = tf.concat([tf.shape(rows), tf.ones([tf.rank(g) - 1], tf.int32)], 0)
                steps = tf.reshape(_gather(self._row_steps[index], rows) + 1, shape)
        m_new = m_rows + (g - m_rows) * (1 - self.beta_1)
        v_new = v_rows + (tf.square(g) - v_rows) * (1 - self.beta_2)
        v_use = tf.maximum(v_hat_rows, v_new) if self.amsgrad else v_new
        if not self._row_counts:
            steps = tf.cast(self.iterations + 1, g.dtype)
        alpha = self._alpha(lr, g.dtype, steps)
        if slot is not None:
            _write(self, slot, rows, tf.concat([m_new, v_new] + ([v_use] if self.amsgrad else [])
                                               + ([steps] if self._row_counts else []), 1))
        else:
            _write(self, self._momentums[index], rows, m_new)
            _write(self, self._velocities[index], rows, v_new)
            if self.amsgrad:
                _write(self, self._velocity_hats[index], rows, v_use)
            if self._row_counts:
                _write(self, self._row_steps[index], rows, tf.reshape(steps, [-1]))
        _write(self, variable, rows, _gather(variable, rows) - (m_new * alpha) / (tf.sqrt(v_use) + self.epsilon))
        return None


@keras.saving.register_keras_serializable(package="sok_tutorial")
class LazyAdam(Adam):
    """Adam with per-row bias correction: each row counts the steps that updated it.

    Example:
        >>> from sok_tutorial.embedding import EmbeddingTable
        >>> table = EmbeddingTable(3, 1, dynamic=False)
        >>> table.build()
        >>> _ = table.variable.assign([[1.0], [2.0], [3.0]])
        >>> opt = LazyAdam(learning_rate=0.1)
        >>> opt.apply([tf.IndexedSlices(tf.constant([[0.5]]), tf.constant([2]))], [table.variable])
        >>> [round(float(x), 4) for x in table.variable.numpy().ravel()]  # only row 2 moved, by lr
        [1.0, 2.0, 2.9]
    """

    _row_counts = True
