"""Run one task per input file: in this process, on a local Dask cluster, or on a running one.

This is how data preparation grows past one core and one machine: the same call takes
``scheduler="local"`` (a `distributed.LocalCluster` with one single-threaded worker process per
core, started and stopped here), the address of an existing scheduler (``"tcp://host:8786"``),
a `distributed.Client`, or ``"synchronous"`` (a plain loop, for debugging).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from sok_tutorial.progress import progress_bar


def parallel_map(fn: Callable[[Any], Any], items: Sequence[Any], *, scheduler: Any = "local",
                 n_workers: int | None = None, progress: bool = True, desc: str = "tasks") -> list[Any]:
    """``[fn(item) for item in items]``, results in input order; a task's exception re-raises here.

    Example:
        >>> parallel_map(abs, [-1, 2, -3], scheduler="synchronous", progress=False)
        [1, 2, 3]
    """
    items = list(items)
    bar = progress_bar(progress, total=len(items), desc=desc, unit="task", unit_scale=False)
    if scheduler == "synchronous" or not items:
        results = []
        for item in items:
            results.append(fn(item))
            bar.update()
        bar.close()
        return results

    from distributed import Client, LocalCluster, as_completed

    cluster = None
    if isinstance(scheduler, Client):
        client = scheduler
    elif scheduler == "local":
        workers = n_workers or max(1, min(len(items), os.cpu_count() or 1))
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    elif isinstance(scheduler, str) and "://" in scheduler:
        try:
            client = Client(scheduler, timeout="10s")
        except OSError as exc:
            raise ConnectionError(f"scheduler={scheduler!r}: no Dask scheduler answered ({exc})") from exc
    else:
        raise ValueError(f"scheduler={scheduler!r} is invalid: expected 'local', 'synchronous', "
                         "a scheduler address like 'tcp://host:8786', or a distributed.Client")
    try:
        futures = client.map(fn, items, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(items)
        for future in as_completed(futures):
            results[index[future.key]] = future.result()
            bar.update()
        return results
    finally:
        bar.close()
        if cluster is not None:
            client.close()
            cluster.close()
