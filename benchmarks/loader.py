"""The parquet loader against the decode ceiling and the tf.data pipelines, on Criteo-like data
(13 continuous + 26 categorical + label), batch 65536 by default.

Cases (rows/s and peak RSS, each in its own process, interleaved over --repeat rounds):

    raw_decode                 pyarrow reading every file (pq.read_table): the decode ceiling
    parquet_loader             ParquetLoader, shuffle on
    parquet_loader_noshuffle   ParquetLoader, shuffle off
    parquet_loader_hashbucket  ParquetLoader, shuffle on, HashBucket on the 26 categoricals
    tfrecord_native            TFRecords via tf.data: shuffle buffer, parse_example, keras Hashing
    pandas_from_tensor_slices  pandas.read_parquet -> tf.data.from_tensor_slices -> shuffle -> batch

and the training-side view: steps/s of a small Keras model fed by the loader vs fed from tensors
already in memory (train_loader, train_memory).

Every case also reports the CPU seconds it used per wall second (``cores_busy``), and a
``profile`` child times the loader's stages one after another on one thread (decode, concat,
shuffle gather, batch slicing + hand-over to TensorFlow): where an epoch's CPU time goes.

    python benchmarks/loader.py [--quick] [--rows N] [--batch-size B] [--out build/bench]
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE.parent)]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import _bench  # noqa: E402

CASES = ["raw_decode", "parquet_loader", "parquet_loader_noshuffle", "parquet_loader_hashbucket",
         "tfrecord_native", "pandas_from_tensor_slices"]
TRAIN_CASES = ["train_loader", "train_memory"]
SHUFFLE_BUFFER = 65_536


def prepare(data: Path, rows: int, native_rows: int) -> None:
    from data_gen.criteo import CAT_NAMES, CONT_NAMES, write_criteo_parquet
    from sok_tutorial.data.tfrecord import write_tfrecords

    write_criteo_parquet(data / "criteo", rows, num_parts=2, reuse=True, overwrite=True, progress=False)
    write_criteo_parquet(data / "criteo-native", native_rows, reuse=True, overwrite=True, progress=False)
    marker = data / "tfrecords" / f".rows-{native_rows}"
    if not marker.is_file():
        write_tfrecords(data / "criteo-native", data / "tfrecords", label_names=["label"], cat_names=CAT_NAMES,
                        cont_names=CONT_NAMES, overwrite=True, progress=False)
        marker.touch()


def run_case(case: str, data: Path, batch: int, steps: int) -> dict:
    """Runs in a child process; times the second of two passes (rows, seconds; steps when training).

    Only the case's own libraries are imported, so peak RSS is the case's footprint."""
    import pyarrow.parquet as pq

    from data_gen.criteo import CAT_NAMES, CONT_NAMES
    from sok_tutorial.data.schema import resolve_files

    files = resolve_files(data / "criteo")
    if case != "raw_decode":
        from sok_tutorial.data import HashBucket, ParquetLoader

    def loader(**kw):
        return ParquetLoader(data / "criteo", batch, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES,
                             fill_nan=0.0, **kw)

    def count(iterable) -> int:
        return sum(int(labels.shape[0]) for _, labels in iterable)

    if case in TRAIN_CASES:
        return train(case, loader(), steps)
    if case == "raw_decode":
        def one_pass() -> int:
            return sum(pq.read_table(f, columns=["label", *CONT_NAMES, *CAT_NAMES]).num_rows for f in files)
    elif case.startswith("parquet_loader"):
        kw = {"parquet_loader": {}, "parquet_loader_noshuffle": {"shuffle": False},
              "parquet_loader_hashbucket": {"transforms": [HashBucket(10_000)]}}[case]
        it = loader(**kw)

        def one_pass() -> int:
            return count(it)
    elif case == "tfrecord_native":
        from sok_tutorial.data.tfrecord import tfrecord_dataset
        ds = tfrecord_dataset(sorted((data / "tfrecords").glob("*.tfrecords")), batch, ["label"],
                              cat_names=CAT_NAMES, cont_names=CONT_NAMES, shuffle_buffer=SHUFFLE_BUFFER,
                              hash_buckets=10_000)

        def one_pass() -> int:
            return count(ds)
    elif case == "pandas_from_tensor_slices":
        import pandas as pd
        import tensorflow as tf
        df = pd.concat([pd.read_parquet(f) for f in resolve_files(data / "criteo-native")], ignore_index=True)
        df[CONT_NAMES] = df[CONT_NAMES].fillna(0.0)
        labels = df.pop("label").to_numpy("float32")[:, None]
        ds = tf.data.Dataset.from_tensor_slices((dict(df), labels)).shuffle(SHUFFLE_BUFFER).batch(batch)

        def one_pass() -> int:
            return count(ds)
    else:
        raise ValueError(f"unknown case {case!r}")
    one_pass()  # warm-up pass: OS file cache, allocator pools, tf.data graph tracing
    start, cpu = time.perf_counter(), time.process_time()
    rows = one_pass()
    seconds = time.perf_counter() - start
    return {"rows": rows, "seconds": seconds, "cpu_seconds": time.process_time() - cpu}


def profile(data: Path, batch: int) -> dict:
    """Seconds of each loader stage over one shuffled epoch, run serially on one thread.

    The stages are the ones the loader's threads overlap: decode (pyarrow -> NumPy, per row group),
    concat (row groups -> one chunk), shuffle (the permuting gather), batch (cut and hand each
    batch to TensorFlow)."""
    import numpy as np

    from data_gen.criteo import CAT_NAMES, CONT_NAMES
    from sok_tutorial.data import ParquetLoader
    from sok_tutorial.data import columns as cols

    it = ParquetLoader(data / "criteo", batch, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES, fill_nan=0.0)
    core = it.core
    list(core.iterate(it._to_tf, prefetch=1, epoch=0))  # warm-up: file cache, buffer pools
    stages = {"decode": 0.0, "concat": 0.0, "shuffle": 0.0, "batch": 0.0}
    rows = 0
    for index, plan in enumerate(core.chunks(1)):
        t0 = time.process_time()
        parts = [core.read_segment(seg, core._read_pool) for seg in plan]
        t1 = time.process_time()
        chunk = cols.concat(parts, core._read_pool)
        del parts
        t2 = time.process_time()
        perm = np.random.default_rng([core.seed, 1, core.global_rank, index]).permutation(cols.num_rows(chunk))
        chunk = cols.take(chunk, perm, core._shuffle_pool)
        t3 = time.process_time()
        for start in range(0, cols.num_rows(chunk), batch):
            features, labels = it._to_tf(core.finish(cols.slice_rows(chunk, start, start + batch)))
            rows += int(labels.shape[0])
        del features, labels, chunk
        t4 = time.process_time()
        for name, seconds in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            stages[name] += seconds
    return {"rows": rows, "stages": stages}


def train(case: str, loader, steps: int) -> dict:
    """steps/s of a small embedding + MLP model, fed by the loader or by batches held in memory."""
    import keras
    import tensorflow as tf

    from data_gen.criteo import CAT_NAMES, CONT_NAMES

    inputs = {n: keras.Input([], dtype="int64", name=n) for n in CAT_NAMES}
    inputs.update({n: keras.Input([], dtype="float32", name=n) for n in CONT_NAMES})
    emb = [keras.layers.Embedding(loader.cardinalities[n], 8)(inputs[n]) for n in CAT_NAMES]
    dense = keras.layers.Concatenate()(emb + [keras.ops.expand_dims(inputs[n], -1) for n in CONT_NAMES])
    x = keras.layers.Dense(256, activation="relu")(dense)
    x = keras.layers.Dense(128, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def batches():
        while True:
            yield from loader

    if case == "train_memory":
        held = [b for _, b in zip(range(4), batches())]
        source = (held[i % len(held)] for i in range(10**9))
    else:
        source = batches()
    for _ in range(3):  # warm-up: tracing, allocator, first chunks
        step(*next(source))
    start = time.perf_counter()
    for _ in range(steps):
        loss = step(*next(source))
    float(loss)
    return {"steps": steps, "seconds": time.perf_counter() - start, "rows": steps * loader.batch_size}


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM starts afresh at exec; ru_maxrss would carry the
    parent's peak over into the child."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(argv: list[str]) -> None:
    case, data, batch, steps = argv[0], Path(argv[1]), int(argv[2]), int(argv[3])
    result = profile(data, batch) if case == "profile" else run_case(case, data, batch, steps)
    result["peak_rss_mib"] = peak_rss_mib()
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = _bench.parser(__doc__)
    parser.add_argument("--rows", type=int, default=None, help="rows of the parquet dataset")
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--data", default="build/bench-data/loader", help="where the datasets are cached")
    parser.add_argument("--steps", type=int, default=None, help="timed training steps per training case")
    args = parser.parse_args()
    rows = args.rows or (1_048_576 if args.quick else 4_194_304)
    native_rows = min(rows, 262_144 if args.quick else 524_288)
    steps = args.steps or (5 if args.quick else 20)
    data = Path(args.data).resolve()
    prepare(data, rows, native_rows)

    results: dict[str, list[dict]] = {c: [] for c in CASES + TRAIN_CASES}
    profiles: list[dict] = []
    for _ in range(args.repeat):
        for case in CASES + TRAIN_CASES:
            out = subprocess.run([sys.executable, __file__, "--child", case, str(data), str(args.batch_size),
                                  str(steps)], capture_output=True, text=True)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode or not line:
                raise RuntimeError(f"case {case} failed:\n{out.stderr[-3000:]}")
            results[case].append(json.loads(line[0][7:]))
        out = subprocess.run([sys.executable, __file__, "--child", "profile", str(data), str(args.batch_size), "0"],
                             capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise RuntimeError(f"profile failed:\n{out.stderr[-3000:]}")
        profiles.append(json.loads(line[0][7:]))

    table = []
    for case in CASES:
        rates = [r["rows"] / r["seconds"] for r in results[case]]
        table.append({"case": case, "rows": results[case][0]["rows"], "rows_per_s": round(_bench.median(rates)),
                      "cores_busy": round(_bench.median([r["cpu_seconds"] / r["seconds"] for r in results[case]]), 2),
                      "peak_rss_mib": round(max(r["peak_rss_mib"] for r in results[case]))})
    by = {r["case"]: r["rows_per_s"] for r in table}
    for r in table:
        r["vs_raw_decode"] = round(r["rows_per_s"] / by["raw_decode"], 3)
        r["vs_tfrecord_native"] = round(r["rows_per_s"] / by["tfrecord_native"], 1)
    for case in TRAIN_CASES:
        rates = [r["steps"] / r["seconds"] for r in results[case]]
        table.append({"case": case, "rows": results[case][0]["rows"], "steps_per_s": round(_bench.median(rates), 3),
                      "peak_rss_mib": round(max(r["peak_rss_mib"] for r in results[case]))})
    train_ratio = table[-2]["steps_per_s"] / table[-1]["steps_per_s"]
    goals = {"parquet_loader_vs_raw_decode": (0.8, by["parquet_loader"] / by["raw_decode"]),
             "parquet_loader_vs_tfrecord_native": (15, by["parquet_loader"] / by["tfrecord_native"]),
             "train_loader_vs_memory": (0.9, train_ratio)}
    stages = {name: _bench.median([p["stages"][name] / p["rows"] * 1e6 for p in profiles])
              for name in profiles[0]["stages"]}
    total = sum(stages.values())
    # CPU seconds per million rows: the loader's stages (serial) against raw_decode's own CPU time
    raw_cpu = _bench.median([r["cpu_seconds"] / r["rows"] * 1e6 for r in results["raw_decode"]])
    notes = {"batch_size": args.batch_size, "dataset_rows": rows, "native_rows": native_rows,
             "goals": {k: {"goal": g, "measured": round(m, 3)} for k, (g, m) in goals.items()},
             "profile_cpu_s_per_million_rows": {
                 "raw_decode": round(raw_cpu, 4),
                 **{f"loader_{name}": round(v, 4) for name, v in stages.items()},
                 "loader_total": round(total, 4)},
             "profile_share": {name: round(v / total, 3) for name, v in stages.items()}}
    _bench.report("loader", table, args.out, notes=notes)
    print("loader stages, CPU s per million rows (serial): "
          + ", ".join(f"{k} {v:.3f}" for k, v in stages.items())
          + f"; total {total:.3f} vs raw_decode {raw_cpu:.3f}")
    for name, goal in notes["goals"].items():
        verdict = "met" if goal["measured"] >= goal["goal"] else "NOT met"
        print(f"{name}: {goal['measured']:.3g} (goal {goal['goal']}) {verdict}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
