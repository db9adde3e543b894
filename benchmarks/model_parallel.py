"""Model-parallel tables: step time, bytes exchanged and memory per replica for 1, 2, 4 replicas.

Cases (``sok_tutorial.examples.train_sharded``, one process per replica count, the same global
batches everywhere; N logical CPU devices where there are no GPUs):

    row / all_gather     row-wise shards (key mod N), the all_gather exchange (the default)
    row / all_reduce     row-wise shards, vectors returned by an all_reduce of masked rows
    table / all_gather   table-wise: each slot's table whole on one replica, balanced by size
    column / all_gather  column-wise: every row on every replica, ceil(dim / N) columns each
    column / all_reduce  column-wise, vectors assembled by an all_reduce of each replica's columns
    row_column / ...     a grid of row groups x column groups (4 replicas: 2 x 2; key mod 2 picks
                         the row group, each holds half the width), all_gather or all_reduce
    replicated           a full copy per replica, embedding gradients all-reduced (all-gathered)

``exchange_mib_per_step``: bytes one replica receives per step for the embedding (keys, slot
ids, positions, vectors forward, gradients backward), counted from the shapes of the collectives
the layer issues with ring algorithms (dense-layer all-reduce, equal in every case, left out).
``table_mib_per_replica``: the table plus its optimizer slots stored by one replica, measured from
the shapes of its variables (with a dynamic table's key index, replicated by column-wise tables);
``planned_mib_per_replica``: what the planner's cost model (`sok_tutorial.embedding.plan`)
estimates for the same table and placement, and ``planned_vs_measured`` their ratio (goal:
within 10%).

On this machine the N "devices" share two CPU cores, so more replicas cannot be faster: the
figures that carry over to GPUs are the memory per replica and the bytes per step.

    python benchmarks/model_parallel.py [--quick] [--out build/bench]
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE.parent)]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import _bench  # noqa: E402
from sok_tutorial.embedding.placement import exchange_bytes  # noqa: E402
from sok_tutorial.embedding.planner import TableSpec, price  # noqa: E402

CASES = {"row / all_gather": "sharding=row,exchange=all_gather", "row / all_reduce": "sharding=row,exchange=all_reduce",
         "table / all_gather": "sharding=table,exchange=all_gather",
         "column / all_gather": "sharding=column,exchange=all_gather",
         "column / all_reduce": "sharding=column,exchange=all_reduce", "replicated": "sharding=replicated",
         "row_column / all_gather": "sharding=row_column,exchange=all_gather",
         "row_column / all_reduce": "sharding=row_column,exchange=all_reduce"}
GRIDS = 4  # the fewest replicas with a grid other than row- or column-wise (2 replicas: 2 x 1, row-wise)


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0])
    args = p.parse_args()
    steps, batch, slots, vocabulary, dim = ((8, 1024, 8, 2000, 8) if args.quick else (40, 4096, 26, 20000, 16))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2, 4):
            cases = {"row / all_gather": CASES["row / all_gather"], "replicated": CASES["replicated"]} \
                if n == 1 else {k: v for k, v in CASES.items() if n >= GRIDS or not k.startswith("row_column")}
            command = [sys.executable, "-m", "sok_tutorial.examples.train_sharded", "--replicas", str(n),
                       "--steps", str(steps), "--global-batch-size", str(batch), "--slots", str(slots),
                       "--nnz", "1", "--vocabulary", str(vocabulary), "--dim", str(dim), "--optimizer", "lazyadam",
                       "--out", f"{tmp}/n{n}"]
            for spec in cases.values():
                command += ["--case", spec]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            for name, spec in cases.items():
                tag = spec.replace(",", "_").replace("=", "-")
                result = np.load(f"{tmp}/n{n}.{tag}.rank0.npz")
                step_s = float(np.median(result["step_s"][3:]))  # after tracing and warm-up
                keys = batch // n * slots
                spec_of = TableSpec("table", rows=slots * vocabulary, dim=dim, ids_per_sample=slots,
                                    optimizer="lazyadam", dynamic=True, slot_sizes=(vocabulary,) * slots)
                planned = price(spec_of, spec.split(",")[0].split("=")[1], "float32", n, batch).bytes_per_replica
                measured = int(result["bytes_per_replica"])
                rows.append({"case": name if n > 1 else ("one device" if name != "replicated" else "replicated"),
                             "replicas": n, "ms_per_step": step_s * 1e3,
                             "samples_per_s": batch / step_s,
                             "exchange_mib_per_step": exchange_bytes(name.split(" /")[0], n, keys, dim,
                                                                        spec.split("exchange=")[-1]
                                                                        if "exchange=" in spec else "all_gather")
                             / 2**20,
                             "table_mib_per_replica": measured / 2**20,
                             "planned_mib_per_replica": planned / 2**20,
                             "planned_vs_measured": planned / measured,
                             "final_loss": float(result["losses"][-1])})
    _bench.report("model_parallel", rows, args.out, notes={
        "setup": f"{slots} slots x {vocabulary:,} keys (one table of {slots * vocabulary:,} rows), dim {dim}, "
                 f"global batch {batch}, LazyAdam, {steps} steps; median step after 3",
        "devices": "logical CPU devices sharing this machine's cores: speed-up is not expected here",
        "planner": "planned_vs_measured: the planner's bytes per replica over the built layer's (goal 0.9-1.1)",
    })


if __name__ == "__main__":
    main()
