"""Embedding training cache: samples/s with the tables in a parameter server vs all in memory.

A wide & deep model (a 1-wide and a 16-wide table over the 26 Criteo-like features, MLP 256-256)
trains one pass per parquet file with sparse Adam. Cases, interleaved over --repeat rounds:

    in_memory          every table row on the device (table rows = the whole vocabulary)
    host_ps            EmbeddingTrainingCache + HostMemoryPS, device tables of ~10% of the
                       vocabulary: update, model.fit, write_back per file
    disk_ps            the same with DiskPS (RocksDB)
    *_prefetch         the same loop plus ``cache.prefetch(next keyset)`` after each update, so
                       the next pass's rows are pulled while this one trains (what cache.fit does)

samples/s counts everything a pass costs (pull, train, write-back). Per pass: ``pull_s`` and
``write_back_s`` are the seconds spent moving rows (`update`, `write_back`), ``train_s`` the
``model.fit`` call (remap included: it runs in the loader), ``other_s`` the rest of the pass
(building the loader, the prefetch call). Goals: host_ps >= 0.7x and disk_ps >= 0.5x of
in_memory.

The ``store`` rows compare the two embedded stores on the cache's access pattern: one batch
write of a pass's rows, then a random-order batch read of them (RocksDB via rocksdict, LMDB via
py-lmdb), the measurement behind choosing RocksDB for DiskPS.

    python benchmarks/training_cache.py [--quick] [--out build/bench]
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE.parent)]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks import _bench  # noqa: E402


def store_rows(n: int, width: int, repeat: int) -> list[dict]:
    """Batch write then shuffled batch read of n rows, RocksDB vs LMDB."""
    import lmdb

    from sok_tutorial.cache import DiskPS

    rng = np.random.default_rng(0)
    keys = rng.choice(np.int64(10) ** 12, n, replace=False).astype(np.int64)
    rows = rng.random((n, width), dtype=np.float32)
    order = rng.permutation(n)
    out = []
    for _ in range(repeat):
        root = Path(tempfile.mkdtemp())
        try:
            ps = DiskPS(root / "rocks")
            ps.ensure_table("t", width)
            t0 = time.perf_counter()
            ps.push("t", keys, rows)
            t1 = time.perf_counter()
            got, found = ps.pull("t", keys[order])
            t2 = time.perf_counter()
            assert found.all() and np.array_equal(got, rows[order])
            ps.close()
            env = lmdb.open(str(root / "lmdb"), map_size=4 * n * width * 4 + (1 << 26), sync=True)
            records = [(k, v) for k, v in zip((b"t\x00\x00" + keys[i:i + 1].astype(">i8").tobytes()
                                               for i in range(n)), (rows[i].tobytes() for i in range(n)))]
            t3 = time.perf_counter()
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(records)
            t4 = time.perf_counter()
            wanted = [records[i][0] for i in order]
            with env.begin() as txn:
                values = txn.cursor().getmulti(wanted)
                got = np.frombuffer(b"".join(v for _, v in values), np.float32).reshape(n, width)
            t5 = time.perf_counter()
            assert np.array_equal(got, rows[order])
            env.close()
            out.append({"rocksdb": (t1 - t0, t2 - t1), "lmdb": (t4 - t3, t5 - t4)})
        finally:
            shutil.rmtree(root, ignore_errors=True)
    result = []
    for store in ("rocksdb", "lmdb"):
        write = _bench.median([o[store][0] for o in out])
        read = _bench.median([o[store][1] for o in out])
        result.append({"case": f"store_{store}", "rows": n, "width": width, "write_rows_per_s": n / write,
                       "read_rows_per_s": n / read})
    return result


def main() -> None:
    args = _bench.parser(__doc__.splitlines()[0]).parse_args()
    import keras
    import tensorflow as tf

    import sok_tutorial as sok
    from data_gen.criteo import CAT_NAMES, scaled_cardinalities, write_criteo_parquet
    from sok_tutorial.cache import DiskPS, EmbeddingTrainingCache, HostMemoryPS
    from sok_tutorial.data import ParquetLoader
    from sok_tutorial.data.keyset import keyset_path, read_keyset
    from sok_tutorial.data.schema import Schema
    from sok_tutorial.data.transforms import Transform

    files_n, rows_per_file = (3, 20_000) if args.quick else (6, 50_000)
    cards = scaled_cardinalities(0.02 if args.quick else 0.1)
    vocab, batch = sum(cards), 1024
    work = Path(args.out) / "training_cache_data"
    data = write_criteo_parquet(work / "criteo", files_n * rows_per_file, cardinalities=cards, num_parts=files_n,
                                keysets=True, reuse=True, overwrite=True, progress=False)
    schema = Schema.load(work / "criteo")
    offsets = {c.name: c.key_offset for c in schema.columns if c.name in CAT_NAMES}
    files = sorted((work / "criteo").glob("*.parquet"))
    keysets = [read_keyset(keyset_path(f)) for f in files]
    capacity = max(max(len(k) for k in keysets), vocab // 10)
    print(f"{data.num_rows:,} rows in {files_n} files; vocabulary {vocab:,}; keysets "
          f"{min(map(len, keysets)):,}..{max(map(len, keysets)):,} keys; device capacity {capacity:,} rows "
          f"({capacity / vocab:.1%} of the vocabulary)")

    class AddOffsets(Transform):
        def __init__(self):
            super().__init__(list(offsets))

        def transform(self, values, column):
            return values + offsets[column]

    def build(rows: int) -> keras.Model:
        keras.utils.set_random_seed(0)
        cat = keras.Input((26,), dtype="int64", name="categorical")
        deep = sok.DistributedEmbedding("sum", rows, 16, slot_num=26, max_nnz=1, use_hashtable=False, name="deep")(cat)
        wide = sok.DistributedEmbedding("sum", rows, 1, slot_num=26, max_nnz=1, use_hashtable=False, name="wide")(cat)
        x = keras.layers.Flatten()(deep)
        for i in range(2):
            x = keras.layers.Dense(256, activation="relu", name=f"mlp_{i}")(x)
        logit = keras.layers.Add()([keras.layers.Dense(1, name="out")(x), keras.ops.sum(wide, axis=1)])
        model = keras.Model({"categorical": cat}, logit)
        model.compile(sok.optimizers.Adam(0.001), keras.losses.BinaryCrossentropy(from_logits=True))
        model({"categorical": tf.zeros([1, 26], tf.int64)})
        return model

    def loader(f, transform):
        return ParquetLoader([f], batch, ["label"], cat_names=CAT_NAMES, concat_categorical=True, seed=0,
                             transforms=[transform])

    def run(case: str) -> dict:
        model = build(vocab if case == "in_memory" else capacity)
        tmp = Path(tempfile.mkdtemp())
        ps = None if case == "in_memory" else HostMemoryPS() if case.startswith("host") else DiskPS(tmp / "ps")
        cache = None if ps is None else EmbeddingTrainingCache(model, ps, device_capacity_rows=capacity)
        if cache is None:  # warm up (trace the step) on a few batches, the same for every case
            model.fit(loader(files[0], AddOffsets()), steps_per_epoch=5, verbose=0)
        else:
            cache.update(keyset_path(files[0]))
            model.fit(loader(files[0], cache.transform(offsets)), steps_per_epoch=5, verbose=0)
            cache.discard()
            cache.history.clear()
        train_s = 0.0
        start = time.perf_counter()
        for i, f in enumerate(files):
            if cache is None:
                batches = loader(f, AddOffsets())
            else:
                cache.update(keyset_path(f))
                if case.endswith("_prefetch") and i + 1 < len(files):
                    cache.prefetch(keyset_path(files[i + 1]))
                batches = loader(f, cache.transform(offsets))
            tick = time.perf_counter()
            model.fit(batches, verbose=0)
            train_s += time.perf_counter() - tick
            if cache is not None:
                cache.write_back()
        seconds = time.perf_counter() - start
        passes = cache.history if cache else []
        if ps is not None:
            ps.close()
        shutil.rmtree(tmp, ignore_errors=True)
        pull_s = sum(p["pull_s"] for p in passes) / len(files)
        write_back_s = sum(p["write_back_s"] for p in passes) / len(files)
        train_s /= len(files)
        return {"seconds": seconds, "pull_s": pull_s, "write_back_s": write_back_s, "train_s": train_s,
                "other_s": seconds / len(files) - pull_s - write_back_s - train_s}

    cases = ["in_memory", "host_ps", "disk_ps", "host_ps_prefetch", "disk_ps_prefetch"]
    goals = {"host_ps": ">= 0.7", "disk_ps": ">= 0.5"}
    results: dict[str, list[dict]] = {c: [] for c in cases}
    for _ in range(args.repeat):
        for case in cases:
            results[case].append(run(case))
    samples = data.num_rows
    base = samples / _bench.median([r["seconds"] for r in results["in_memory"]])
    rows = []
    for case in cases:
        rate = samples / _bench.median([r["seconds"] for r in results[case]])
        rows.append({"case": case, "device_rows": vocab if case == "in_memory" else capacity, "samples_per_s": rate,
                     "vs_in_memory": rate / base,
                     **{f"{k}_per_pass": _bench.median([r[k] for r in results[case]])
                        for k in ("pull_s", "write_back_s", "train_s", "other_s")},
                     "goal": goals.get(case, "")})
    rows += store_rows(max(map(len, keysets)), 16 + 2 * 16, args.repeat)  # a deep row: vector | m | v
    _bench.report("training_cache", rows, args.out, notes={
        "files": files_n, "rows_per_file": rows_per_file, "vocabulary": vocab, "device_capacity_rows": capacity,
        "batch_size": batch, "mean_keyset": float(np.mean([len(k) for k in keysets]))})


if __name__ == "__main__":
    main()
