"""The sparse optimizers, as ``sok.optimizers``: `SGD`, `Adagrad`, `Adam`, `LazyAdam`, `Ftrl` and
`RowWiseAdagrad`, which update only the table rows a step touched. They live in
`sok_tutorial.embedding.optimizers` (one module per family, with their slot layouts), which finds
them itself, so a new one appears here too; importing this module registers them with Keras.

Example:
    >>> import sok_tutorial as sok
    >>> sorted(sok.optimizers.__all__)
    ['Adagrad', 'Adam', 'Ftrl', 'LazyAdam', 'RowWiseAdagrad', 'SGD']
"""
from sok_tutorial.embedding.optimizers import OPTIMIZERS

globals().update(OPTIMIZERS)

__all__ = sorted(OPTIMIZERS)
