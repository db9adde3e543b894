"""A table whose own optimizer runs in the backward pass, so any Keras optimizer can train the rest.

A table with its own optimizer (``EmbeddingTable(..., optimizer=...)``) is normally handed to it by
the model's optimizer, which must then be one of `sok_tutorial.optimizers`: a Keras optimizer would
update the table itself, densely, with its own formula. `fuse` takes the table out of the model's
trainable variables instead, and `lookup` returns its vectors through a custom gradient that, when
the backward pass reaches it, applies the table's own sparse optimizer to the rows the step used
(TorchRec's fused tables update the same way). The model's optimizer, whatever it is, then trains
everything else, and sees only a zero gradient for one scalar, the `anchor` that connects the
lookup to the backward pass (`tf.GradientTape` computes gradients only towards trainable
variables). Under a `tf.distribute` strategy the table's optimizer runs in each replica's step, as
in a custom training loop.

Example:
    >>> import keras
    >>> import sok_tutorial as sok
    >>> from sok_tutorial.embedding import EmbeddingTable
    >>> table = EmbeddingTable(10, 2, dynamic=False, optimizer=sok.optimizers.Adagrad(0.5), name="fused_items")
    >>> table.build()
    >>> fuse(table)
    >>> anchor = keras.Variable(0.0)
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(lookup(table, tf.constant([3, 3]), True, anchor))
    >>> float(tape.gradient(loss, anchor)), int(table.optimizer.iterations)  # the table was updated
    (0.0, 1)
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from sok_tutorial.embedding.ops import inserting


def fuse(table: Any) -> None:
    """Take `table` (built, with its own optimizer) out of the model's trainable variables and build
    its optimizer for it, so `lookup` can apply it."""
    if table.optimizer is None:
        raise ValueError(f"{table.name}: only a table with its own optimizer can update itself in the backward pass")
    table.optimizer.build([table.variable])
    table.variable.trainable = False


def lookup(table: Any, keys: tf.Tensor, training: Any, anchor: Any) -> tf.Tensor:
    """The vectors of `keys` (`table.lookup`); in a training step, through a gradient that applies
    the table's own optimizer to the rows they used (module docstring). `anchor`: a trainable
    scalar of the calling layer, always 0, whose gradient is 0."""
    if not inserting(training) or tf.distribute.in_cross_replica_context():
        return table.lookup(keys, training)

    @tf.custom_gradient
    def step(a: tf.Tensor) -> tuple[tf.Tensor, Any]:
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(table.variable.value)
            vectors = table.lookup(keys, training)

        def grad(upstream: tf.Tensor, variables: Any = None) -> tuple[tf.Tensor, list[None]]:
            gradient = tape.gradient(vectors, table.variable.value, output_gradients=upstream)
            table.optimizer.apply([gradient], [table.variable])
            return tf.zeros_like(a), [None] * len(variables or [])  # (the table was updated here)
        return vectors + tf.cast(a, vectors.dtype) * 0, grad

    return step(tf.convert_to_tensor(anchor))
