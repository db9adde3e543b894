"""Embedding training speed: 26 slots, dim 16, batch 8192, tables of 1M and 10M rows.

Cases (training samples/s, each in its own process, interleaved over --repeat rounds), group
``sok_vs_keras``:

    sok_lazyadam          DistributedEmbedding (row ids) + sok_tutorial LazyAdam: sparse updates
    keras_embedding_adam  keras.layers.Embedding + keras Adam (dense updates of the whole table)
    tf_sparse_lookup      tf.nn.embedding_lookup_sparse + keras Adam
    group_lookup_fused    group_embedding_lookup_sparse over 26 tables, one segment sum
    group_lookup_loop     the same, one segment sum per table

The physical ceiling: this machine's random row-gather bandwidth (NumPy, same table size); the
report gives the embedding bytes a sok_lazyadam step moves per second as a fraction of it.

Group ``torchrec_shape``: TorchRec's benchmark shape (``benchmarks/_tables.py``: 26 tables x
384,615 rows folded into one, dim 16, batch 8192, one Zipf id per table, Linear(416 -> 1)), a
static table (row ids), the same fed by a tf.data pipeline that deduplicates keys ahead of the
step (``static_pipeline``, `sok_tutorial.embedding.unique_keys`) and a dynamic one (any int64 key,
the in-graph index), each with SGD,
Adagrad, Adam, LazyAdam and RowWiseAdagrad, with the cores each kept busy; the dynamic/static
ratio, also for ``dynamic_warm`` (the dynamic table once every key has a row: the index's lookups
without inserts), and for both fed by a pipeline that also looks the keys up in the index
(``dynamic_pipeline``, ``dynamic_warm_pipeline``, `sok_tutorial.embedding.lookup_ahead`) against
``static_pipeline``; the same dynamic/static ratios cold and warm with both tables in one process,
step by step (``paired``: `benchmarks._tables.paired`, the steadier reading of the two); the per-op
profile of the SGD and LazyAdam steps. With ``--torchrec PYTHON``
(TorchRec's virtualenv) and ``--peers DIR`` (the folder of ``bench_torchrec.py``), TorchRec's
fused CPU kernels and plain PyTorch run in the same rounds.

Group ``index``: the key index alone, lookup + insert of each step's distinct keys into an empty
10M-row index, and lookups alone: ours against ``DenseHashTable`` and ``MutableHashTable``;
``reduce``: summing a step's gradient rows per distinct row, by sparse product and by segment sum;
and ``gather``: a step's reads (rows, row-wise accumulators, buckets of keys) by ``tf.gather`` and by
``GatherNd``.

Group ``eviction`` (``benchmarks/_eviction.py``): the torchrec_shape workload with a drifting key
stream (50-75k new keys a step) into dynamic tables with SGD (and Adagrad): one with room to spare
and no policy, with ``track_changes``, and full ones evicting every step under
``eviction_policy="lru"``, ``"lfu"``, LRU with ``min_count=2`` and LRU with buckets of 16,
and two bounds (the LRU tables with the choice of each new key's row made free);
samples/s (median and amortized), the ratio to the roomy table (goals: LRU at capacity >= 0.85x,
LFU and admission >= 0.8x, LRU with room >= 0.97x), rows evicted and keys left without a row per
step, index bytes per row, hit rates against exact LRU, delta exports against full ones at three
churn levels, and the per-op profile of the roomy and the LRU table.
Group ``memory`` (``benchmarks/_memory.py``): a 1M-id table against `QREmbedding` (2, 4 and 16
collisions) and `MixedDimensionEmbedding` on the same Zipf keys: bytes and samples/s, each as a
ratio to the full table.
Group ``dlrm`` (``benchmarks/_dlrm.py``): notebook 05's DLRM (26 tables, 708,027 rows, batch 2048)
with SGD, Adagrad and row-wise Adagrad, its keys deduplicated in the step or ahead in the input
pipeline (``ours_pipeline``: ``dataset.map(model.deduplicate)``), or in the step with one thread per op
and two ops at once (``ours_cpu_threads``: `sok_tutorial.cpu_threads`), and with ``--torchrec`` TorchRec's DLRM
(``bench_torchrec_dlrm.py``: DistributedModelParallel and a FusedEmbeddingBagCollection) on the
same batches, interleaved; samples/s, cores busy, ratios (goal 2x); ``embedding_dlrm.json``.

JSON: ``embedding.json`` (sok_vs_keras), ``embedding_tables.json`` (torchrec_shape),
``embedding_index.json`` (index), ``embedding_eviction.json`` (eviction), ``embedding_memory.json``
(memory).

Group ``precision`` (``benchmarks/_precision.py``): the torchrec_shape workload in float32,
bfloat16 and float16 tables (``storage_dtype``), SGD and Adam, bytes per row and samples/s side
by side; ``embedding_precision.json``.

Group ``keras_rs`` (``benchmarks/_keras_rs.py``): 26 features, batch 8192, tables of 100k and
400k rows configured with Keras-RS's ``TableConfig`` / ``FeatureConfig`` (Adam): our layer built by
``from_keras_rs`` (sparse Adam per table) against ``keras_rs.layers.DistributedEmbedding`` on CPU
(Keras' Adam, dense); samples/s and the ratio (goals: 3x at 100k rows, 10x at 400k);
``embedding_keras_rs.json``.

Group ``heap``: seven cases above (static SGD, Adagrad, row-wise Adagrad and LazyAdam and dynamic
SGD on the torchrec_shape workload, the roomy and the full LRU table of the eviction group), each
with malloc's thresholds as glibc has them (``SOK_TUTORIAL_HEAP_REUSE=0``) and as the library sets
them (`sok_tutorial.embedding.heap_reuse`: a step's freed temporaries stay in the process),
interleaved; samples/s, the ratio and page faults per step; with ``--torchrec`` TorchRec's cases
as they come and with the same thresholds (``GLIBC_TUNABLES``); ``embedding_heap.json``.

Group ``hugepages``: four cases above (static SGD and LazyAdam on the torchrec_shape workload,
the roomy and the full LRU table of the eviction group), each run three ways, interleaved: with
the tables' own huge pages off (``SOK_TUTORIAL_HUGE_PAGES=0``), as installed (the library puts
its variables of 64 MiB or more on transparent 2 MB pages, `sok_tutorial.embedding.huge_pages`),
and with glibc's ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` besides (every large allocation
advised, temporaries included); samples/s, the ratios to "off", and the MiB of the process on
huge pages at the end of each run; ``embedding_hugepages.json``.

    python benchmarks/embedding.py [--quick]
                                   [--group all|sok_vs_keras|torchrec_shape|index|eviction|memory|precision
                                            |keras_rs|dlrm|hugepages|heap, or several with commas]
                                   [--steps N] [--repeat 3] [--out build/bench] [--hugepages]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE.parent)]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import _bench, _dlrm, _eviction, _keras_rs, _memory, _precision, _tables  # noqa: E402

SLOTS, DIM, BATCH = 26, 16, 8192
KEYS = ["criteo_like", "uniform"]  # Zipf keys as in CTR data, and the uniform worst case
CASES = ["sok_lazyadam", "keras_embedding_adam", "tf_sparse_lookup", "group_lookup_fused", "group_lookup_loop"]
TABLE_KINDS = ("static", "static_pipeline", "dynamic", "dynamic_warm",  # _tables.train says what each is
               "dynamic_pipeline", "dynamic_warm_pipeline")
GROUPS = ("sok_vs_keras", "torchrec_shape", "index", "eviction", "memory", "precision", "keras_rs", "dlrm",
          "hugepages", "heap")
HUGE_PAGES = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}  # glibc >= 2.35: madvise(MADV_HUGEPAGE) on large blocks
# the hugepages group's settings: the tables' own advice off, as installed (on), and glibc's on every large block too
HUGE_PAGE_SETTINGS = {"off": {"SOK_TUTORIAL_HUGE_PAGES": "0"}, "tables": {}, "glibc": HUGE_PAGES}
# the heap group's settings: malloc's thresholds as glibc has them, and as the library sets them
# (`sok_tutorial.embedding.heap_reuse`); HEAP_TUNABLES are the same three for a process that does not import it
HEAP_SETTINGS = {"off": {"SOK_TUTORIAL_HEAP_REUSE": "0"}, "on": {}}
HEAP_TUNABLES = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
                                   ":glibc.malloc.top_pad=67108864"}
HEAP_CASES = {**{f"torchrec_shape:static:{o}": "samples_per_s"
                 for o in ("sgd", "adagrad", "rowwise_adagrad", "lazyadam")},
              "torchrec_shape:dynamic:sgd": "samples_per_s", "eviction:roomy": "samples_per_s_amortized",
              "eviction:lru_full": "samples_per_s_amortized"}
HUGE_PAGE_CASES = {"torchrec_shape:static:sgd": "samples_per_s", "torchrec_shape:static:lazyadam": "samples_per_s",
                   "eviction:roomy": "samples_per_s_amortized", "eviction:lru_full": "samples_per_s_amortized"}


draw_keys = _bench.draw_keys


def run_case(case: str, rows: int, steps: int, keys: str) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    import sok_tutorial as sok

    rng = np.random.default_rng(0)
    batches = [(draw_keys(rng, rows, (BATCH, SLOTS), keys), rng.integers(0, 2, (BATCH, 1)).astype("float32"))
               for _ in range(8)]
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
    head = keras.layers.Dense(1)

    if case in ("sok_lazyadam", "keras_embedding_adam"):
        emb = (sok.DistributedEmbedding("sum", rows, DIM, slot_num=SLOTS, max_nnz=1, use_hashtable=False)
               if case == "sok_lazyadam" else keras.layers.Embedding(rows, DIM))
        optimizer = sok.optimizers.LazyAdam(1e-3) if case == "sok_lazyadam" else keras.optimizers.Adam(1e-3)

        def forward(keys):
            return head(tf.reshape(emb(keys), [-1, SLOTS * DIM]))
        forward(tf.constant(batches[0][0]))
        variables = emb.trainable_variables + head.trainable_variables
    elif case == "tf_sparse_lookup":
        table = keras.Variable(keras.initializers.RandomUniform(-0.05, 0.05)((rows, DIM)))
        optimizer = keras.optimizers.Adam(1e-3)

        def forward(keys):
            flat = tf.reshape(keys, [-1, 1])
            sparse = tf.sparse.from_dense(flat + 1)  # ids shifted by one: 0 would read as "absent"
            sparse = tf.SparseTensor(sparse.indices, sparse.values - 1, sparse.dense_shape)
            vectors = tf.nn.embedding_lookup_sparse(table.value, sparse, None, combiner="sum")
            return head(tf.reshape(vectors, [-1, SLOTS * DIM]))
        forward(tf.constant(batches[0][0]))
        variables = [table] + head.trainable_variables
    else:
        per_table = max(rows // SLOTS, 1)
        owners = [sok.EmbeddingTable(per_table, DIM, dynamic=False) for _ in range(SLOTS)]  # tables: sparse updates
        for t in owners:
            t.build()
        tables = [t.variable for t in owners]
        optimizer = sok.optimizers.LazyAdam(1e-3)
        fused = case == "group_lookup_fused"

        def forward(keys):
            ids = [tf.RaggedTensor.from_tensor(keys[:, i:i + 1] % per_table) for i in range(SLOTS)]
            outs = sok.group_embedding_lookup_sparse([t.value for t in tables], ids, ["sum"] * SLOTS, fused=fused)
            return head(tf.concat(outs, 1))
        forward(tf.constant(batches[0][0]))
        variables = tables + head.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step(keys, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, forward(keys))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    seconds = _bench.seconds_per_step(step, [(tf.constant(k), tf.constant(y)) for k, y in batches], steps)
    unique = float(np.mean([len(np.unique(k)) for k, _ in batches]))
    return {"seconds_per_step": seconds, "samples_per_s": BATCH / seconds, "unique_rows": unique}


def gather_ceiling(rows: int, keys: str) -> float:
    """Bytes/s of random row gathers (NumPy) from a [rows, 16] float32 table: the memory ceiling."""
    import numpy as np

    table = np.random.default_rng(0).random((rows, DIM), dtype=np.float32)
    idx = draw_keys(np.random.default_rng(1), rows, (BATCH * SLOTS,), keys)
    out = np.empty((len(idx), DIM), np.float32)
    np.take(table, idx, axis=0, out=out)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.take(table, idx, axis=0, out=out)
        best = min(best, time.perf_counter() - start)
    return out.nbytes / best


def child(argv: list[str]) -> None:
    case, rows, steps, keys = argv[0], int(argv[1]), int(argv[2]), argv[3]
    if case.startswith("torchrec_shape:paired:"):  # torchrec_shape:paired:<optimizer>
        result = _tables.paired(case.split(":")[2], steps)
    elif case.startswith("torchrec_shape:"):  # torchrec_shape:<static|dynamic...>:<optimizer>[:profile]
        parts = case.split(":")
        result = _tables.train(parts[1], parts[2], steps, profile=parts[-1] == "profile")
    elif case.startswith("eviction:"):  # eviction:<case>[:profile], eviction:hit_rates, eviction:deltas
        parts = case.split(":")
        if parts[1] in ("hit_rates", "deltas"):
            result = getattr(_eviction, parts[1])(steps)
        else:
            result = _eviction.train(parts[1], steps, profile=parts[-1] == "profile")
    elif case.startswith("memory:"):  # memory:<case>
        result = _memory.train(case.split(":")[1], steps)
    elif case.startswith("precision:"):  # precision:<case>[:quick]
        parts = case.split(":")
        result = _precision.train(parts[1], steps, quick=parts[-1] == "quick")
    elif case.startswith("index:"):
        result = _tables.index(case.split(":")[1], steps)
    elif case.startswith("dlrm:"):  # dlrm:<optimizer>:<batches file>[:profile|:pipeline|:cpu_threads]
        parts = case.split(":")
        result = _dlrm.train(parts[1], parts[2], profile=parts[-1] == "profile", pipeline=parts[-1] == "pipeline",
                             cpu_threads=parts[-1] == "cpu_threads")
    elif case.startswith("keras_rs:"):  # keras_rs:<ours|keras_rs>
        result = _keras_rs.train(case.split(":")[1], rows, steps)
    else:
        result = gather_ceiling(rows, keys) if case == "ceiling" else run_case(case, rows, steps, keys)
    if isinstance(result, dict) and "samples_per_s" in result:  # a timed run (not hit rates keyed by stream)
        result["anon_huge_mib"] = huge_page_mib()
    print("RESULT " + json.dumps(result))


def huge_page_mib() -> float | None:
    """MiB of this process's memory on transparent huge pages now (None where the kernel does not say)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            line = next((ln for ln in f if ln.startswith("AnonHugePages:")), None)
    except OSError:
        return None
    return None if line is None else round(int(line.split()[1]) / 1024, 1)


PEER_CASES = {"torchrec: FusedEmbeddingBagCollection (FBGEMM TBE CPU) + fused sgd": "torchrec_fused_sgd",
              "torchrec: FusedEmbeddingBagCollection (FBGEMM TBE CPU) + fused adagrad": "torchrec_fused_adagrad",
              "torchrec: FusedEmbeddingBagCollection (FBGEMM TBE CPU) + fused rowwise_adagrad":
                  "torchrec_fused_rowwise_adagrad",
              "plain: 26x nn.EmbeddingBag(sparse=True) + sparseadam": "pytorch_sparseadam"}


def run_peer(python: str, peers: str, huge_pages: bool = False, env: dict[str, str] | None = None) -> dict[str, float]:
    """TorchRec's fused CPU kernels and plain PyTorch on the same workload: {case: samples/s}
    (`huge_pages`: with PyTorch's own switch for huge pages in its CPU allocator, and glibc's;
    `env`: more environment)."""
    script = Path(peers) / "bench_torchrec.py"
    more = {**({**HUGE_PAGES, "THP_MEM_ALLOC_ENABLE": "1"} if huge_pages else {}), **(env or {})}
    env = {**os.environ, **more} if more else None
    out = subprocess.run([python, str(script), "fused_sgd", "fused_adagrad", "fused_rowwise_adagrad", "plain"],
                         capture_output=True, text=True, cwd=str(script.parent), env=env)
    results = {}
    for line in out.stdout.splitlines():
        if line.startswith("{") and '"median_sps"' in line:
            record = json.loads(line)
            if record["name"] in PEER_CASES:
                results[PEER_CASES[record["name"]]] = record["median_sps"]
    if out.returncode or len(results) < len(PEER_CASES):
        raise RuntimeError(f"the TorchRec run failed or was incomplete ({sorted(results)}):\n{out.stderr[-3000:]}")
    return results


def tables_report(results: dict, peers: dict[str, list[float]], profiles: dict) -> tuple[list[dict], dict]:
    """Rows and goals of the torchrec_shape group."""
    table, goals = [], {}
    for optimizer in _tables.OPTIMIZERS:
        runs = {kind: results[f"torchrec_shape:{kind}:{optimizer}"] for kind in TABLE_KINDS}
        sps = {kind: _bench.median([r["samples_per_s"] for r in runs[kind]]) for kind in TABLE_KINDS}
        for kind in TABLE_KINDS:
            row = {"case": "torchrec_shape", "table": kind, "optimizer": optimizer, "samples_per_s": round(sps[kind]),
                   "cpu_busy": round(_bench.median([r["cpu_busy"] for r in runs[kind]]), 2)}
            if kind.startswith("dynamic") and kind.endswith("pipeline"):  # against the static table so fed
                row["dynamic_vs_static_pipeline"] = round(sps[kind] / sps["static_pipeline"], 2)
            elif kind != "static":
                ratio = "vs_static" if kind.startswith("static") else "dynamic_vs_static"
                row[ratio] = round(sps[kind] / sps["static"], 2)
            table.append(row)
        goals[f"dynamic_vs_static_{optimizer}"] = {"goal": 0.9, "measured": round(sps["dynamic"] / sps["static"], 2)}
        goals[f"dynamic_warm_vs_static_{optimizer}"] = {"goal": 0.9,
                                                        "measured": round(sps["dynamic_warm"] / sps["static"], 2)}
        pairs = results.get(f"torchrec_shape:paired:{optimizer}")
        for phase in ("cold", "warm") if pairs else ():  # the same two tables in one process, step by step
            runs = [r[phase] for r in pairs]
            ratio = _bench.median([r["dynamic_vs_static"] for r in runs])
            table.append({"case": "torchrec_shape", "table": f"paired_{phase}", "optimizer": optimizer,
                          "static_samples_per_s": round(_bench.median([r["static_samples_per_s"] for r in runs])),
                          "samples_per_s": round(_bench.median([r["dynamic_samples_per_s"] for r in runs])),
                          "dynamic_vs_static": round(ratio, 2),
                          "ratio_quartiles": [round(_bench.median([r[q] for r in runs]), 2)
                                              for q in ("ratio_q1", "ratio_q3")]})
            goals[f"dynamic_{phase}_vs_static_paired_{optimizer}"] = {"goal": 0.9, "measured": round(ratio, 2)}
    for name, runs in peers.items():
        table.append({"case": "torchrec_peer", "table": name, "samples_per_s": round(_bench.median(runs))})
    if peers:
        peer = {name: _bench.median(runs) for name, runs in peers.items()}
        for kind in ("static", "static_pipeline"):
            ours_sps = {r["optimizer"]: r["samples_per_s"] for r in table if r.get("table") == kind}
            for ours, theirs, goal in (("sgd", "torchrec_fused_sgd", 1.5), ("adagrad", "torchrec_fused_adagrad", 2.0),
                                       ("rowwise_adagrad", "torchrec_fused_rowwise_adagrad", 1.2),
                                       ("lazyadam", "pytorch_sparseadam", 2.5)):
                goals[f"{kind}_{ours}_vs_{theirs}"] = {"goal": goal,
                                                       "measured": round(ours_sps[ours] / peer[theirs], 2)}
    return table, {"goals": goals, "profiles_ms_per_step": profiles}


def group_names(value: str) -> list[str]:
    """The groups `--group` names: ``all``, or one or more of `GROUPS` separated by commas.

    >>> group_names("torchrec_shape,dlrm")
    ['torchrec_shape', 'dlrm']
    """
    names = list(GROUPS) if value == "all" else [name.strip() for name in value.split(",")]
    unknown = [name for name in names if name not in GROUPS]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{value!r}: expected 'all' or distinct names among "
                                         f"{', '.join(GROUPS)}, separated by commas")
    return names


def main() -> None:
    parser = _bench.parser(__doc__)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--group", default="all", type=group_names,
                        help="all, or groups separated by commas (e.g. torchrec_shape,dlrm: both from one run)")
    parser.add_argument("--torchrec", default=None, help="python of a TorchRec virtualenv (runs the peer too)")
    parser.add_argument("--peers", default=str(_HERE.parent.parent / "shared" / "peers"),
                        help="folder holding bench_torchrec.py")
    parser.add_argument("--hugepages", action="store_true",
                        help="every case with glibc's huge-page advice (HUGE_PAGES), and TorchRec with PyTorch's "
                             "THP_MEM_ALLOC_ENABLE=1 (write to another --out to keep the default run's JSON)")
    args = parser.parse_args()
    groups = args.group
    if args.torchrec:  # (checked before any round runs: the peers run after ours)
        for group, script in (("torchrec_shape", "bench_torchrec.py"), ("dlrm", "bench_torchrec_dlrm.py")):
            if group in groups and not (Path(args.peers) / script).is_file():
                parser.error(f"--peers={args.peers!r} holds no {script} (the peer of group {group}); expected the "
                             "shared peers/ folder beside the checkout, or pass its path")
        if not Path(args.torchrec).is_file():
            parser.error(f"--torchrec={args.torchrec!r} is not a file; expected the python of a TorchRec virtualenv")

    def run(case: str, rows: int, steps: int, keys: str, env: dict[str, str] | None = None) -> dict | float:
        env = (HUGE_PAGES if args.hugepages else {}) if env is None else env  # (the hugepages group sets its own)
        out = subprocess.run([sys.executable, __file__, "--child", case, str(rows), str(steps), keys],
                             capture_output=True, text=True, env={**os.environ, **env} if env else None)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise RuntimeError(f"{case} at {rows} rows failed:\n{out.stderr[-3000:]}")
        return json.loads(line[0][7:])

    if "sok_vs_keras" in groups:
        sok_vs_keras(args, run)
    if "torchrec_shape" in groups or "index" in groups:
        steps = 8 if args.quick else _tables.STEPS
        results: dict[str, list] = {}
        peers: dict[str, list[float]] = {}
        cases = ([f"torchrec_shape:{kind}:{o}" for o in _tables.OPTIMIZERS for kind in (*TABLE_KINDS, "paired")]
                 if "torchrec_shape" in groups else [])
        cases += [f"index:{kind}" for kind in _tables.INDEXES + _tables.KERNELS] if "index" in groups else []
        for _ in range(1 if args.quick else args.repeat):
            for case in cases:
                results.setdefault(case, []).append(run(case, 0, steps, ""))
            if args.torchrec and "torchrec_shape" in groups:
                for name, sps in run_peer(args.torchrec, args.peers, args.hugepages).items():
                    peers.setdefault(name, []).append(sps)
        notes = {"workload": _tables.__doc__.split("\n\n")[1].replace("\n", " "), "huge_pages": bool(args.hugepages)}
        if "index" in groups:  # (a file of its own: running one group never overwrites the other's figures)
            rows = []
            for kind in _tables.KERNELS:
                runs = results[f"index:{kind}"]
                rows.append({"case": kind, **{k: round(_bench.median([r[k] for r in runs]), 2) for k in runs[0]}})
            for kind in _tables.INDEXES:
                runs = results[f"index:{kind}"]
                rows.append({"case": "index", "table": kind,
                             "lookup_insert_ms": round(_bench.median([r["lookup_insert_ms"] for r in runs]), 2),
                             "lookup_ms": round(_bench.median([r["lookup_ms"] for r in runs]), 2),
                             "distinct_keys_per_step": round(runs[0]["distinct_keys_per_step"])})
            _bench.report("embedding_index", rows, args.out, notes=dict(notes))
        if "torchrec_shape" in groups:
            profiles = {f"{kind}_{o}": run(f"torchrec_shape:{kind}:{o}:profile", 0, steps, "")["profile_ms"]
                        for o in ("sgd", "lazyadam") for kind in ("static", "dynamic")}
            rows, more = tables_report(results, peers, profiles)
            notes.update(more)
            _bench.report("embedding_tables", rows, args.out, notes=notes)
        for name, g in notes.get("goals", {}).items():
            print(f"{name}: {g['measured']} (goal {g['goal']}) {'met' if g['measured'] >= g['goal'] else 'NOT met'}")
        for name, ops in notes.get("profiles_ms_per_step", {}).items():
            print(f"top ops, {name} (ms of CPU per step): "
                  + ", ".join(f"{o['phase']}/{o['op']} {o['ms']}" for o in ops[:8]))
    if "eviction" in groups:
        eviction(args, run)
    if "memory" in groups:
        steps = args.steps or (6 if args.quick else _memory.STEPS)
        measured: dict[str, list] = {}
        for _ in range(1 if args.quick else args.repeat):
            for case in _memory.CASES:
                measured.setdefault(case, []).append(run(f"memory:{case}", 0, steps, ""))
        rows, notes = _memory.report(measured)
        _bench.report("embedding_memory", rows, args.out, notes=notes)
    if "precision" in groups:
        precision(args, run)
    if "keras_rs" in groups:
        keras_rs(args, run)
    if "dlrm" in groups:
        dlrm(args, run)
    if "hugepages" in groups:
        hugepages(args, run)
    if "heap" in groups:
        heap(args, run)


def settings_round(args: Any, run: Any, cases: dict[str, str], settings: dict[str, dict[str, str]],
                   results: dict[tuple[str, str], list[dict]]) -> None:
    """One round of a group that runs each of `cases` under each environment of `settings` in
    turn (hugepages, heap): each run appended to ``results[(case, setting)]``."""
    for case in cases:
        quick, full = (8, _tables.STEPS) if case.startswith("torchrec") else (12, _eviction.STEPS)
        for setting, env in settings.items():
            results.setdefault((case, setting), []).append(run(case, 0, quick if args.quick else full, "", env))


def env_text(env: dict[str, str]) -> str:
    """A setting's environment as the JSON's notes give it: ``NAME=value ...``, or "(as installed)"."""
    return " ".join(f"{k}={v}" for k, v in env.items()) or "(as installed)"


def heap(args: Any, run: Any) -> None:
    """The heap group: the same cases with malloc's thresholds as glibc has them and as the library
    sets them (`sok_tutorial.embedding.heap_reuse`), interleaved; samples/s and page faults per
    step. With ``--torchrec``, TorchRec's cases too, as they come and with the same three settings
    made through ``GLIBC_TUNABLES``."""
    results: dict[tuple[str, str], list[dict]] = {}
    peers: dict[str, dict[str, list[float]]] = {}
    for _ in range(1 if args.quick else args.repeat):
        settings_round(args, run, HEAP_CASES, HEAP_SETTINGS, results)
        if args.torchrec:
            for setting, env in (("off", {}), ("on", HEAP_TUNABLES)):
                for name, sps in run_peer(args.torchrec, args.peers, env=env).items():
                    peers.setdefault(name, {}).setdefault(setting, []).append(sps)
    rows = []
    for case, key in HEAP_CASES.items():
        rate = {s: _bench.median([r[key] for r in results[(case, s)]]) for s in HEAP_SETTINGS}
        faults = {s: _bench.median([r["page_faults_per_step"] for r in results[(case, s)]]) for s in HEAP_SETTINGS}
        rows.append({"case": case, "samples_per_s_off": round(rate["off"]), "samples_per_s": round(rate["on"]),
                     "ratio": round(rate["on"] / rate["off"], 3), "page_faults_per_step_off": round(faults["off"]),
                     "page_faults_per_step": round(faults["on"])})
    for name, by in peers.items():
        off, on = _bench.median(by["off"]), _bench.median(by["on"])
        rows.append({"case": f"peer:{name}", "samples_per_s_off": round(off), "samples_per_s": round(on),
                     "ratio": round(on / off, 3)})
    _bench.report("embedding_heap", rows, args.out,
                  notes={"settings": {s: env_text(env) for s, env in HEAP_SETTINGS.items()},
                         "peer_on": env_text(HEAP_TUNABLES)})


def hugepages(args: Any, run: Any) -> None:
    """The hugepages group: the same cases with the tables' huge pages off, as they come (the
    library advises its large variables, `sok_tutorial.embedding.huge_pages`) and with glibc's
    advice on every large allocation besides, interleaved."""
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(1 if args.quick else args.repeat):
        settings_round(args, run, HUGE_PAGE_CASES, HUGE_PAGE_SETTINGS, results)
    rows = []
    for case, key in HUGE_PAGE_CASES.items():
        rate = {s: _bench.median([r[key] for r in results[(case, s)]]) for s in HUGE_PAGE_SETTINGS}
        mib = {s: _bench.median([r["anon_huge_mib"] or 0 for r in results[(case, s)]]) for s in HUGE_PAGE_SETTINGS}
        rows.append({"case": case, "samples_per_s_off": round(rate["off"]), "samples_per_s": round(rate["tables"]),
                     "samples_per_s_glibc": round(rate["glibc"]), "ratio": round(rate["tables"] / rate["off"], 3),
                     "ratio_glibc": round(rate["glibc"] / rate["off"], 3), "huge_page_mib_off": mib["off"],
                     "huge_page_mib": mib["tables"], "huge_page_mib_glibc": mib["glibc"]})
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        thp = "unknown"
    _bench.report("embedding_hugepages", rows, args.out,
                  notes={"settings": {s: env_text(env) for s, env in HUGE_PAGE_SETTINGS.items()}, "thp": thp})


def sok_vs_keras(args: Any, run: Any) -> None:
    """The sok_vs_keras group: the cases at the top of the module docstring."""
    sizes = [200_000, 2_000_000] if args.quick else [1_000_000, 10_000_000]
    steps = args.steps or (4 if args.quick else 10)

    results: dict[tuple[str, int, str], list] = {}
    for _ in range(args.repeat):
        for keys in KEYS:
            for rows in sizes:
                for case in CASES + ["ceiling"]:
                    results.setdefault((case, rows, keys), []).append(run(case, rows, steps, keys))
    table = []
    for keys in KEYS:
        for rows in sizes:
            ceiling = _bench.median(results[("ceiling", rows, keys)])
            by_case = {}
            for case in CASES:
                runs = results[(case, rows, keys)]
                sps = _bench.median([r["samples_per_s"] for r in runs])
                by_case[case] = sps
                distinct = runs[0]["unique_rows"]
                row = {"case": case, "keys": keys, "rows": rows, "samples_per_s": round(sps),
                       "distinct_rows_per_batch": round(distinct)}
                if case == "sok_lazyadam":
                    # per distinct row: gather it (D floats), read+write it (2D), read+write m|v|count (2(2D+1))
                    bytes_per_step = distinct * 4 * (7 * DIM + 2)
                    moved = bytes_per_step * sps / BATCH
                    row.update(embedding_gb_per_s=round(moved / 1e9, 3),
                               gather_ceiling_gb_per_s=round(ceiling / 1e9, 3),
                               fraction_of_ceiling=round(moved / ceiling, 3))
                table.append(row)
            for row in table[-len(CASES):]:
                row["vs_keras_embedding_adam"] = round(row["samples_per_s"] / by_case["keras_embedding_adam"], 2)
    big = max(sizes)
    goals = {}
    for keys in KEYS:
        sok_big = next(r for r in table if r["case"] == "sok_lazyadam" and r["rows"] == big and r["keys"] == keys)
        tf_big = next(r for r in table if r["case"] == "tf_sparse_lookup" and r["rows"] == big and r["keys"] == keys)
        goals[f"sok_vs_keras_at_largest_{keys}"] = {"goal": 10, "measured": sok_big["vs_keras_embedding_adam"]}
        goals[f"sok_vs_tf_sparse_lookup_at_largest_{keys}"] = {
            "goal": 1.0, "measured": round(sok_big["samples_per_s"] / tf_big["samples_per_s"], 2)}
    _bench.report("embedding", table, args.out, notes={"slots": SLOTS, "dim": DIM, "batch": BATCH, "goals": goals})
    for name, g in goals.items():
        print(f"{name}: {g['measured']} (goal {g['goal']}) {'met' if g['measured'] >= g['goal'] else 'NOT met'}")


def eviction(args: Any, run: Any) -> None:
    """The eviction group (`benchmarks._eviction`): a drifting key stream into roomy and full tables."""
    steps = args.steps or (12 if args.quick else _eviction.STEPS)
    results: dict[str, list] = {}
    for _ in range(1 if args.quick else args.repeat):
        for case in (*_eviction.CASES, *_eviction.BOUNDS):
            results.setdefault(case, []).append(run(f"eviction:{case}", 0, steps, ""))
    profiles = {case: run(f"eviction:{case}:profile", 0, steps, "")["profile"] for case in _eviction.PROFILED}
    hits, deltas = run("eviction:hit_rates", 0, steps, ""), run("eviction:deltas", 0, steps, "")
    rows, notes = _eviction.report(results, profiles, _eviction.stream(steps), hits, deltas)
    _bench.report("embedding_eviction", rows, args.out, notes=notes)
    for name, g in notes["goals"].items():
        print(f"{name}: {g['measured']} (goal {g['goal']}) {'met' if g['met'] else 'NOT met'}")
    for name, b in notes["bounds"].items():
        print(f"bound {name}: {b['vs_roomy_amortized']} (its table {b.get('its_table_vs_roomy_amortized')}, goal "
              f"{b['goal_of_its_table']})")
    if notes["within_run"]:
        print("within the run: " + ", ".join(f"{name} {ratio}" for name, ratio in notes["within_run"].items()))
    if notes["roomy_check"].get("roomy_ran_slow"):
        print(f"the roomy table ran slower than its tracked twin (tracked / roomy "
              f"{notes['roomy_check']['tracked_vs_roomy_amortized']}): the ratios against it read high")
    for name, prof in notes["profiles_ms_per_step"].items():
        ops = prof if isinstance(prof, list) else prof["ops_ms"]
        print(f"top ops, {name} (ms of CPU per step): "
              + ", ".join(f"{o['phase']}/{o['op']} {o['ms']}" for o in ops[:8]))


def precision(args: Any, run: Any) -> None:
    """The precision group (`benchmarks._precision`): float32, bfloat16 and float16 tables side by side."""
    steps = args.steps or (6 if args.quick else _tables.STEPS)
    results: dict[str, list] = {}
    for _ in range(1 if args.quick else args.repeat):
        for case in _precision.CASES:
            results.setdefault(case, []).append(run(f"precision:{case}" + (":quick" if args.quick else ""), 0,
                                                    steps, ""))
    rows = _precision.report(results)
    _bench.report("embedding_precision", rows, args.out,
                  notes={"workload": _precision.__doc__.split("\n\n")[1].replace("\n", " ")})


def dlrm(args: Any, run: Any) -> None:
    """The dlrm group (`benchmarks._dlrm`): notebook 05's DLRM against TorchRec's (with ``--torchrec``),
    interleaved rounds on one file of batches."""
    data = str(_dlrm.write_batches(Path(args.out) / "dlrm-batches.npz"))
    ours: dict[tuple[str, str], list] = {}
    peers: dict[tuple[str, str], list] = {}
    for _ in range(1 if args.quick else args.repeat):
        for optimizer in _dlrm.OPTIMIZERS:
            for system in _dlrm.OURS:
                ours.setdefault((system, optimizer), []).append(
                    run(f"dlrm:{optimizer}:{data}{_dlrm.CASE_SUFFIX[system]}", 0, 0, "", env=dlrm_env(args, system)))
            if args.torchrec:
                for impl in ("dmp", "fused"):
                    peers.setdefault((impl, optimizer), []).append(
                        _dlrm.run_peer(args.torchrec, args.peers, impl, optimizer, data))
    rows, notes = _dlrm.report(ours, peers)
    notes["case_env"] = {s: env_text(e) for s, e in _dlrm.CASE_ENV.items()}
    notes["profile_ms_per_step_sgd"] = run(f"dlrm:sgd:{data}:profile", 0, 0, "")["profile_ms"]
    notes["profile_ms_per_step_sgd_onednn"] = run(f"dlrm:sgd:{data}:profile", 0, 0, "",
                                                  env=dlrm_env(args, "ours_onednn"))["profile_ms"]
    _bench.report("embedding_dlrm", rows, args.out, notes=notes)
    for name, g in notes["goals"].items():
        print(f"{name}: {g['measured']} (goal {g['goal']}) {'met' if g['measured'] >= g['goal'] else 'NOT met'}")
    for label, key in (("dlrm sgd", "profile_ms_per_step_sgd"), ("dlrm sgd, oneDNN", "profile_ms_per_step_sgd_onednn")):
        print(f"top ops, {label} (ms of CPU per step): "
              + ", ".join(f"{o['phase']}/{o['op']} {o['ms']}" for o in notes[key][:8]))


def dlrm_env(args: Any, system: str) -> dict[str, str]:
    """The child environment of one of our dlrm `system`s: its `_dlrm.CASE_ENV` over the huge-page
    settings of ``--hugepages`` (empty: the benchmark's own)."""
    return {**(HUGE_PAGES if args.hugepages else {}), **_dlrm.CASE_ENV.get(system, {})}


def keras_rs(args: Any, run: Any) -> None:
    """The keras_rs group (`benchmarks._keras_rs`): our layer from Keras-RS's configuration against Keras-RS's."""
    steps = args.steps or (3 if args.quick else _keras_rs.STEPS)
    results: dict[tuple[str, int], list] = {}
    for _ in range(1 if args.quick else args.repeat):
        for rows in _keras_rs.ROWS:
            for case in _keras_rs.CASES:
                results.setdefault((case, rows), []).append(run(f"keras_rs:{case}", rows, steps, ""))
    rows, notes = _keras_rs.report(results)
    _bench.report("embedding_keras_rs", rows, args.out, notes=notes)
    for name, g in notes["goals"].items():
        print(f"{name}: {g['measured']} (goal {g['goal']}) {'met' if g['measured'] >= g['goal'] else 'NOT met'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
