"""How fast synthetic data reaches disk: Criteo-like rows/s written to parquet (goal: >= 1M rows/s
on 2 cores), next to the two halves of that pipeline measured alone (generation without
writing, parquet encoding of pre-generated rows) and the other generators.

    python benchmarks/data_gen.py [--quick] [--out build/bench]
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

# run as a script: import packages from the repository root, not this folder (data_gen.py
# would shadow the data_gen package)
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE.parent)]
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from benchmarks import _bench  # noqa: E402
from data_gen.criteo import CriteoLike, write_criteo_parquet, write_criteo_tsv  # noqa: E402
from data_gen.criteo_tsv import preprocess_criteo  # noqa: E402
from data_gen.movielens import write_movielens  # noqa: E402
from data_gen.sok_samples import write_random_samples  # noqa: E402


def main() -> None:
    args = _bench.parser(__doc__).parse_args()
    rows = 500_000 if args.quick else 4_000_000
    sok_rows = 8_192 if args.quick else 65_536
    tsv_rows = 100_000 if args.quick else 1_000_000
    tmp = Path(tempfile.mkdtemp(prefix="bench-data-gen-"))
    model = CriteoLike(seed=0)
    blocks = [b for b in model.iter_blocks(min(rows, 1_048_576))]
    for b in blocks:
        b.pop("probability")
    tables = [pa.table(b) for b in blocks]
    pre_rows = sum(t.num_rows for t in tables)

    def criteo_parquet() -> None:
        write_criteo_parquet(tmp / "criteo", rows, seed=0, overwrite=True, progress=False)

    def generate_only() -> None:
        for _ in model.iter_blocks(rows):
            pass

    def write_only() -> None:
        with pq.ParquetWriter(tmp / "w.parquet", tables[0].schema) as w:
            for t in tables:
                w.write_table(t)

    def sok_parquet() -> None:
        write_random_samples(tmp / "sok", sok_rows, 8192, 100, 10, overwrite=True, progress=False)

    def movielens_csv() -> None:
        write_movielens(tmp / "ml", rows // 4, overwrite=True, progress=False)

    def criteo_tsv() -> None:
        write_criteo_tsv(tmp / "tsv", tsv_rows, num_files=2, overwrite=True, progress=False)

    criteo_tsv()

    def preprocess() -> None:
        preprocess_criteo(sorted((tmp / "tsv").glob("day_*")), tmp / "pp", scheduler="synchronous",
                          overwrite=True, progress=False)

    cases = {"criteo_parquet": (criteo_parquet, rows), "criteo_generate_only": (generate_only, rows),
             "parquet_write_only": (write_only, pre_rows), "sok_parquet": (sok_parquet, sok_rows),
             "movielens_csv": (movielens_csv, rows // 4), "criteo_tsv": (criteo_tsv, tsv_rows),
             "preprocess_criteo_tsv": (preprocess, tsv_rows)}
    times = _bench.interleaved({k: fn for k, (fn, _) in cases.items()}, args.repeat)
    size = sum(f.stat().st_size for f in (tmp / "criteo").glob("*.parquet"))
    table = []
    for name, (_, n) in cases.items():
        seconds = _bench.median(times[name])
        table.append({"case": name, "rows": n, "seconds": round(seconds, 3), "rows_per_s": round(n / seconds),
                      "best_rows_per_s": round(n / min(times[name]))})
    crit = next(r for r in table if r["case"] == "criteo_parquet")
    crit["mib_per_s"] = round(size / 2**20 / crit["seconds"], 1)
    goal = {"criteo_parquet_rows_per_s_goal": 1_000_000, "met": crit["rows_per_s"] >= 1_000_000}
    _bench.report("data_gen", table, args.out, notes=goal)
    print(f"criteo_parquet: {crit['rows_per_s']:,} rows/s (goal 1,000,000: {'met' if goal['met'] else 'NOT met'})")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
