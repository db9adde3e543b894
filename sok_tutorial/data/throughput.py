"""Rows per second of an input pipeline, and the plain `tf.data` pipeline that loaders are
compared with.

A notebook compares pipelines one pass each, after an untimed warm-up pass, so the OS file cache,
allocator pools and `tf.data` graph tracing are paid before the clock starts. The repository's
``benchmarks/loader.py`` measures the same cases in separate processes, with peak memory.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kernels import checks


def count_rows(batches: Iterable[tuple[Any, Any]]) -> int:
    """Rows in one pass over `batches`, pairs of (features, labels) as loaders yield them.

    Example:
        >>> import numpy as np
        >>> count_rows([({}, np.zeros((4, 1))), ({}, np.zeros((3, 1)))])
        7
    """
    return sum(int(labels.shape[0]) for _, labels in batches)


def rows_per_second(one_pass: Callable[[], int], warmup: bool = True) -> float:
    """Rows per second of `one_pass`, a function that runs one pass and returns its rows.

    Args:
        one_pass: runs one whole pass over a pipeline (an epoch) and returns the rows it saw,
            e.g. ``lambda: count_rows(loader)``.
        warmup: run one untimed pass first, so what is timed is the steady state.

    Returns:
        Rows of the timed pass divided by its wall-clock seconds.

    Raises:
        ValueError: the pass saw no rows.

    Example:
        >>> rows_per_second(lambda: 1000) > 0
        True
    """
    if warmup:
        one_pass()
    start = time.perf_counter()
    rows = one_pass()
    seconds = time.perf_counter() - start
    if rows <= 0:
        raise ValueError(f"one_pass returned rows={rows!r}; a pass must see at least one row")
    return rows / max(seconds, 1e-9)


def tensor_slices_dataset(paths_or_dataset: str | os.PathLike | Sequence[Any], batch_size: int,
                          label_names: Sequence[str], *, cont_names: Sequence[str] = (), fill_nan: float = 0.0,
                          shuffle_buffer: int = 0, seed: int | None = None) -> Any:
    """The pipeline most TensorFlow tutorials build: pandas reads every file into memory, then
    ``tf.data.Dataset.from_tensor_slices`` -> ``shuffle`` -> ``batch``.

    It is the baseline a loader is compared with: every row is sliced and batched one by one
    inside `tf.data`, and the whole dataset must fit in memory.

    Args:
        paths_or_dataset: a dataset directory (``_file_list.txt``), or parquet files.
        batch_size: rows per batch (the last batch may be smaller).
        label_names: label columns, stacked into a float32 ``(batch, len(label_names))`` tensor.
        cont_names: continuous columns whose missing values become `fill_nan`.
        fill_nan: value for missing continuous values.
        shuffle_buffer: rows in `tf.data`'s shuffle buffer; 0 keeps the file order.
        seed: seed of the shuffle.

    Returns:
        A `tf.data.Dataset` of (features dict, labels) batches.

    Example:
        >>> import tempfile, pandas as pd
        >>> from sok_tutorial.data import to_parquet_dataset
        >>> d = tempfile.mkdtemp()
        >>> frame = pd.DataFrame({"x": [1.0, None, 3.0], "label": [0, 1, 0]})
        >>> _ = to_parquet_dataset(frame, d, cont_names=["x"], label_names=["label"], progress=False)
        >>> features, labels = next(iter(tensor_slices_dataset(d, 3, ["label"], cont_names=["x"])))
        >>> features["x"].numpy().tolist(), labels.shape.as_list()
        ([1.0, 0.0, 3.0], [3, 1])
    """
    import pandas as pd
    import tensorflow as tf

    from sok_tutorial.data.schema import resolve_files

    checks.positive_int("batch_size", batch_size)
    checks.positive_int("shuffle_buffer", shuffle_buffer, allow_zero=True)
    if not label_names:
        raise ValueError("label_names=[]: name at least one label column")
    frame = pd.concat([pd.read_parquet(f) for f in resolve_files(paths_or_dataset)], ignore_index=True)
    checks.known_names("label_names", label_names, list(frame.columns))
    checks.known_names("cont_names", cont_names, list(frame.columns))
    frame[list(cont_names)] = frame[list(cont_names)].fillna(fill_nan)
    labels = frame[list(label_names)].to_numpy("float32")
    frame = frame.drop(columns=list(label_names))
    ds = tf.data.Dataset.from_tensor_slices((dict(frame), labels))
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    return ds.batch(batch_size)
