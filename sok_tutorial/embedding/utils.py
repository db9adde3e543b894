"""SOK's helpers for custom training steps: telling embedding tables from the other variables."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from sok_tutorial.embedding.table import table_of


def split_embedding_variable_from_others(variables: Iterable[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``(embedding_variables, other_variables)``, each in the order given.

    Embedding tables take sparse updates (`sok_tutorial.optimizers`); the others are dense and
    data-parallel (all-reduced). This is how SOK's training step applies two optimizers.
    """
    variables = list(variables)
    embedding = tuple(v for v in variables if table_of(v) is not None)
    others = tuple(v for v in variables if table_of(v) is None)
    return embedding, others


@contextlib.contextmanager
def OptimizerScope(variables: Iterable[Any] = ()) -> Iterator[None]:  # noqa: N802 - SOK's name
    """SOK's ``with sok.OptimizerScope(embedding_variables):``. Nothing to set up here: the
    optimizers of `sok_tutorial.optimizers` apply sparse updates by themselves. Kept so a SOK
    training step runs unchanged."""
    yield
