"""The sparse optimizers, as ``sok.optimizers``: `SGD`, `Adagrad`, `Adam`, `LazyAdam`, `Ftrl` and
`RowWiseAdagrad`, which update only the table rows a step touched. They live in
`sok_tutorial.embedding.optimizers` (one module each, with their slot layouts); importing this
module registers them with Keras.
"""
from sok_tutorial.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, LazyAdam, RowWiseAdagrad

__all__ = ["SGD", "Adagrad", "Adam", "LazyAdam", "Ftrl", "RowWiseAdagrad"]
