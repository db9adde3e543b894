"""The parquet loader against the decode ceiling and the tf.data pipelines, on Criteo-like data
(13 continuous + 26 categorical + label), batch 65536 by default.

Cases (rows/s and peak RSS, each in its own process, interleaved over --repeat rounds):

    raw_decode                 pyarrow reading every file (pq.read_table): the decode ceiling
    decode_row_groups          pyarrow decoding every row group, one per thread in the loader's
                               number of read threads: the loader's own decode, nothing else
    parquet_loader             ParquetLoader, shuffle on
    parquet_loader_noshuffle   ParquetLoader, shuffle off
    parquet_loader_hashbucket  ParquetLoader, shuffle on, HashBucket on the 26 categoricals
    tfrecord_native            TFRecords via tf.data: shuffle buffer, parse_example, keras Hashing
    pandas_from_tensor_slices  pandas.read_parquet -> tf.data.from_tensor_slices -> shuffle -> batch

and the training-side view: steps/s of a small Keras model fed by the loader vs fed from tensors
already in memory (train_loader, train_memory).

The ``small_files`` workload is merlin-dataloader's own (../shared/peers/): 1M Criteo-like rows
without nulls in 4 files of 4 row groups (62,500 rows, smaller than a batch), 3 epochs in one
process, the median epoch reported; ``small_files/raw_decode`` reads the same files with
pq.read_table, ``small_files/parquet_loader`` shuffles, ``.../parquet_loader_noshuffle`` does not.

Every case also reports the CPU seconds it used per wall second (``cores_busy``), and a
``profile`` child times the loader's stages one after another on one thread, on each workload
(pyarrow's own decode of the row groups, our conversion of them to checked NumPy columns, concat,
the per-batch gather, the hand-over to TensorFlow): where an epoch's CPU time goes. Beside them,
bare NumPy on the same chunks: one sequential copy of every column and one take of every column
in a random order, the least any loader pays to hand over its own buffers, and to shuffle rows.
Both cores are busy in raw_decode, so wall time follows CPU time: raw_decode's CPU seconds over
pyarrow's decode alone (and over decode plus the bare permuted take) is the best ratio a loader
can reach unshuffled (shuffled); the notes call it ``ceiling_vs_raw_decode``. The same child then
clocks the stages inside the loader's own threads over a few shuffled epochs, with the
core-seconds no thread used (``profile_threaded_core_s_per_million_rows``): the loader's whole
wall time, split into pyarrow's decode, our stages, and idle cores.

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

CASES = ["raw_decode", "decode_row_groups", "parquet_loader", "parquet_loader_noshuffle", "parquet_loader_hashbucket",
         "tfrecord_native", "pandas_from_tensor_slices"]
TRAIN_CASES = ["train_loader", "train_memory"]
SMALL_CASES = ["small_files/raw_decode", "small_files/decode_row_groups", "small_files/parquet_loader",
               "small_files/parquet_loader_noshuffle"]
SMALL_EPOCHS = 3
PROFILES = ["profile/default", "profile/small_files"]
SHUFFLE_BUFFER = 65_536


def prepare(data: Path, rows: int, native_rows: int) -> None:
    from data_gen.criteo import CAT_NAMES, CONT_NAMES, write_criteo_parquet
    from sok_tutorial.data.tfrecord import write_tfrecords

    write_criteo_parquet(data / "criteo", rows, num_parts=2, reuse=True, overwrite=True, progress=False)
    write_criteo_parquet(data / "criteo-native", native_rows, reuse=True, overwrite=True, progress=False)
    write_small_files(data / "small_files")
    marker = data / "tfrecords" / f".rows-{native_rows}"
    if not marker.is_file():
        write_tfrecords(data / "criteo-native", data / "tfrecords", label_names=["label"], cat_names=CAT_NAMES,
                        cont_names=CONT_NAMES, overwrite=True, progress=False)
        marker.touch()


def write_small_files(out: Path, files: int = 4, rows: int = 250_000, row_group: int = 62_500) -> None:
    """merlin-dataloader's workload: label int32, I1..I13 float32, C1..C26 int64 (skewed ids under
    Criteo's cardinalities), no nulls, snappy; seeded, written once."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_gen.criteo import CAT_NAMES, CONT_NAMES, CRITEO_CARDINALITIES

    marker = out / f".rows-{files * rows}-{row_group}"
    if marker.is_file():
        return
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2024)
    for f in range(files):
        table = {"label": (rng.random(rows) < 0.25).astype(np.int32)}
        for i, name in enumerate(CONT_NAMES):
            table[name] = np.log1p(rng.geometric(1 / (2 + 3 * i), rows) - 1).astype(np.float32)
        for name, card in zip(CAT_NAMES, CRITEO_CARDINALITIES):
            table[name] = np.minimum((card * rng.random(rows) ** 3).astype(np.int64), card - 1)
        pq.write_table(pa.table(table), out / f"part{f}.parquet", row_group_size=row_group, compression="snappy")
    marker.touch()


def columns() -> list[str]:
    """The columns every case reads: the label, the 13 continuous and the 26 categorical ones."""
    from data_gen.criteo import CAT_NAMES, CONT_NAMES

    return ["label", *CONT_NAMES, *CAT_NAMES]


def decode_row_groups(files: list[Path]) -> int:
    """pyarrow decoding every row group of `files` as the loader's read threads do (one row group
    per call, in as many threads), and nothing more: the loader's decode without the loader."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from sok_tutorial.data.loader_base import _DECODE_WORKERS

    local = threading.local()
    names = columns()

    def read(job: tuple[int, int]) -> int:
        handles = local.__dict__.setdefault("handles", {})
        if job[0] not in handles:
            handles[job[0]] = pq.ParquetFile(files[job[0]])
        return handles[job[0]].read_row_group(job[1], columns=names, use_threads=False).num_rows

    jobs = [(i, g) for i, f in enumerate(files) for g in range(pq.ParquetFile(f).metadata.num_row_groups)]
    with ThreadPoolExecutor(_DECODE_WORKERS) as pool:
        return sum(pool.map(read, jobs))


def run_small(case: str, data: Path, batch: int) -> dict:
    """One small_files case: SMALL_EPOCHS epochs in this process, the median epoch (rows, seconds)."""
    import pyarrow.parquet as pq

    from data_gen.criteo import CAT_NAMES, CONT_NAMES

    files = sorted((data / "small_files").glob("*.parquet"))
    kind = case.split("/", 1)[1]
    if kind == "raw_decode":
        names = columns()

        def epoch() -> int:
            return sum(pq.read_table(f, columns=names).num_rows for f in files)
    elif kind == "decode_row_groups":
        def epoch() -> int:
            return decode_row_groups(files)
    else:
        from sok_tutorial.data import ParquetLoader
        loader = ParquetLoader(files, batch, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES,
                               shuffle=kind == "parquet_loader")

        def epoch() -> int:
            return sum(int(labels.shape[0]) for _, labels in loader)
    runs = []
    for _ in range(SMALL_EPOCHS):
        start, cpu = time.perf_counter(), time.process_time()
        rows = epoch()
        runs.append((time.perf_counter() - start, time.process_time() - cpu))
    seconds, cpu_seconds = sorted(runs)[len(runs) // 2]  # the median epoch
    return {"rows": rows, "seconds": seconds, "cpu_seconds": cpu_seconds}


def run_case(case: str, data: Path, batch: int, steps: int) -> dict:
    """Runs in a child process; times the second of two passes (rows, seconds; steps when training).

    Only the case's own libraries are imported, so peak RSS is the case's footprint."""
    import pyarrow.parquet as pq

    from data_gen.criteo import CAT_NAMES, CONT_NAMES
    from sok_tutorial.data.schema import resolve_files

    files = resolve_files(data / "criteo")
    if case not in ("raw_decode", "decode_row_groups"):
        from sok_tutorial.data import HashBucket, ParquetLoader

    def loader(**kw):
        return ParquetLoader(data / "criteo", batch, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES,
                             fill_nan=0.0, **kw)

    from sok_tutorial.data.throughput import count_rows as count

    if case in TRAIN_CASES:
        return train(case, loader(), steps)
    if case == "raw_decode":
        names = columns()

        def one_pass() -> int:
            return sum(pq.read_table(f, columns=names).num_rows for f in files)
    elif case == "decode_row_groups":
        def one_pass() -> int:
            return decode_row_groups(files)
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
        from sok_tutorial.data.throughput import tensor_slices_dataset
        ds = tensor_slices_dataset(data / "criteo-native", batch, ["label"], cont_names=CONT_NAMES,
                                   shuffle_buffer=SHUFFLE_BUFFER)

        def one_pass() -> int:
            return count(ds)
    else:
        raise ValueError(f"unknown case {case!r}")
    one_pass()  # warm-up pass: OS file cache, allocator pools, tf.data graph tracing
    start, cpu = time.perf_counter(), time.process_time()
    rows = one_pass()
    seconds = time.perf_counter() - start
    return {"rows": rows, "seconds": seconds, "cpu_seconds": time.process_time() - cpu}


def profile(data: Path, batch: int, workload: str) -> dict:
    """CPU seconds of each loader stage over one shuffled epoch, run serially on one thread.

    The stages are the ones the loader's threads overlap: pyarrow (its own decode of each row
    group), to_numpy (our conversion of the decoded table to checked NumPy columns: NaN filling,
    label checks), concat (row groups -> one chunk), index (each chunk's permutation, cutting it
    into batches), gather (each batch's rows, permuted, from the chunks into its buffers),
    hand_over (to TensorFlow)."""
    import numpy as np

    from data_gen.criteo import CAT_NAMES, CONT_NAMES
    from sok_tutorial.data import ParquetLoader
    from sok_tutorial.data import columns as cols

    source = sorted((data / "small_files").glob("*.parquet")) if workload == "small_files" else data / "criteo"
    it = ParquetLoader(source, batch, ["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES, fill_nan=0.0)
    core = it.core
    list(core.iterate(it._to_tf, prefetch=1, epoch=0))  # warm-up: file cache, buffer pools
    stages = dict.fromkeys(["pyarrow", "to_numpy", "concat", "index", "gather", "hand_over"], 0.0)

    def clock(stage: str, fn, *args):
        start = time.process_time()
        out = fn(*args)
        stages[stage] += time.process_time() - start
        return out

    floors = {"numpy_copy": 0.0, "numpy_take": 0.0, "setup": 0.0}  # setup: not reported
    rng = np.random.default_rng(0)

    def floor(chunk) -> None:
        """Bare NumPy on the same chunk, timed apart: one sequential copy of every column (what
        any loader that hands over its own buffers pays) and one take of every column in a random
        order (what a row-level shuffle pays at the least)."""
        start = time.process_time()
        perm = rng.permutation(cols.num_rows(chunk))
        outs = [np.ones_like(column) for column in chunk.values()]  # written once: no page faults timed
        floors["setup"] += time.process_time() - start
        for name, stage in (("numpy_copy", None), ("numpy_take", perm)):
            start = time.process_time()
            for column, out in zip(chunk.values(), outs):
                if stage is None:
                    np.copyto(out, column)
                else:
                    cols._touch(column)  # as the loader's gather does
                    np.take(column, stage, out=out, mode="clip")
            floors[name] += time.process_time() - start

    def chunks():
        for plan in core.chunks(1):
            parts = []
            for seg in plan:
                clock("pyarrow", lambda s: core._handle(s.file).read_row_group(s.row_group, columns=core.names,
                                                                                 use_threads=False), seg)
                parts.append(clock("to_numpy", core.read_segment, seg, core._read_pool))  # decodes again
            chunk = clock("concat", cols.concat, parts, core._read_pool)
            floor(chunk)
            yield chunk

    gather = cols.gather  # the batch engine's gathers, clocked one by one
    cols.gather = lambda pieces, pool=None: clock("gather", gather, pieces, pool)
    try:
        rows, batches = 0, core.batches(chunks(), 1)
        while True:
            start = time.process_time()  # cutting batches: permutations and bookkeeping, less the rest
            inside, floors_inside = sum(stages.values()), sum(floors.values())
            batch_ = next(batches, None)
            stages["index"] += time.process_time() - start - (sum(stages.values()) - inside) - (
                sum(floors.values()) - floors_inside)
            if batch_ is None:
                break
            _, labels = clock("hand_over", it._to_tf, core.finish(batch_))
            rows += int(labels.shape[0])
            del batch_, labels
    finally:
        cols.gather = gather
    # read_segment's time includes pyarrow's decode (a second, warmer one: null-free columns are
    # zero-copy views, so the difference can come out a little below zero)
    stages["to_numpy"] = max(0.0, stages["to_numpy"] - stages["pyarrow"])
    return {"rows": rows, "stages": stages, "floors": floors, "threaded": threaded(it)}


def threaded(it) -> dict:
    """Where the CPU goes when the loader runs as it does for users: its own threads, shuffling,
    over SMALL_EPOCHS epochs. Each stage is clocked with its thread's CPU time (pyarrow's decode
    of a row group; the rest of reading it into checked NumPy columns; the batch gathers; the
    hand-over to TensorFlow); ``other`` is the rest of the process's CPU time (permutations,
    queues, the Python between the stages) and ``idle`` the core-seconds no thread used
    (``cores * wall - CPU``)."""
    import threading

    import pyarrow.parquet as pq

    from sok_tutorial.data import columns as cols
    from sok_tutorial.data import loader_base

    spent = dict.fromkeys(["pyarrow", "to_numpy", "gather", "hand_over"], 0.0)
    lock = threading.Lock()

    def clocked(stage: str, fn):
        def run(*args, **kwargs):
            start = time.thread_time()
            out = fn(*args, **kwargs)
            with lock:
                spent[stage] += time.thread_time() - start
            return out
        return run

    patches = [(pq.ParquetFile, "read_row_group"), (loader_base.LoaderCore, "read_segment"), (cols, "gather")]
    saved = [getattr(owner, name) for owner, name in patches]
    for (owner, name), fn, stage in zip(patches, saved, ["pyarrow", "to_numpy", "gather"]):
        setattr(owner, name, clocked(stage, fn))
    convert = clocked("hand_over", it._to_tf)
    try:
        rows, start, cpu = 0, time.perf_counter(), time.process_time()
        for _ in range(SMALL_EPOCHS):
            rows += sum(int(labels.shape[0]) for _, labels in it.core.iterate(convert, prefetch=it.prefetch))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        for (owner, name), fn in zip(patches, saved):
            setattr(owner, name, fn)
    spent["to_numpy"] -= spent["pyarrow"]  # read_segment's clock includes pyarrow's
    spent["other"] = cpu - sum(spent.values())
    spent["idle"] = (os.cpu_count() or 1) * wall - cpu
    return {"rows": rows, "seconds": wall, "cpu_seconds": cpu, "stages": spent}


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
    if case.startswith("profile/"):
        result = profile(data, batch, case.split("/", 1)[1])
    elif case.startswith("small_files/"):
        result = run_small(case, data, batch)
    else:
        result = run_case(case, data, batch, steps)
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

    def child_run(case: str) -> dict:
        out = subprocess.run([sys.executable, __file__, "--child", case, str(data), str(args.batch_size), str(steps)],
                             capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise RuntimeError(f"case {case} failed:\n{out.stderr[-3000:]}")
        return json.loads(line[0][7:])

    results: dict[str, list[dict]] = {c: [] for c in CASES + TRAIN_CASES + SMALL_CASES + PROFILES}
    for _ in range(args.repeat):
        for case in CASES + TRAIN_CASES + SMALL_CASES + PROFILES:
            results[case].append(child_run(case))

    table = []
    for workload, cases in (("default", CASES), ("small_files", SMALL_CASES)):
        rows_ = []
        for case in cases:
            rates = [r["rows"] / r["seconds"] for r in results[case]]
            rows_.append({"case": case, "rows": results[case][0]["rows"], "rows_per_s": round(_bench.median(rates)),
                          "cores_busy": round(_bench.median([r["cpu_seconds"] / r["seconds"]
                                                             for r in results[case]]), 2),
                          "peak_rss_mib": round(max(r["peak_rss_mib"] for r in results[case]))})
        raw = rows_[0]["rows_per_s"]
        native = rows_[CASES.index("tfrecord_native")]["rows_per_s"] if workload == "default" else None
        for r in rows_:
            r["vs_raw_decode"] = round(r["rows_per_s"] / raw, 3)
            if native:
                r["vs_tfrecord_native"] = round(r["rows_per_s"] / native, 1)
        table += rows_
    by = {r["case"]: r["rows_per_s"] for r in table}
    for case in TRAIN_CASES:
        rates = [r["steps"] / r["seconds"] for r in results[case]]
        table.append({"case": case, "rows": results[case][0]["rows"], "steps_per_s": round(_bench.median(rates), 3),
                      "peak_rss_mib": round(max(r["peak_rss_mib"] for r in results[case]))})
    steps_per_s = {r["case"]: r["steps_per_s"] for r in table if "steps_per_s" in r}
    goals = {"parquet_loader_vs_raw_decode": (0.8, by["parquet_loader"] / by["raw_decode"]),
             "small_files/parquet_loader_vs_raw_decode": (
                 0.8, by["small_files/parquet_loader"] / by["small_files/raw_decode"]),
             "parquet_loader_vs_tfrecord_native": (15, by["parquet_loader"] / by["tfrecord_native"]),
             "train_loader_vs_memory": (0.9, steps_per_s["train_loader"] / steps_per_s["train_memory"])}
    notes = {"batch_size": args.batch_size, "dataset_rows": rows, "native_rows": native_rows,
             "small_files": {"rows": results[SMALL_CASES[0]][0]["rows"], "files": 4, "row_groups_per_file": 4,
                             "epochs_per_process": SMALL_EPOCHS},
             "goals": {k: {"goal": g, "measured": round(m, 3)} for k, (g, m) in goals.items()},
             # how much of the loader's own decode speed survives shuffling and batching
             "parquet_loader_vs_decode_row_groups": {
                 "default": round(by["parquet_loader"] / by["decode_row_groups"], 3),
                 "small_files": round(by["small_files/parquet_loader"] / by["small_files/decode_row_groups"], 3)},
             "profile_cpu_s_per_million_rows": {}, "profile_share": {}}
    lines = []
    for workload, raw_case in (("default", "raw_decode"), ("small_files", "small_files/raw_decode")):
        runs = results[f"profile/{workload}"]
        stages = {name: _bench.median([p["stages"][name] / p["rows"] * 1e6 for p in runs])
                  for name in runs[0]["stages"]}
        total = sum(stages.values())
        floors = {name: _bench.median([p["floors"][name] / p["rows"] * 1e6 for p in runs])
                  for name in ("numpy_copy", "numpy_take")}
        # CPU seconds per million rows: the loader's stages (serial) against raw_decode's own CPU time
        raw_cpu = _bench.median([r["cpu_seconds"] / r["rows"] * 1e6 for r in results[raw_case]])
        notes["profile_cpu_s_per_million_rows"][workload] = {
            "raw_decode": round(raw_cpu, 4), **{f"loader_{name}": round(v, 4) for name, v in stages.items()},
            "loader_total": round(total, 4), **{f"floor_{name}": round(v, 4) for name, v in floors.items()}}
        notes["profile_share"][workload] = {name: round(v / total, 3) for name, v in stages.items()}
        threaded_ = {name: _bench.median([p["threaded"]["stages"][name] / p["threaded"]["rows"] * 1e6 for p in runs])
                     for name in runs[0]["threaded"]["stages"]}
        notes.setdefault("profile_threaded_core_s_per_million_rows", {})[workload] = {
            **{k: round(v, 4) for k, v in threaded_.items()}, "total": round(sum(threaded_.values()), 4),
            "raw_decode_total": round(_bench.median([(os.cpu_count() or 1) * r["seconds"] / r["rows"] * 1e6
                                                     for r in results[raw_case]]), 4)}
        # on two busy cores wall time follows CPU time: the best ratio a loader can reach when it
        # pays pyarrow's decode of the row groups and, shuffling, one permuted copy of every value
        notes.setdefault("ceiling_vs_raw_decode", {})[workload] = {
            "decode_only": round(raw_cpu / stages["pyarrow"], 3),
            "decode_and_permuted_copy": round(raw_cpu / (stages["pyarrow"] + floors["numpy_take"]), 3)}
        lines.append(f"{workload} loader stages, CPU s per million rows (serial): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in stages.items())
                     + f"; total {total:.3f} vs raw_decode {raw_cpu:.3f}; bare NumPy on the same chunks: copy "
                     f"{floors['numpy_copy']:.3f}, permuted take {floors['numpy_take']:.3f}; ceiling vs raw_decode: "
                     f"{notes['ceiling_vs_raw_decode'][workload]['decode_only']:.2f} unshuffled, "
                     f"{notes['ceiling_vs_raw_decode'][workload]['decode_and_permuted_copy']:.2f} shuffled")
        raw_total = notes["profile_threaded_core_s_per_million_rows"][workload]["raw_decode_total"]
        lines.append(f"{workload} loader in its own threads, core-seconds per million rows: "
                     + ", ".join(f"{k} {v:.3f}" for k, v in threaded_.items())
                     + f"; raw_decode {raw_total:.3f} (cores x wall)")
    _bench.report("loader", table, args.out, notes=notes)
    print("\n".join(lines))
    for name, goal in notes["goals"].items():
        verdict = "met" if goal["measured"] >= goal["goal"] else "NOT met"
        print(f"{name}: {goal['measured']:.3g} (goal {goal['goal']}) {verdict}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
