"""Online training of a table that forgets, day by day: notebook 08's model, and the same run as a
cluster of worker processes that publishes a serving export and a delta a day.

`online_model` is the notebook's model: a user's and an item's vector from one
`DistributedEmbedding` (any table options: ``eviction_policy``, ``sharding``...), concatenated,
through two dense layers. Run through the launcher, `main` trains it on the drifting stream of
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
import weakref
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


_STEPS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # a model's traced step


def train_day(model: Any, strategy: Any, keys: np.ndarray, labels: np.ndarray, batch_size: int) -> None:
    """One epoch over a day in order, each global batch split into contiguous parts over the
    replicas (of this process or of a cluster): the loss of a step is the mean over its global
    batch, as one device's."""
    import tensorflow as tf

    n = strategy.num_replicas_in_sync
    if model not in _STEPS:
        if not model.optimizer.built:  # its slots made here, not inside the traced step
            with strategy.scope():
                model.optimizer.build(model.trainable_variables)
        _STEPS[model] = _step(model, strategy)
    step = _STEPS[model]
    for start in range(0, len(keys), batch_size):
        x, y = keys[start:start + batch_size], labels[start:start + batch_size]
        per = -(-len(x) // n)

        def part(array: np.ndarray) -> Any:
            return strategy.experimental_distribute_values_from_function(
                lambda ctx, a=array: tf.constant(a[ctx.replica_id_in_sync_group * per:][:per]))
        step(part(x), part(y), tf.constant(len(x), tf.float32))


def _step(model: Any, strategy: Any) -> Any:
    import keras
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def step(x: Any, y: Any, size: Any) -> None:
        def replica_step(x: Any, y: Any) -> None:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_sum(keras.losses.binary_crossentropy(y, logits, from_logits=True)) / size
            variables = model.trainable_variables
            model.optimizer.apply(tape.gradient(loss, variables), variables)
        strategy.run(replica_step, args=(x, y))
    return step


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
    from sok_tutorial.training import export_delta, export_model_tables

    n, out = strategy.num_replicas_in_sync, Path(args.out)
    rank = int(json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0))
    with strategy.scope():
        model = online_model(sok.rows_per_replica(args.capacity, n), args.dim, args.learning_rate, args.seed,
                             eviction_policy="lru", sharding="row")
    base = None
    for day in range(args.days):
        keys, labels = drifting_day(day, rows=args.rows_per_day, population=args.population,
                                    item_drift=args.item_drift, user_drift=args.user_drift, seed=args.seed)
        train_day(model, strategy, keys, labels, args.batch_size)
        if base is None:
            base = export_model_tables(model, out / "serving", overwrite=True)
        else:
            base = export_delta(model, out / f"delta-{day:02d}", since=base, overwrite=True)
    export_model_tables(model, out / "final", overwrite=True)
    table = sok.tables_of(model)[0]
    print(f"worker {rank}: {n} replicas, {args.days} days, rows held {table.size:,}, evicted {table.evictions:,}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
