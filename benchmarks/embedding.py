"""Embedding training speed: 26 slots, dim 16, batch 8192, tables of 1M and 10M rows.

Cases (training samples/s, each in its own process, interleaved over --repeat rounds):

    sok_lazyadam          DistributedEmbedding (row ids) + sok_tutorial LazyAdam: sparse updates
    keras_embedding_adam  keras.layers.Embedding + keras Adam (dense updates of the whole table)
    tf_sparse_lookup      tf.nn.embedding_lookup_sparse + keras Adam
    group_lookup_fused    group_embedding_lookup_sparse over 26 tables, one segment sum
    group_lookup_loop     the same, one segment sum per table

The physical ceiling: this machine's random row-gather bandwidth (NumPy, same table size); the
report gives the embedding bytes a sok_lazyadam step moves per second as a fraction of it.

    python benchmarks/embedding.py [--quick] [--out build/bench]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE.parent)]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import _bench  # noqa: E402

SLOTS, DIM, BATCH = 26, 16, 8192
KEYS = ["criteo_like", "uniform"]  # Zipf keys as in CTR data, and the uniform worst case
CASES = ["sok_lazyadam", "keras_embedding_adam", "tf_sparse_lookup", "group_lookup_fused", "group_lookup_loop"]


def draw_keys(rng, rows: int, shape: tuple, keys: str):
    """Uniform row ids (the worst case for sparse updates) or Criteo-like Zipf frequencies."""
    import numpy as np

    if keys == "uniform":
        return rng.integers(0, rows, shape)
    s = 1.1  # the Criteo-like generator's mean exponent, power law over ranks [1, rows]
    u = rng.random(shape)
    rank = np.floor((1 + u * ((rows + 1.0) ** (1 - s) - 1)) ** (1 / (1 - s))).astype(np.int64) - 1
    return np.random.default_rng(123).permutation(rows)[np.clip(rank, 0, rows - 1)]


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
        tables = [keras.Variable(keras.initializers.RandomUniform(-0.05, 0.05)((per_table, DIM))) for _ in range(SLOTS)]
        for t in tables:
            t._sok_embedding = True
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

    data = [(tf.constant(k), tf.constant(y)) for k, y in batches]
    for i in range(2):
        step(*data[i])
    start = time.perf_counter()
    for i in range(steps):
        loss = step(*data[i % len(data)])
    float(loss)
    seconds = (time.perf_counter() - start) / steps
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
    result = gather_ceiling(rows, keys) if case == "ceiling" else run_case(case, rows, steps, keys)
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = _bench.parser(__doc__)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    sizes = [200_000, 2_000_000] if args.quick else [1_000_000, 10_000_000]
    steps = args.steps or (4 if args.quick else 10)

    def run(case: str, rows: int, keys: str) -> dict | float:
        out = subprocess.run([sys.executable, __file__, "--child", case, str(rows), str(steps), keys],
                             capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise RuntimeError(f"{case} at {rows} rows failed:\n{out.stderr[-3000:]}")
        return json.loads(line[0][7:])

    results: dict[tuple[str, int, str], list] = {}
    for _ in range(args.repeat):
        for keys in KEYS:
            for rows in sizes:
                for case in CASES + ["ceiling"]:
                    results.setdefault((case, rows, keys), []).append(run(case, rows, keys))
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


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
