"""Sparse optimizers for Keras 3: a step reads and writes only the table rows it touched.

An embedding lookup's gradient is a ``tf.IndexedSlices`` over the rows a batch used. Keras'
own optimizers turn it into a dense tensor the size of the whole table and update every row
(and every slot) each step. These subclasses of the Keras optimizers apply the very same update
formulas to the touched rows only: one gather and one scatter of the rows and one of each slot
variable, and every other row and its slots stay bit-identical. A table's own gradient
(`sok_tutorial.embedding.ops.UniqueRowsGradient`) already holds distinct rows with summed
gradients; any other sparse gradient is first deduplicated (`sok_tutorial.embedding.dedup.distinct`,
then a sparse matrix product sums the repeats, `sum_by_position`). Dense gradients go to the
Keras implementation unchanged, so one optimizer serves a whole model, in ``model.fit`` and
under ``tf.distribute``.

* `SGD` (with optional momentum), `Adagrad`, `Adam`: Keras' maths on the touched rows; Adam's
  bias correction uses the optimizer's step count, exactly as Keras does.
* `LazyAdam`: Adam whose bias correction counts, per row, the steps that updated the row, so a
  rarely seen row is corrected as fully as a frequent one. For a row touched at every step it
  equals `Adam`.
* `Ftrl`: Keras' FTRL-Proximal on the touched rows; untouched rows keep their values, where
  Keras' dense FTRL recomputes every weight.
* `RowWiseAdagrad`: TorchRec's row-wise Adagrad, one accumulator scalar per table row (1 float
  of state per row instead of ``dim``); plain Adagrad for other variables.

Each optimizer family is one module of this package (`sgd`, `adam`, `adagrad`, `ftrl`), built
on `base.SparseOptimizer`, and declares its slot layout there (`SlotLayout`: floats per element
and per row of a table, and whether column sharding can split them), which the planner and column
sharding read (`slot_layout`). The package finds its modules' optimizers itself (`OPTIMIZERS`),
and ``sok_tutorial.optimizers`` (``sok.optimizers``) re-exports them, so a new optimizer is one
new module here and nothing else.

A table may have its own optimizer (``EmbeddingTable(..., optimizer=Ftrl(...))`` or the SOK
layers' ``optimizer=``): the model's optimizer, any of these, hands that table's gradients to it
and updates everything else itself (`sok_tutorial.embedding.optimizers.base`), in ``model.fit`` as in a
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

import importlib
import pkgutil

import tensorflow as tf  # noqa: F401  (the examples above use it)

from sok_tutorial.embedding.optimizers.base import LAYOUTS, SlotLayout, SparseOptimizer, slot_layout


def _discover() -> dict[str, type]:
    """Every `SparseOptimizer` defined in this package's modules, by class name."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.update({name: value for name, value in vars(module).items() if isinstance(value, type)
                      and issubclass(value, SparseOptimizer) and value is not SparseOptimizer
                      and value.__module__ == module.__name__})
    return found


OPTIMIZERS: dict[str, type] = _discover()  # e.g. "Adam" -> Adam
globals().update(OPTIMIZERS)

__all__ = [*sorted(OPTIMIZERS), "OPTIMIZERS", "LAYOUTS", "SlotLayout", "slot_layout"]
