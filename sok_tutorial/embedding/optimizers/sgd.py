"""`SGD`, with optional momentum (one slot ``[rows, dim]``), on the touched rows only."""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from sok_tutorial.embedding.optimizers.base import SlotLayout, SparseOptimizer, fresh_rows_of, gather, restart, write


@keras.saving.register_keras_serializable(package="sok_tutorial")
class SGD(SparseOptimizer, keras.optimizers.SGD):
    """``keras.optimizers.SGD`` that updates only the touched rows of sparse gradients."""

    NAME, LAYOUT = "sgd", SlotLayout()

    def slot_layout(self) -> SlotLayout:
        return SlotLayout((("momentum", 1, 0),)) if self.momentum else self.LAYOUT

    def _sparse_step(self, variable: Any, rows: tf.Tensor, g: tf.Tensor, lr: tf.Tensor, w: tf.Tensor) -> None:
        if self.momentum == 0:  # no per-row state: a fresh-row mark left set only restarts slots still at zero
            write(self, variable, rows, w - g * lr)
            return None
        fresh = fresh_rows_of(variable, rows)
        momentum = tf.cast(self.momentum, g.dtype)
        m = self.momentums[self._get_variable_index(variable)]
        m_new = restart(gather(m, rows), fresh) * momentum - g * lr
        write(self, m, rows, m_new)
        step = m_new * momentum - g * lr if self.nesterov else m_new
        write(self, variable, rows, w + step)
        return None
