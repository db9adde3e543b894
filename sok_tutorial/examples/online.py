"""Online training of a table that forgets, day by day: notebook 08's model, and the same run as a
cluster of worker processes that publishes a serving export and a delta a day.

`online_model` is the notebook's model: a user's and an item's vector from one
`DistributedEmbedding` (any table options: ``eviction_policy``, ``sharding``...), concatenated,
through two dense layers. `train_days` runs the online protocol (score each next day before
training on it; with ``model.fit``, or `train_day` on a strategy's replicas), a `Publisher` ships
the trainer's tables to a server (a full export, then a delta a day) and `load_server` is the
server's one-device copy of an export. Run through the launcher, `main` trains it on the drifting stream of
`data_gen.drifting` as 2 (or more) worker processes with the table sharded row-wise over them::

    python -m sok_tutorial.launch --workers 2 -m sok_tutorial.examples.online --out DIR --days 8

Each worker trains on its contiguous part of every global batch (as the replicas of one process
do), so the workers' steps see the keys in the order one device does. After day 0 the cluster
writes ``DIR/serving`` (`export_model_tables`), after each later day ``DIR/delta-<day>``
(`export_delta`, every worker's shards joined by worker 0), and at the end ``DIR/final``, a full
export to compare the served copy with. A server applies the deltas in turn (`apply_delta`) and
scores each next day with what it holds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def online_model(capacity: int, dim: int, learning_rate: float, seed: int = 0, **table_options: Any) -> Any:
    """The model of notebook 08 (build it inside ``strategy.scope()`` to shard its table).

    Example:
        >>> model = online_model(64, 4, 0.01, eviction_policy="lru")
        >>> model.predict(np.array([[1, 2]], np.int64), verbose=0).shape
        (1, 1)
    """
    import keras

    import sok_tutorial as sok

    keras.utils.set_random_seed(seed)  # every run starts from the same dense weights
    keys = keras.Input((2,), dtype="int64", name="keys")
    vectors = sok.DistributedEmbedding("sum", capacity, dim, slot_num=2, max_nnz=1, name="embedding",
                                       embedding_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed),
                                       **table_options)(keys)
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(keras.layers.Flatten()(vectors))
    model = keras.Model(keys, keras.layers.Dense(1, name="logit")(hidden))
    model.compile(optimizer=sok.optimizers.Adam(learning_rate), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


_STEPS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # a model's `StepsBySize`


def train_day(model: Any, strategy: Any, keys: np.ndarray, labels: np.ndarray, batch_size: int) -> None:
    """One epoch over a day in order with `sok_tutorial.training.make_sok_step` on `strategy`'s
    replicas (of this process or of a cluster): each global batch split into contiguous parts,
    the loss of a step the mean over its global batch, as on one device. The day's last, shorter
    batch gets a step of its own size; it must split over the replicas too.
    """
    from sok_tutorial.training import StepsBySize

    n, tail = strategy.num_replicas_in_sync, len(keys) % batch_size
    if tail % n:
        raise ValueError(f"a day of {len(keys)} rows ends in a batch of {tail}, which does not split over {n} "
                         f"replicas: expected rows per day and batch_size={batch_size} that leave a multiple of {n}")
    if model not in _STEPS:
        _STEPS[model] = StepsBySize(model, model.optimizer, strategy=strategy)
    for start in range(0, len(keys), batch_size):
        _STEPS[model](keys[start:start + batch_size], labels[start:start + batch_size])


def score(model: Any, keys: np.ndarray) -> np.ndarray:
    """The model's click logits for a day's keys ``[rows, 2]`` -> ``[rows]``."""
    return model.predict(keys, batch_size=8192, verbose=0)[:, 0]


def train_days(model: Any, days: Sequence[tuple[np.ndarray, np.ndarray]], batch_size: int, *, strategy: Any = None,
               after_day: Callable[[int, Any], None] | None = None, progress: bool = False,
               desc: str | None = None) -> dict[str, list[float]]:
    """The online protocol, day by day: score day ``d`` with the model trained on days
    ``0 .. d-1`` (the next-day AUC, `roc_auc`, from day 1), train one epoch on day ``d`` in order,
    then call ``after_day(d, model)`` (to publish, say).

    Args:
        days: ``(keys [rows, 2], labels [rows, 1])`` per day (`data_gen.drifting.drifting_day`).
        strategy: None trains with ``model.fit``; a strategy, with `train_day` over its replicas.

    Returns:
        ``{"auc": [days - 1], "rows": [days], "evicted": [days], "train_s": [days]}``: the
        next-day AUCs, and after each day the rows the table holds, the keys it evicted so far
        and the seconds training took.

    Example:
        >>> from data_gen.drifting import drifting_day
        >>> days = [drifting_day(d, rows=512, population=200, item_drift=50, user_drift=20) for d in range(3)]
        >>> run = train_days(online_model(256, 4, 0.01, eviction_policy="lru"), days, 128)
        >>> len(run["auc"]), run["rows"][-1] <= 256
        (2, True)
    """
    import sok_tutorial as sok
    from sok_tutorial.progress import progress_bar
    from sok_tutorial.training.metrics import roc_auc

    table, run = sok.tables_of(model)[0], {"auc": [], "rows": [], "evicted": [], "train_s": []}
    with progress_bar(progress, total=len(days), desc=desc or "days", unit="day") as bar:
        for d, (x, y) in enumerate(days):
            if d > 0:
                run["auc"].append(roc_auc(y[:, 0], score(model, x)))
            start = time.perf_counter()
            if strategy is None:
                model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)  # rows come shuffled
            else:
                train_day(model, strategy, x, y, batch_size)
            run["train_s"].append(time.perf_counter() - start)
            run["rows"].append(table.size)
            run["evicted"].append(table.evictions)
            if after_day is not None:
                after_day(d, model)
            bar.update(1)
    return run


class Publisher:
    """A trainer's side of serving, one `publish` a day: the first writes a full export of the
    model's tables (`export_model_tables`) to ``out/serving``; each later one writes the rows
    changed and the keys evicted since the previous (`export_delta`) to ``out/delta-<nn>`` and,
    with `apply`, merges it into ``out/serving`` (`apply_delta`) as the server would.

    Args:
        out: the directory of ``serving``, the deltas and ``full-export``.
        apply: merge each delta into ``serving`` (False where the server applies them itself).
        full_exports: also write a full export (``out/full-export``) with each delta, to weigh
            and time against it.

    Attributes:
        serving: the export the deltas apply to.
        delta_bytes, delta_seconds, full_bytes, full_seconds: one per delta, on disk and to write.

    Example:
        >>> import tempfile
        >>> model = online_model(64, 4, 0.01, eviction_policy="lru")
        >>> publisher, keys = Publisher(tempfile.mkdtemp()), np.array([[1, 2]], np.int64)
        >>> for day in range(3):
        ...     _ = model.fit(keys + day, np.ones((1, 1), np.float32), verbose=0)
        ...     _ = publisher.publish(model)
        >>> sorted(p.name for p in publisher.out.glob("[a-z]*")), len(publisher.delta_bytes)
        (['delta-01', 'delta-02', 'serving'], 2)
    """

    def __init__(self, out: str | os.PathLike, *, apply: bool = True, full_exports: bool = False):
        self.out, self.apply, self.full_exports = Path(out), apply, full_exports
        self.serving = self.out / "serving"
        self.delta_bytes: list[int] = []
        self.delta_seconds: list[float] = []
        self.full_bytes: list[int] = []
        self.full_seconds: list[float] = []
        self._base: Path | None = None
        self._published = 0

    def publish(self, model: Any) -> Path:
        """Export `model` (in full the first time, a delta after); returns the directory written."""
        from sok_tutorial.data.describe import disk_bytes
        from sok_tutorial.training import apply_delta, export_delta, export_model_tables

        if self._base is None:
            self._base = export_model_tables(model, self.serving, overwrite=True)
            self._published = 1
            return self._base
        start = time.perf_counter()
        delta = export_delta(model, self.out / f"delta-{self._published:02d}", since=self._base, overwrite=True)
        self.delta_seconds.append(time.perf_counter() - start)
        self.delta_bytes.append(disk_bytes(delta))
        if self.apply:
            apply_delta(self.serving, delta)
        if self.full_exports:
            start = time.perf_counter()
            full = export_model_tables(model, self.out / "full-export", overwrite=True)
            self.full_seconds.append(time.perf_counter() - start)
            self.full_bytes.append(disk_bytes(full))
        self._base, self._published = delta, self._published + 1
        return delta


def load_server(path: str | os.PathLike, make_model: Callable[[], Any]) -> Any:
    """A one-device model holding the export at `path`, as a server would: ``make_model()`` (an
    `online_model` with the trainer's options, unsharded), built on one row, then loaded."""
    from sok_tutorial.training import checkpoint

    server = make_model()
    server.predict(np.zeros((1, 2), np.int64), verbose=0)
    checkpoint.load_checkpoint(path, server)
    return server


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sok_tutorial.examples.online", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for serving, delta-<day> and final")
    p.add_argument("--days", type=int, default=8)
    p.add_argument("--rows-per-day", type=int, default=40_000)
    p.add_argument("--population", type=int, default=12_000)
    p.add_argument("--item-drift", type=int, default=3_000)
    p.add_argument("--user-drift", type=int, default=1_000)
    p.add_argument("--capacity", type=int, required=True, help="rows of the whole table (split over the workers)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--learning-rate", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import sok_tutorial as sok

    # (before anything else runs TensorFlow) no per-collective timeout: the launcher stops every
    # worker if one fails, and a timeout would hold a thread per collective for its duration
    strategy = sok.make_strategy(collective_timeout=None)
    from data_gen.drifting import drifting_day
    from sok_tutorial.training import export_model_tables

    n, out = strategy.num_replicas_in_sync, Path(args.out)
    rank = int(json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0))
    with strategy.scope():
        model = online_model(sok.rows_per_replica(args.capacity, n), args.dim, args.learning_rate, args.seed,
                             eviction_policy="lru", sharding="row")
    publisher = Publisher(out, apply=False)  # the server applies each delta once it has scored the next day
    for day in range(args.days):
        keys, labels = drifting_day(day, rows=args.rows_per_day, population=args.population,
                                    item_drift=args.item_drift, user_drift=args.user_drift, seed=args.seed)
        train_day(model, strategy, keys, labels, args.batch_size)
        publisher.publish(model)
    export_model_tables(model, out / "final", overwrite=True)
    table = sok.tables_of(model)[0]
    print(f"worker {rank}: {n} replicas, {args.days} days, rows held {table.size:,}, evicted {table.evictions:,}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
