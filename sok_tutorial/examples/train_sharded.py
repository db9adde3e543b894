"""Train one sharded embedding table plus a dense head, on one process or as a cluster.

Run on N local replicas (GPUs, else N logical CPU devices)::

    python -m sok_tutorial.examples.train_sharded --replicas 4 --sharding row --steps 20

or as 2 worker processes, each one replica, through TensorFlow's multi-worker strategy::

    python -m sok_tutorial.launch --workers 2 -m sok_tutorial.examples.train_sharded --sharding row

The data are seeded synthetic global batches: every process builds the same ones and each
replica trains on its slice, so any number of replicas sees the same global batch. The step is
`sok_tutorial.training.make_sok_step`: the table to a sparse optimizer, the dense head to a
Keras one, each replica's loss averaged over the global batch.

``--out`` writes ``<out>.<case>.rank<i>.npz`` per process: the per-step losses and the table rows
it holds, by key (the union over ranks is the whole table), so runs on different N can be compared.
``--case`` runs several configurations in one process, on one strategy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np


def synthetic_batches(steps: int, batch: int, slots: int, nnz: int, vocabulary: int, seed: int = 0) -> list[Any]:
    """`steps` global batches ``(keys [batch, slots, nnz], labels [batch, 1])``; slot ``s`` draws
    keys from its own range ``[s * vocabulary, (s + 1) * vocabulary)``, skewed towards small ids."""
    rng = np.random.default_rng(seed)
    weight = rng.normal(size=(slots, vocabulary))
    out = []
    for _ in range(steps):
        ids = np.minimum(rng.zipf(1.3, (batch, slots, nnz)) - 1, vocabulary - 1)
        logit = weight[np.arange(slots)[None, :, None], ids].sum((1, 2)) / np.sqrt(slots * nnz)
        labels = (rng.random(batch) < 1 / (1 + np.exp(-2 * logit))).astype(np.float32)[:, None]
        out.append((ids + (np.arange(slots) * vocabulary)[None, :, None], labels))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sok_tutorial.examples.train_sharded", description=__doc__)
    p.add_argument("--replicas", type=int, default=1, help="local replicas when not launched as a cluster")
    p.add_argument("--sharding", default="row", choices=["row", "table", "column", "row_column", "replicated"])
    p.add_argument("--column-shards", type=int, default=0,
                   help="sharding=row_column: column groups of the grid (0: the default, sok.grid_shape)")
    p.add_argument("--layer", default="distributed", choices=["distributed", "all2all"])
    p.add_argument("--combiner", default="sum", choices=["sum", "mean"])
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "lazyadam", "adam"])
    p.add_argument("--static", action="store_true", help="use_hashtable=False: keys are row ids")
    p.add_argument("--exchange", default="all_gather", choices=["all_gather", "all_reduce"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--global-batch-size", type=int, default=64)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--nnz", type=int, default=2)
    p.add_argument("--vocabulary", type=int, default=256, help="keys per slot")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--eviction-policy", default="", choices=["", "lru", "lfu", "ttl"],
                   help="a table that forgets (sharding row or replicated): evicts within buckets when full")
    p.add_argument("--capacity", type=int, default=0,
                   help="rows of the whole table (0: one per key); row-wise, each replica holds capacity / N; "
                   "table-wise, each replica holds capacity")
    p.add_argument("--min-count", type=int, default=1, help="admit a key once seen this many times")
    p.add_argument("--track-changes", action="store_true", help="mark rows as they change (delta exports)")
    p.add_argument("--sketch-width", type=int, default=0, help="admission sketch counters per row (0: default)")
    p.add_argument("--case", action="append", help="settings for one run, e.g. 'sharding=table,combiner=mean'; "
                   "repeat to run several in one process (default: one run of the options above)")
    p.add_argument("--out", help="write <out>.<case>.rank<i>.npz (losses and this process's table rows)")
    p.add_argument("--save", help="save a checkpoint here after training (one process only)")
    p.add_argument("--restore", help="restore this checkpoint before training")
    p.add_argument("--serve", help="(a table that forgets) export the tables here halfway, then publish the "
                   "rest of the run as a delta applied to that export")
    p.add_argument("--die-at-step", type=int, default=-1, help="(fault test) worker --die-rank exits at this step")
    p.add_argument("--die-rank", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a stuck collective fails")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import sok_tutorial as sok

    strategy = sok.make_strategy(args.replicas, timeout=args.timeout)
    context = sok.Init(global_batch_size=args.global_batch_size, strategy=strategy)
    rank = int(json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0))
    for case in args.case or [""]:
        train(case_settings(args, case), strategy, context, rank, tag=case_tag(case))
    return 0


def case_settings(args: argparse.Namespace, case: str) -> argparse.Namespace:
    """`args` with the settings of one ``--case`` (``"sharding=table,static=1"``) applied.

    Example:
        >>> case_settings(parse([]), "sharding=table,static=1,dim=4").sharding
        'table'
    """
    settings = argparse.Namespace(**vars(args))
    for item in filter(None, case.split(",")):
        key, _, value = item.partition("=")
        if not hasattr(settings, key.replace("-", "_")):
            raise SystemExit(f"--case {case!r}: unknown setting {key!r}")
        old = getattr(settings, key.replace("-", "_"))
        setattr(settings, key.replace("-", "_"), value == "1" if isinstance(old, bool) else type(old)(value))
    return settings


def case_tag(case: str) -> str:
    """The name of a case's output files: ``sharding=row,static=1`` -> ``sharding-row_static-1``."""
    return case.replace(",", "_").replace("=", "-") or "run"


def train(args: argparse.Namespace, strategy: Any, context: Any, rank: int, tag: str) -> dict[str, Any]:
    """Train one configuration; returns (and with --out writes) losses, step times, table rows."""
    import keras
    import tensorflow as tf

    import sok_tutorial as sok
    from sok_tutorial.embedding import replica_bytes
    from sok_tutorial.training import apply_delta, export_delta, export_model_tables, load_checkpoint, save_checkpoint
    from sok_tutorial.training.checkpoint import read_tables
    from sok_tutorial.training.step import make_sok_step

    n = context.num_replicas
    keras.utils.set_random_seed(0)
    total_rows = args.slots * args.vocabulary
    grid = {"column_shards": args.column_shards or None} if args.sharding == "row_column" else {}
    if args.sharding == "table":  # (--capacity: rows each replica holds)
        per_replica = args.capacity or max(sok.plan_table_wise([args.vocabulary] * args.slots, n)[1])
    else:  # the rows of a row group: a replica's row-wise, every row column-wise and replicated
        groups = n if args.sharding == "row" else sok.grid_shape(n, args.dim, **grid)[0] if grid and n > 1 else 1
        per_replica = sok.rows_per_replica(args.capacity or total_rows, groups)
    life = {"eviction_policy": args.eviction_policy or None, "ttl": 3 if args.eviction_policy == "ttl" else None,
            "min_count": args.min_count if args.min_count > 1 else None, "sketch_width": args.sketch_width or None,
            "track_changes": args.track_changes or None}
    kwargs = {"use_hashtable": not args.static, "sharding": args.sharding, "exchange": args.exchange,
              "slot_sizes": [args.vocabulary] * args.slots if args.sharding == "table" else None,
              "embedding_initializer": keras.initializers.RandomUniform(-0.1, 0.1, seed=3), **grid,
              **{k: v for k, v in life.items() if v is not None}}
    with strategy.scope():
        if args.layer == "distributed":
            embedding = sok.DistributedEmbedding(args.combiner, per_replica, args.dim, slot_num=args.slots,
                                                 max_nnz=args.nnz, name="table", **kwargs)
            width = args.slots * args.dim
        else:
            embedding = sok.All2AllDenseEmbedding(per_replica, args.dim, slot_num=args.slots,
                                                  nnz_per_slot=args.nnz, name="table", **kwargs)
            width = args.slots * args.nnz * args.dim
        embedding.build()
        head = keras.Sequential([keras.Input((width,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(1)], name="head")
        model = keras.Sequential([keras.Input((args.slots, args.nnz), dtype="int64"), embedding,
                                  keras.layers.Flatten(), head], name="model")
        sparse = {"sgd": lambda: sok.optimizers.SGD(0.1), "lazyadam": lambda: sok.optimizers.LazyAdam(0.01),
                  "adam": lambda: sok.optimizers.Adam(0.01)}[args.optimizer]()
    # the table to the sparse optimizer, the head to the dense one; each replica's loss averaged over the global
    # batch, so N replicas (or worker processes) take the step one device takes
    train_step = make_sok_step(model, sparse, keras.optimizers.SGD(0.1), global_batch_size=args.global_batch_size,
                               strategy=strategy)

    if args.restore:
        load_checkpoint(args.restore, model, sparse)
    losses, times = [], []
    for step, (keys, labels) in enumerate(synthetic_batches(args.steps, args.global_batch_size, args.slots,
                                                            args.nnz, args.vocabulary)):
        if step == args.die_at_step and rank == args.die_rank:
            print(f"worker {rank}: exiting at step {step} (--die-at-step)", flush=True)
            os._exit(17)
        start = time.perf_counter()
        try:
            losses.append(float(train_step(keys, labels)))
        except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.CancelledError,
                tf.errors.InternalError) as exc:
            print(f"worker {rank}: step {step} failed: a peer stopped answering "
                  f"({type(exc).__name__}: {str(exc).splitlines()[0]})", file=sys.stderr, flush=True)
            os._exit(3)  # collectives cannot be cancelled cleanly; leave without waiting on them
        times.append(time.perf_counter() - start)
        if args.serve and step == args.steps // 2 - 1:
            export_model_tables(model, os.path.join(args.serve, "serving"), overwrite=True)
    served = {}
    if args.serve:  # the second half as a delta over the halfway export: what a server would hold now
        serving = os.path.join(args.serve, "serving")
        apply_delta(serving, export_delta(model, os.path.join(args.serve, "delta"), since=serving, overwrite=True))
        served = {f"served_{name}": value for name, value in read_tables(serving)[0].items()
                  if name in ("keys", "vectors")}
    result = {"losses": np.array(losses), "step_s": np.array(times), "replicas": n,
              "bytes_per_replica": replica_bytes([embedding], sparse), "evicted": embedding.table.evictions,
              "unplaced": embedding.table.unplaced, **served, **embedding.table.export(sparse)}
    print(f"rank {rank} {tag}: {n} replicas, sharding={args.sharding}, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"table bytes per replica {result['bytes_per_replica']:,}", flush=True)
    if args.save:
        save_checkpoint(args.save, model, sparse, overwrite=True)
    if args.out:
        np.savez(f"{args.out}.{tag}.rank{rank}.npz", **result)
    return result


if __name__ == "__main__":
    sys.exit(main())
