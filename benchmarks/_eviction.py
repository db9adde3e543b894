"""The ``eviction`` group of ``benchmarks/embedding.py``: what eviction and admission cost a step.

The torchrec_shape workload (`benchmarks._tables`: 26 x 8192 Zipf(1.1) ids a step folded into
one table, dim 16, SGD) with a drifting key stream: step ``s`` shifts every table's Zipf ranks
by ``s * DRIFT`` (`_tables.batches`), so the hot keys of a step cool off over the next ones and
stop, while keys never seen before keep arriving. Of a step's ~115k distinct keys, 50-65k are
new in the timed steps (most from Zipf's long tail, drawn once), and a run sees ~3.9M keys.

Each case is a dynamic table (``use_hashtable=True``) trained on the same batches: ``fill``
untimed steps (two thirds of the timed ones), then the timed steps; samples/s is the median
over the timed steps, and the amortized rate (samples over the timed steps' total time) counts
the steps that evict, which the median hides when fewer than half of the steps do.

    roomy             capacity 10M (the folded table), no policy: today's table
    roomy_tracked     the same with track_changes=True: change tracking alone
    lru_roomy         eviction_policy="lru" that never fills: the policy's bookkeeping alone
    lru_full          "lru" with capacity = the distinct keys of the first third of the run, so
                      it is full before the timed steps and evicts throughout them
    lfu_full          the same with "lfu"
    lru_admission     lru_full with min_count=2 (count-min sketch admission), capacity = the keys
                      seen twice in the first third of the run, so it too is full
    lru_full_f64/_f8  lru_full with evict_fraction 1/64 and 1/8 (default 1/16)
    *_adagrad         roomy and lru_full with Adagrad (slots restarted for reused rows)

The goal (from the issue): ``lru_full`` at >= 0.85x ``roomy``. Measured on the 2-core machine
(3 rounds, SGD): not met. ``roomy`` 136k samples/s; change tracking 0.94x; an LRU table that never
fills 0.89x; ``lru_full`` 0.39x (amortized 0.38x), evicting ~69k rows a step (24 of 36 steps
evict: 174 ms, the others 100 ms against roomy's 60); ``lfu_full`` 0.31x; ``lru_admission`` 0.62x;
Adagrad 0.28x. In the trace of ``lru_full`` the time goes to the key index's probe loop (keys probe
past the evicted keys' tombstones in an index up to 3/4 full, up to ~110 rounds, each concatenating
its results: the profile's ``ConcatV2``), the eviction's passes over every row's score, and a second
lookup of the step's new keys after each eviction.
"""
from __future__ import annotations

import statistics
from typing import Any

from benchmarks import _tables

DRIFT = 100  # Zipf ranks shifted per step in every table: the ~400 ids a table draws every step turn over in 4
STEPS = 36  # timed steps; `fill` = 2/3 of them before
GOAL = 0.85  # lru_full / roomy
ROOMY = _tables.ROWS_PER_TABLE * _tables.NT  # 10M rows: far more than the run's distinct keys
# case: (optimizer, capacity "roomy" | "full" | "full_admitted" (`full_capacity`), table options)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "roomy": ("sgd", "roomy", {}),
    "roomy_tracked": ("sgd", "roomy", {"track_changes": True}),
    "lru_roomy": ("sgd", "roomy", {"eviction_policy": "lru"}),
    "lru_full": ("sgd", "full", {"eviction_policy": "lru"}),
    "lfu_full": ("sgd", "full", {"eviction_policy": "lfu"}),
    "lru_admission": ("sgd", "full_admitted", {"eviction_policy": "lru", "min_count": 2}),
    "lru_full_w16": ("sgd", "full", {"eviction_policy": "lru", "bucket_capacity": 16}),
    "roomy_adagrad": ("adagrad", "roomy", {}),
    "lru_full_adagrad": ("adagrad", "full", {"eviction_policy": "lru"}),
}
PROFILED = ("roomy", "lru_full")
PROFILE_STEPS = 6


def plan(steps: int) -> tuple[int, int]:
    """(untimed fill steps, steps whose distinct keys make the capacity of a full table)."""
    fill = max(2 * steps // 3, 4)
    return fill, (fill + steps) // 3


def full_capacity(steps: int, admitted: bool = False) -> int:
    """A full table's capacity: the distinct keys of the first third of the run (`admitted`: those
    seen at least twice in it, which ``min_count=2`` lets in)."""
    import numpy as np

    first = plan(steps)[1]
    _, counts = np.unique(np.concatenate([k.ravel() for k, _ in _tables.batches(first, DRIFT)]), return_counts=True)
    return int(np.count_nonzero(counts >= (2 if admitted else 1)))


def stream(steps: int) -> dict[str, Any]:
    """Distinct and new keys per timed step, and distinct keys of the whole run."""
    import numpy as np

    fill = plan(steps)[0]
    seen, distinct, new = np.zeros(ROOMY, bool), [], []  # keys are ids < ROOMY
    for i, (keys, _) in enumerate(_tables.batches(fill + steps, DRIFT)):
        unique = np.unique(keys)
        fresh = unique[~seen[unique]]
        seen[fresh] = True
        if i >= fill:
            distinct.append(unique.size)
            new.append(fresh.size)
    return {"drift_ranks_per_step": DRIFT, "fill_steps": fill, "timed_steps": steps,
            "distinct_keys_per_step": round(float(np.mean(distinct))), "new_keys_per_step": round(float(np.mean(new))),
            "distinct_keys_in_run": int(seen.sum()), "full_capacity": full_capacity(steps),
            "full_admitted_capacity": full_capacity(steps, admitted=True), "roomy_capacity": ROOMY}


def train(case: str, steps: int = STEPS, profile: bool = False) -> dict[str, Any]:
    """One case: step times, evictions and rows placed per timed step (and a per-op profile)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)  # before anything starts TensorFlow's runtime
    optimizer, room, options = CASES[case]
    fill = plan(steps)[0]
    extra = PROFILE_STEPS if profile else 0
    data = [(tf.constant(k), tf.constant(y)) for k, y in _tables.batches(fill + steps + extra, DRIFT)]
    capacity = ROOMY if room == "roomy" else full_capacity(steps, admitted=room == "full_admitted")
    embedding, step = _tables.model(optimizer, capacity, data[0][0], use_hashtable=True, **options)
    table = embedding.table
    counters: list[tuple[int, int]] = []

    def count() -> None:  # (rows evicted so far, rows in use)
        counters.append((table.evictions, table.size))

    _tables.timed(step, data[:fill])
    count()
    times = _tables.timed(step, data[fill:fill + steps], after=count)
    evicted = [b[0] - a[0] for a, b in zip(counters, counters[1:])]
    placed = [b[1] - a[1] + e for a, b, e in zip(counters, counters[1:], evicted)]
    evicting = [t for t, e in zip(times, evicted) if e]
    other = [t for t, e in zip(times, evicted) if not e]
    result = {"samples_per_s": statistics.median(_tables.BATCH / t for t in times),
              "samples_per_s_amortized": _tables.BATCH * len(times) / sum(times), "capacity": capacity,
              "rows_in_use": table.size, "evicted_per_step": statistics.mean(evicted),
              "evicting_steps": len(evicting), "new_rows_per_step": statistics.mean(placed),
              "ms_evicting_step": statistics.median(evicting) * 1e3 if evicting else None,
              "ms_other_step": statistics.median(other) * 1e3 if other else None}
    if profile:
        ops = _tables.profile_ops(step, data[fill + steps:], top=40)
        count()
        result["profile"] = {"steps": extra, "evicted_rows": counters[-1][0] - counters[-2][0], "ops_ms": ops}
    return result


def report(results: dict[str, list[dict[str, Any]]], profiles: dict[str, Any],
           stream_stats: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and notes of the eviction group: medians over rounds, ratios to the roomy table of the
    same optimizer, and the goal on the rows of ``lru_full``."""
    def med(case: str, key: str) -> float:
        return statistics.median(r[key] for r in results[case])

    rows, goals = [], {}
    for case, (optimizer, _, options) in CASES.items():
        if case not in results:
            continue
        roomy = "roomy" if optimizer == "sgd" else f"roomy_{optimizer}"
        runs = results[case]
        row = {"case": "eviction", "table": case, "optimizer": optimizer, "capacity": runs[0]["capacity"],
               "samples_per_s": round(med(case, "samples_per_s")),
               "amortized": round(med(case, "samples_per_s_amortized")),
               "vs_roomy": round(med(case, "samples_per_s") / med(roomy, "samples_per_s"), 2),
               "vs_roomy_amortized": round(med(case, "samples_per_s_amortized")
                                           / med(roomy, "samples_per_s_amortized"), 2),
               "evicted_per_step": round(med(case, "evicted_per_step")),
               "evicting_steps": f"{runs[0]['evicting_steps']}/{stream_stats['timed_steps']}",
               "new_rows_per_step": round(med(case, "new_rows_per_step"))}
        for key in ("ms_evicting_step", "ms_other_step"):
            values = [r[key] for r in runs if r[key] is not None]
            row[key] = round(statistics.median(values), 1) if values else None
        if case in ("lru_full", "lru_full_adagrad"):
            row.update(goal=GOAL, goal_met=row["vs_roomy"] >= GOAL,
                       goal_met_amortized=row["vs_roomy_amortized"] >= GOAL)
            goals[f"{case}_vs_{roomy}"] = {"goal": GOAL, "measured": row["vs_roomy"]}
            goals[f"{case}_vs_{roomy}_amortized"] = {"goal": GOAL, "measured": row["vs_roomy_amortized"]}
        rows.append(row)
    if set(PROFILED) <= set(profiles):  # what an evicting table's steps add, op by op
        base = {(o["phase"], o["op"]): o["ms"] for o in profiles[PROFILED[0]]["ops_ms"]}
        full = {(o["phase"], o["op"]): o["ms"] for o in profiles[PROFILED[1]]["ops_ms"]}
        extra = sorted(((k, ms - base.get(k, 0.0)) for k, ms in full.items()), key=lambda x: -x[1])
        profiles["extra_ms_lru_full_over_roomy"] = [{"phase": k[0], "op": k[1], "ms": round(ms, 2)}
                                                    for k, ms in extra[:12]]
    return rows, {"workload": __doc__.split("\n\n")[1].replace("\n", " "), "stream": stream_stats, "goals": goals,
                  "profiles_ms_per_step": profiles}
