"""`Ftrl` (FTRL-Proximal) on the touched rows only: an ``accumulator`` and a ``linear`` slot."""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from sok_tutorial.embedding.optimizers.base import SlotLayout, SparseOptimizer, fresh_rows_of, gather, restart, write


@keras.saving.register_keras_serializable(package="sok_tutorial")
class Ftrl(SparseOptimizer, keras.optimizers.Ftrl):
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

    NAME, LAYOUT = "ftrl", SlotLayout((("accumulator", 1, 0), ("linear", 1, 0)))

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor, w: tf.Tensor) -> None:
        index = self._get_variable_index(variable)
        accumulator, linear = self._accumulators[index], self._linears[index]
        fresh = fresh_rows_of(variable, rows)
        acc = restart(gather(accumulator, rows), fresh, self.initial_accumulator_value)
        z = restart(gather(linear, rows), fresh)
        # Keras' order of operations, so that a touched row matches its dense update to rounding
        power = -self.learning_rate_power
        l2 = self.l2_regularization_strength + self.beta / (2.0 * lr)
        new_acc = acc + tf.square(g)
        new_z = z + ((g + 2 * self.l2_shrinkage_regularization_strength * w)
                     - (tf.pow(new_acc, power) - tf.pow(acc, power)) / lr * w)
        quadratic = tf.pow(new_acc, power) / lr + 2 * l2
        l1 = self.l1_regularization_strength
        write(self, linear, rows, new_z)
        write(self, variable, rows, (tf.clip_by_value(new_z, -l1, l1) - new_z) / quadratic)
        write(self, accumulator, rows, new_acc)
        return None
