"""`Adam` and `LazyAdam` on the touched rows only, a table's moments fused in one slot."""
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
class Adam(SparseOptimizer, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` that updates only the touched rows (and their moments).

    An embedding table's moments live in one slot variable ``[rows, k * dim]`` (``m | v``, then
    ``v_hat`` with amsgrad, then a per-row step count for `LazyAdam`): one gather and one write
    per step instead of one per moment. Other variables keep Keras' own slots.
    """

    NAME, LAYOUT = "adam", SlotLayout((("moments", 2, 0),))
    _row_counts = False  # LazyAdam: keep a per-row step count in the fused slot

    def slot_layout(self) -> SlotLayout:
        return SlotLayout((("moments", 3 if self.amsgrad else 2, 1 if self._row_counts else 0),))

    def _build_slots(self, var_list: list[Any]) -> None:
        keras.optimizers.Optimizer.build(self, var_list)  # Keras Adam's slots only where needed
        self._momentums, self._velocities, self._velocity_hats, self._fused, self._row_steps = [], [], [], [], []
        for var in var_list:
            rows = int(var.shape[0]) if len(var.shape) else 1
            if table_of(var) is not None:
                width = int(var.shape[-1]) * (3 if self.amsgrad else 2) + (1 if self._row_counts else 0)
                self._fused.append(self.add_variable((rows, width), name=f"{slot_prefix(var)}_moments",
                                                     dtype=slot_dtype(var)))
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
                self._row_steps.append(self.add_variable((rows,), name=f"{slot_prefix(var)}_row_steps",
                                                         dtype=var.dtype) if self._row_counts else None)
        if not self.amsgrad:
            self._velocity_hats = []
        exclude_tables_from_weight_decay(self, var_list)

    def _alpha(self, learning_rate: Any, dtype: Any, steps: tf.Tensor) -> tf.Tensor:
        if steps.shape.rank:  # LazyAdam's count per row: exp(n log beta), vectorised where pow is not (3x cheaper)
            beta_1_power = tf.exp(steps * tf.math.log(tf.cast(self.beta_1, dtype)))
            beta_2_power = tf.exp(steps * tf.math.log(tf.cast(self.beta_2, dtype)))
        else:
            beta_1_power = tf.pow(tf.cast(self.beta_1, dtype), steps)
            beta_2_power = tf.pow(tf.cast(self.beta_2, dtype), steps)
        return tf.cast(learning_rate, dtype) * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor, w: tf.Tensor) -> None:
        fresh = fresh_rows_of(variable, rows)
        index = self._get_variable_index(variable)
        slot = self._fused[index]
        if slot is not None:  # an embedding table: all its moments in one slot
            dim = int(variable.shape[-1])
            moments = restart(gather(slot, rows), fresh)  # m, v, v_hat and LazyAdam's count all start at 0
            # one split, not a slice per part: a single pass over the rows read
            parts = tf.split(moments, [dim] * (3 if self.amsgrad else 2) + ([1] if self._row_counts else []), axis=1)
            m_rows, v_rows = parts[0], parts[1]
            v_hat_rows = parts[2] if self.amsgrad else None
            steps = parts[-1] + 1 if self._row_counts else None
        else:  # another variable that received a sparse gradient: Keras' separate slots
            m_rows, v_rows = gather(self._momentums[index], rows), gather(self._velocities[index], rows)
            v_hat_rows = gather(self._velocity_hats[index], rows) if self.amsgrad else None
            if self._row_counts:
                shape = tf.concat([tf.shape(rows), tf.ones([tf.rank(g) - 1], tf.int32)], 0)
                steps = tf.reshape(gather(self._row_steps[index], rows) + 1, shape)
        m_new = m_rows + (g - m_rows) * (1 - self.beta_1)
        v_new = v_rows + (tf.square(g) - v_rows) * (1 - self.beta_2)
        v_use = tf.maximum(v_hat_rows, v_new) if self.amsgrad else v_new
        if not self._row_counts:
            steps = tf.cast(self.iterations + 1, g.dtype)
        alpha = self._alpha(lr, g.dtype, steps)
        if slot is not None:
            write(self, slot, rows, tf.concat([m_new, v_new] + ([v_use] if self.amsgrad else [])
                                               + ([steps] if self._row_counts else []), 1))
        else:
            write(self, self._momentums[index], rows, m_new)
            write(self, self._velocities[index], rows, v_new)
            if self.amsgrad:
                write(self, self._velocity_hats[index], rows, v_use)
            if self._row_counts:
                write(self, self._row_steps[index], rows, tf.reshape(steps, [-1]))
        write(self, variable, rows, w - (m_new * alpha) / (tf.sqrt(v_use) + self.epsilon))
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

    NAME, LAYOUT = "lazyadam", SlotLayout((("moments", 2, 1),))
    _row_counts = True
