"""The TorchRec-shaped workload of ``benchmarks/embedding.py``, run in a child process per case.

TorchRec's own benchmark shape, exactly as the peer script (``bench_torchrec.py`` in the shared
``peers/`` folder) draws it: 26 tables x 384,615 rows folded into one 10M-row table (table
offsets), dim 16, batch 8192, one id per table, Zipf(1.1) ids scrambled per table; a
Linear(416 -> 1) head and binary cross-entropy; the median samples/s of 20 steps after 3
warm-up steps, 2 threads.

* `train`: one step of a static (row ids) or dynamic (any int64 key) table with one optimizer,
  optionally with the per-op profile of a few more steps (taken on one thread, `set_threads`).
  ``dynamic_warm`` is the dynamic table after one untimed pass over the same batches: every key
  already has a row, so it shows the cost of the index's lookups alone, without the ~67k keys a
  step inserts in the first steps.
* `set_threads`, `model`, `train_step`, `timed`, `profile_ops`: the threads, the layer, head and
  training step, per-step timing and the per-op profile, shared with the ``eviction``,
  ``precision`` and ``memory`` groups.
* `index`: the key index alone, lookup + insert of each step's distinct keys, for the in-graph
  index of `sok_tutorial.embedding.index` and TensorFlow's two lookup-table resources;
  (``reduce``) the sum of a step's 213k gradient rows into its distinct rows, by the sparse
  product the tables use (`sum_by_position`) and by ``tf.math.unsorted_segment_sum``; and
  (``gather``) a step's reads by TensorFlow's two gather kernels, ``Gather`` (``tf.gather``) and
  ``GatherNd`` (`sok_tutorial.embedding.ops.take`, what the tables use).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

from benchmarks._bench import page_faults

NT, DIM, BATCH = 26, 16, 8192
ROWS_PER_TABLE = 10_000_000 // NT
WARM, STEPS = 3, 20
OPTIMIZERS = {"sgd": ("SGD", 1e-2), "adagrad": ("Adagrad", 1e-2), "adam": ("Adam", 1e-3),  # the peer script's rates
              "lazyadam": ("LazyAdam", 1e-3), "rowwise_adagrad": ("RowWiseAdagrad", 1e-2)}
INDEXES = ("ours", "dense_hash_table", "mutable_hash_table")
KERNELS = ("reduce", "gather")  # the index group's other cases: a reduction and the gathers, two kernels each


def batches(n: int, drift: int = 0) -> list[tuple[Any, Any]]:
    """(ids [batch, 26] with table offsets, labels [batch, 1]), drawn as the peer script draws them.

    With `drift`, step ``s`` shifts every table's Zipf ranks by ``s * drift`` before scrambling:
    the key that was rank ``r + drift`` becomes rank ``r``, so hot keys cool down and stop while
    keys never seen before arrive (the ``eviction`` group's stream, `benchmarks._eviction`).
    """
    import numpy as np

    rng = np.random.default_rng(0)
    offsets = (np.arange(NT, dtype=np.int64) * ROWS_PER_TABLE)[:, None]
    out = []
    for step in range(n):
        ids = (rng.zipf(1.1, size=(NT, BATCH)) - 1 + step * drift) % ROWS_PER_TABLE
        ids = (ids * 2654435761) % ROWS_PER_TABLE
        labels = rng.integers(0, 2, size=BATCH).astype(np.float32)
        out.append(((ids + offsets).T.copy(), labels[:, None]))
    return out


def train(table: str, optimizer: str, steps: int = STEPS, profile: bool = False) -> dict[str, Any]:
    """samples/s of one table kind with one optimizer (and the top ops of 4 profiled steps).

    ``static_pipeline`` is the static table fed by a ``tf.data`` pipeline that deduplicates each
    batch's keys (`sok_tutorial.embedding.unique_keys`) and prefetches: the step's ``tf.unique``
    runs there, for the next batch, beside the step; a step's time includes taking its batch.
    ``dynamic_pipeline`` and ``dynamic_warm_pipeline`` are the dynamic table so fed, its pipeline
    also looking the keys up in the index (`sok_tutorial.embedding.lookup_ahead`)."""
    import tensorflow as tf

    set_threads(profile)
    from sok_tutorial.embedding import lookup_ahead, unique_keys

    data = [(tf.constant(k), tf.constant(y)) for k, y in batches(WARM + steps + (4 if profile else 0))]
    embedding, step = model(optimizer, ROWS_PER_TABLE * NT, data[0][0], use_hashtable=not table.startswith("static"))
    if table.startswith("dynamic_warm"):  # every key of the timed steps already has a row: lookups, no inserts
        for keys, labels in data:
            step(keys, labels)
    feed = iter(data)
    if table.endswith("pipeline"):  # deduplicated (and a dynamic table's rows looked up) ahead, in tf.data
        feed = tf.data.Dataset.from_tensor_slices((tf.stack([k for k, _ in data]), tf.stack([y for _, y in data])))
        feed = iter(feed.map(unique_keys if table.startswith("static") else lookup_ahead(embedding)).prefetch(2))
    timed(step, feed, WARM)
    cpu, wall, faults = time.process_time(), time.perf_counter(), page_faults()
    times = timed(step, feed, steps)
    busy = (time.process_time() - cpu) / (time.perf_counter() - wall)  # every thread of the process
    faults = (page_faults() - faults) / steps
    rates = [BATCH / t for t in times]
    result = {"samples_per_s": statistics.median(rates), "min_samples_per_s": min(rates),
              "max_samples_per_s": max(rates), "rows_in_use": embedding.table.size, "cpu_busy": busy,
              "page_faults_per_step": faults}
    if profile:
        result["profile_ms"] = profile_ops(step, [next(feed) for _ in range(4)])
    return result


def paired(optimizer: str, steps: int = STEPS) -> dict[str, Any]:
    """The dynamic table against the static one in one process, step by step: both built as `train`
    builds them, then two passes over the same batches, each step run on one table and then the
    other (which goes first alternates). The first pass is the dynamic table's cold run (its keys new,
    as in ``dynamic``), the second its warm one (every key has a row, as in ``dynamic_warm``); the
    first `WARM` steps of each pass are not timed. Per pass: each table's median samples/s and the
    median, lower and upper quartile of the per-step ratio static time / dynamic time.

    Separate processes put each table on its own draw of the shared host, so their ratio moves from
    run to run for the same code more than the ratio of two steps taken back to back, which meet the
    same host (the README has both)."""
    import tensorflow as tf

    set_threads()
    data = [(tf.constant(k), tf.constant(y)) for k, y in batches(WARM + steps)]
    tables = {kind: model(optimizer, ROWS_PER_TABLE * NT, data[0][0], use_hashtable=kind == "dynamic")[1]
              for kind in ("static", "dynamic")}
    result: dict[str, Any] = {}
    for phase in ("cold", "warm"):
        times: dict[str, list[float]] = {"static": [], "dynamic": []}
        for i, batch in enumerate(data):
            for kind in (("static", "dynamic") if i % 2 else ("dynamic", "static")):
                took = timed(tables[kind], [batch])
                if i >= WARM:
                    times[kind] += took
        ratios = [s / d for s, d in zip(times["static"], times["dynamic"])]
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        result[phase] = {"static_samples_per_s": statistics.median(BATCH / t for t in times["static"]),
                         "dynamic_samples_per_s": statistics.median(BATCH / t for t in times["dynamic"]),
                         "dynamic_vs_static": statistics.median(ratios), "ratio_q1": q1, "ratio_q3": q3}
    return result


def set_threads(profile: bool = False) -> None:
    """TensorFlow's threads for a benchmark child, before anything starts TensorFlow's runtime: 2
    intra-op threads (one per core of the reference machine) for a timed run; one thread for
    everything, inter- and intra-op, for a profiled one (`profile_ops`), so that an op's time in
    the profile is the CPU time it costs, alone, rather than a stretch of wall time that other
    ops' threads shared (on two cores an op running beside a parallel gather appears several
    times as long as it is, and a parallel op half as long)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1 if profile else 2)
    if profile:
        tf.config.threading.set_inter_op_parallelism_threads(1)


def model(optimizer: str, capacity: int, example: Any, **options: Any) -> tuple[Any, Any]:
    """(DistributedEmbedding of `capacity` rows, built on `example` keys, and a tf.function training
    step ``step(keys, labels) -> loss`` with the Linear(416 -> 1) head); `options` go to the layer."""

    import sok_tutorial as sok

    embedding = sok.DistributedEmbedding("sum", capacity, DIM, slot_num=NT, max_nnz=1, **options)
    name, rate = OPTIMIZERS[optimizer]
    return embedding, train_step(embedding, getattr(sok.optimizers, name)(rate), example)


def train_step(embedding: Any, opt: Any, example: Any) -> Any:
    """A tf.function ``step(keys, labels) -> loss`` of `embedding` (any layer of NT slots of width
    DIM) under a Linear(416 -> 1) head, with `opt`; both built on `example` keys."""
    import keras
    import tensorflow as tf

    head = keras.layers.Dense(1)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def forward(keys: Any) -> Any:
        return head(tf.reshape(embedding(keys, training=True), [-1, NT * DIM]))

    forward(example[:1])
    variables = embedding.trainable_variables + head.trainable_variables
    opt.build(variables)

    @tf.function(reduce_retracing=True)  # one trace for every batch's number of distinct keys
    def step(keys: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, forward(keys))
        opt.apply(tape.gradient(loss, variables), variables)
        return loss

    return step


def timed(step: Any, data: Any, count: int | None = None, after: Any = None) -> list[float]:
    """Seconds of each step over `data` (a list, or the first `count` batches of an iterator),
    taking the batch included and the loss read back, so the step has finished; `after`, if
    given, is called after each step, outside the timing."""
    times = []
    batches = iter(data)
    for _ in range(len(data) if count is None else count):
        start = time.perf_counter()
        keys, labels = next(batches)
        float(step(keys, labels))
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return times


def profile_ops(step: Any, data: list[tuple[Any, Any]], top: int = 14) -> list[dict[str, Any]]:
    """The `top` TensorFlow ops (by phase: forward, backward, optimizer) by ms per step over the
    steps of `data`, under the profiler: the CPU each op costs in a child run on one thread
    (`set_threads`)."""
    import tensorflow as tf

    from sok_tutorial.training.profiler import op_breakdown

    log_dir = tempfile.mkdtemp()
    tf.profiler.experimental.start(log_dir)
    for keys, labels in data:
        float(step(keys, labels))
    tf.profiler.experimental.stop()
    return [{"phase": r["phase"], "op": r["part"], "ms": round(r["ms"], 2)}
            for r in op_breakdown(log_dir, steps=len(data), by="op")[:top]]


def index(kind: str, steps: int = STEPS) -> dict[str, Any]:
    """ms per step of lookup + insert of each step's distinct keys into an empty index of 10M rows,
    then of lookups alone of the same keys (all present)."""
    import numpy as np
    import tensorflow as tf

    set_threads()
    from sok_tutorial.embedding import index as key_index
    from sok_tutorial.embedding.dedup import sum_by_position

    if kind == "reduce":
        return _reduction(tf, sum_by_position, steps)
    if kind == "gather":
        return _gathers(tf, steps)
    capacity = ROWS_PER_TABLE * NT
    keys = [tf.constant(np.unique(k)) for k, _ in batches(WARM + steps)]
    spec = [tf.TensorSpec([None], tf.int64)]  # one trace for every step's number of keys
    if kind == "ours":
        state = key_index.IndexVariables.create(capacity)
        insert = tf.function(lambda k: key_index.lookup_or_insert(state, k, capacity, "index")[0], input_signature=spec)
        lookup = tf.function(lambda k: key_index.lookup(state, k)[0], input_signature=spec)
    else:
        if kind == "dense_hash_table":  # two keys reserved as sentinels (never drawn here)
            table = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, -1, empty_key=-2**63,
                                                          deleted_key=-2**63 + 1, initial_num_buckets=1 << 22)
        else:
            table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, -1)
        size = tf.Variable(tf.constant(0, tf.int64))

        @tf.function(input_signature=spec)
        def insert(k: Any) -> Any:
            rows = tf.ensure_shape(table.lookup(k), [None])
            missing = rows < 0
            new = tf.boolean_mask(k, missing)
            new_rows = size.read_value() + tf.range(tf.size(new, tf.int64))
            with tf.control_dependencies([table.insert(new, new_rows)]):
                size.assign_add(tf.size(new, tf.int64))
            return tf.where(missing, size.read_value() - tf.size(new, tf.int64) + tf.cumsum(tf.cast(missing, tf.int64))
                            - 1, rows)

        lookup = tf.function(lambda k: table.lookup(k), input_signature=spec)
    timed = {}
    for name, fn in (("insert", insert), ("lookup", lookup)):
        times = []
        for i, k in enumerate(keys):
            start = time.perf_counter()
            fn(k).numpy()
            if i >= WARM:
                times.append(time.perf_counter() - start)
        timed[name] = statistics.median(times) * 1e3
    return {"lookup_insert_ms": timed["insert"], "lookup_ms": timed["lookup"],
            "distinct_keys_per_step": float(np.mean([int(k.shape[0]) for k in keys]))}


def _reduction(tf: Any, sum_by_position: Any, steps: int) -> dict[str, Any]:
    """ms to sum a step's gradient rows [213k, 16] into its distinct rows, two ways."""
    import numpy as np

    rng = np.random.default_rng(1)
    cases = []
    for keys, _ in batches(WARM + steps):
        unique, position = tf.unique(tf.constant(keys.reshape(-1)), out_idx=tf.int32)
        cases.append((tf.constant(rng.normal(size=(keys.size, DIM)).astype(np.float32)), position, tf.size(unique)))
    spec = [tf.TensorSpec([None, DIM], tf.float32), tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)]
    ways = {"sparse_product_ms": tf.function(sum_by_position, input_signature=spec),
            "unsorted_segment_sum_ms": tf.function(tf.math.unsorted_segment_sum, input_signature=spec)}
    out = {}
    for name, fn in ways.items():
        times = []
        for i, args in enumerate(cases):
            start = time.perf_counter()
            fn(*args).numpy()
            if i >= WARM:
                times.append(time.perf_counter() - start)
        out[name] = statistics.median(times) * 1e3
    return out


def _gathers(tf: Any, steps: int) -> dict[str, Any]:
    """ms of a step's reads by ``tf.gather`` and by `take` (``GatherNd``), side by side: its distinct
    rows of the 10M x 16 float32 table (a variable), their row-wise accumulators (a 10M float32
    variable), and the int64 buckets of 8 keys of its ~55k new keys (a tensor: the bucketed index's
    reads of what its lookup read)."""
    import numpy as np

    from sok_tutorial.embedding.ops import take

    rng = np.random.default_rng(2)
    capacity = ROWS_PER_TABLE * NT
    table = tf.Variable(tf.random.uniform([capacity, DIM]))
    accumulator = tf.Variable(tf.random.uniform([capacity]))
    cases = []
    for keys, _ in batches(WARM + steps):
        rows = np.unique(keys)
        buckets = rng.integers(0, 1 << 40, (rows.size, 8))  # (the keys of each key's bucket, as a lookup reads them)
        new = rng.permutation(rows.size)[:rows.size // 2]
        cases.append((tf.constant(rows), tf.constant(buckets), tf.constant(new)))
    spec = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, 8], tf.int64), tf.TensorSpec([None], tf.int64)]
    reads = {"rows": lambda read, rows, held, new: read(table, rows),
             "accumulators": lambda read, rows, held, new: read(accumulator, rows),
             "buckets": lambda read, rows, held, new: read(held, new)}
    out = {}
    for name, read in reads.items():
        ways = {"gather": tf.function(lambda *a, read=read: read(tf.gather, *a), input_signature=spec),
                "gather_nd": tf.function(lambda *a, read=read: read(take, *a), input_signature=spec)}
        times: dict[str, list[float]] = {way: [] for way in ways}
        for i, args in enumerate(cases):
            for way, fn in ways.items():  # interleaved: both kernels on the same reads, one after the other
                start = time.perf_counter()
                fn(*args).numpy()
                if i >= WARM:
                    times[way].append(time.perf_counter() - start)
        for way in ways:
            out[f"{name}_{way}_ms"] = statistics.median(times[way]) * 1e3
        out[f"{name}_gather_over_gather_nd"] = out[f"{name}_gather_ms"] / out[f"{name}_gather_nd_ms"]
    return out
