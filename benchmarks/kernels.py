"""The array kernels under the loader, the parameter servers and the training cache, each on its
NumPy specification and, where CuPy sees a GPU, on the GPU: milliseconds per call and the speedup.

Cases, at sizes the project meets (a Criteo-like batch's keys, a pass of the training cache):

    hash_bucket           the HashBucket transform: 26 columns x 65,536 keys hashed into 2**24 buckets
    key_index_sparse      KeyIndex.lookup of 1M values (half of them present) in 1M keys spread over int64
    key_index_dense       the same over 1M keys in [0, 3M): the dense lookup table's path
    unique                unique + inverse + counts of 1.7M Zipf keys (26 x 65,536)
    gather_rows           220k rows of a 4M x 16 float32 table (a pass's rows out of the parameter server)
    scatter_add_rows      the same rows added back, duplicates accumulating
    ragged_take           a shuffled 65,536-row batch out of 1M rows of a list column (0-9 values a row)

Each case runs its inputs on both sides in the same process, interleaved (median of --repeat
rounds after a warm-up). The GPU side is synchronised before its clock stops, its inputs are
already on the device (the copy in is not counted), and its first output is checked equal to
NumPy's (``same_result``).
Without a GPU the NumPy column alone is reported.

    python benchmarks/kernels.py [--quick] [--repeat 5] [--out build/bench]
"""
from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE.parent)]

import numpy as np  # noqa: E402

from benchmarks import _bench  # noqa: E402
from kernels import backend, ragged, rows  # noqa: E402
from kernels.hash_bucket import hash_bucket  # noqa: E402
from kernels.key_index import KeyIndex  # noqa: E402
from kernels.unique import unique  # noqa: E402


def _cases(scale: int) -> dict:
    """{case: (function(xp, inputs) -> outputs, inputs as NumPy arrays)}; `scale` divides the sizes."""
    rng = np.random.default_rng(0)
    batch_keys = _bench.draw_keys(rng, 10_000_000 // scale, (26 * 65_536 // scale,), "zipf").astype(np.int64)
    n = 1_000_000 // scale
    sparse = np.unique(rng.integers(-(2**62), 2**62, n))
    dense = np.unique(rng.integers(0, 3 * n, n))

    def probe(keys):
        return np.concatenate([rng.choice(keys, n // 2), rng.integers(keys.min(), keys.max(), n - n // 2)])

    table = rng.standard_normal((4_000_000 // scale, 16), dtype=np.float32)
    picked = rng.integers(0, len(table), 220_000 // scale)
    lengths = rng.integers(0, 10, n)
    offsets = ragged.lengths_to_offsets(lengths)
    values = rng.integers(0, 1 << 40, int(offsets[-1]))

    built: dict = {}

    def index_lookup(xp, keys, ids, probe):  # the index is built (and its dense table filled) once per side
        if id(keys) not in built:  # (each side holds its own copy of the keys for the whole run)
            built[id(keys)] = KeyIndex(keys, ids)
            built[id(keys)].lookup(probe[:1])
        return built[id(keys)].lookup(probe)

    def scatter_add(xp, table, picked, updates):  # in place: both sides make the same number of calls
        rows.scatter_add_rows(table, picked, updates)
        return table[picked]

    return {
        "hash_bucket": (lambda xp, k: hash_bucket(k, 1 << 24), (batch_keys,)),
        "key_index_sparse": (index_lookup, (sparse, np.arange(len(sparse)), probe(sparse))),
        "key_index_dense": (index_lookup, (dense, np.arange(len(dense)), probe(dense))),
        "unique": (lambda xp, k: unique(k), (batch_keys,)),
        "gather_rows": (lambda xp, t, r: rows.gather_rows(t, r), (table, picked)),
        "scatter_add_rows": (scatter_add, (table, picked, np.ones((len(picked), 16), np.float32))),
        "ragged_take": (lambda xp, v, o, p: ragged.take(v, o, p),
                        (values, offsets, rng.permutation(n)[:65_536 // scale])),
    }


def _equal(cpu, gpu) -> bool:
    if isinstance(cpu, tuple):
        return all(_equal(a, b) for a, b in zip(cpu, gpu))
    return bool(np.array_equal(cpu, backend.cupy.asnumpy(gpu)))


def main() -> None:
    args = _bench.parser(__doc__.splitlines()[0]).parse_args()
    scale = 16 if args.quick else 1
    cupy = backend.cupy
    out_rows = []
    for name, (fn, inputs) in _cases(scale).items():
        sides = {"numpy": lambda fn=fn, inputs=inputs: fn(np, *inputs)}
        if cupy is not None:
            dev = tuple(cupy.asarray(a) for a in inputs)

            def on_gpu(fn=fn, dev=dev):
                result = fn(cupy, *dev)
                cupy.cuda.Device().synchronize()
                return result
            sides["cupy"] = on_gpu
        same = _equal(sides["numpy"](), sides["cupy"]()) if cupy is not None else None
        times = _bench.interleaved(sides, args.repeat)
        row = {"case": name, "numpy_ms": 1e3 * _bench.median(times["numpy"])}
        if cupy is not None:
            row["cupy_ms"] = 1e3 * _bench.median(times["cupy"])
            row["speedup"] = row["numpy_ms"] / row["cupy_ms"]
            row["same_result"] = same
        out_rows.append(row)
    _bench.report("kernels", out_rows, args.out, notes={"scale": f"1/{scale}", "repeat": args.repeat})


if __name__ == "__main__":
    main()
