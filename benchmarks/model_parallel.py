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
ids, vectors forward, gradients backward), counted from the shapes of the collectives
the layer issues with ring algorithms (dense-layer all-reduce, equal in every case, left out).
``table_mib_per_replica``: the table plus its optimizer slots stored by one replica, measured from
the shapes of its variables (with a dynamic table's key index, replicated by column-wise tables);
``planned_mib_per_replica``: what the planner's cost model (`sok_tutorial.embedding.plan`)
estimates for the same table and placement, and ``planned_vs_measured`` their ratio (goal:
within 10%).

On this machine the N "devices" share two CPU cores, so more replicas cannot be faster: the
figures that carry over to GPUs are the memory per replica and the bytes per step.

Tables that forget (``--group forget``, also part of the default run): the same workload on 4
row shards, 4 replicated copies and one replica, each as a table without a policy that has room
(``room``), an LRU table that never fills (``lru_room``, capacity twice the rows) and an LRU table
at capacity (``lru_full``, a quarter of the rows, so it evicts every step). Samples/s amortized
over the timed steps, medians over ``--repeat`` rounds (one process per round and replica count,
the cases in turn), and each case against ``room`` of the same layout: the goal for 4 row shards
at capacity is 0.85; a replicated table's ratio against the one-replica table's is the cost of
placing every replica's keys on every copy.

    python benchmarks/model_parallel.py [--quick] [--group all|layouts|forget] [--out build/bench]
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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
FORGET_SETUP = ("{slots} slots x {vocabulary:,} Zipf(1.3) keys, dim {dim}, global batch {batch}, LazyAdam, "
                "{steps} steps; samples/s amortized over the steps after 3")
GRIDS = 4  # the fewest replicas with a grid other than row- or column-wise (2 replicas: 2 x 1, row-wise)


FORGET = {"room": "", "lru_room": "eviction_policy=lru,capacity={room}",
          "lru_full": "eviction_policy=lru,capacity={full}"}
FORGET_LAYOUTS = {"row, 4 shards": (4, "row"), "replicated, 4 copies": (4, "replicated"), "one replica": (1, "row")}
FORGET_GOAL = 0.85  # 4 row shards at capacity against the same layout with room, amortized


def forget(args: Any, workload: list[str], total_rows: int, tmp: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and goal of the ``forget`` group (module docstring)."""
    rates: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.repeat):
        for layout, (n, sharding) in FORGET_LAYOUTS.items():
            out = f"{tmp}/forget{round_}_{n}_{sharding}"
            command = [sys.executable, "-m", "sok_tutorial.examples.train_sharded", "--replicas", str(n), *workload,
                       "--out", out]
            specs = {case: ",".join(filter(None, [f"sharding={sharding}", spec.format(
                room=2 * total_rows, full=total_rows // 4)])) for case, spec in FORGET.items()}
            for spec in specs.values():
                command += ["--case", spec]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            for case, spec in specs.items():
                result = np.load(f"{out}.{spec.replace(',', '_').replace('=', '-')}.rank0.npz")
                timed = result["step_s"][3:]  # after tracing and warm-up
                rates.setdefault((layout, case), []).append(len(timed) * int(workload[workload.index(
                    "--global-batch-size") + 1]) / float(np.sum(timed)))
    rows, goal = [], {}
    for (layout, case), values in rates.items():
        rate, room = float(np.median(values)), float(np.median(rates[layout, "room"]))
        rows.append({"case": f"forget: {layout}", "table": case, "samples_per_s_amortized": round(rate),
                     "vs_room": round(rate / room, 2)})
    full = {layout: float(np.median(rates[layout, "lru_full"]) / np.median(rates[layout, "room"]))
            for layout in FORGET_LAYOUTS}
    goal["row_4_shards_lru_full_vs_room"] = {"goal": FORGET_GOAL, "measured": round(full["row, 4 shards"], 2),
                                             "met": full["row, 4 shards"] >= FORGET_GOAL}
    goal["replicated_lifecycle_vs_one_replica"] = {
        "measured": round(full["replicated, 4 copies"] / full["one replica"], 2),
        "means": "(lru_full / room) of 4 replicated copies over the same ratio on one replica"}
    return rows, goal


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0])
    p.add_argument("--group", default="all", choices=["all", "layouts", "forget"])
    args = p.parse_args()
    steps, batch, slots, vocabulary, dim = ((8, 1024, 8, 2000, 8) if args.quick else (40, 4096, 26, 20000, 16))
    workload = ["--steps", str(steps), "--global-batch-size", str(batch), "--slots", str(slots), "--nnz", "1",
                "--vocabulary", str(vocabulary), "--dim", str(dim), "--optimizer", "lazyadam"]
    rows, goals = [], {}
    if args.group in ("all", "forget"):
        with tempfile.TemporaryDirectory() as tmp:
            rows, goals = forget(args, workload, slots * vocabulary, tmp)
    if args.group == "forget":
        _bench.report("model_parallel_forget", rows, args.out, notes={"goals": goals, "setup": FORGET_SETUP.format(
            slots=slots, vocabulary=vocabulary, dim=dim, batch=batch, steps=steps)})
        return
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
        "forget_goals": goals,
        "devices": "logical CPU devices sharing this machine's cores: speed-up is not expected here",
        "planner": "planned_vs_measured: the planner's bytes per replica over the built layer's (goal 0.9-1.1)",
    })


if __name__ == "__main__":
    main()
