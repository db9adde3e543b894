"""The ``eviction`` group of ``benchmarks/embedding.py``: what eviction and admission cost a step.

The torchrec_shape workload (`benchmarks._tables`: 26 x 8192 Zipf(1.1) ids a step folded into
one table, dim 16, SGD) with a drifting key stream: step ``s`` shifts every table's Zipf ranks
by ``s * DRIFT`` (`_tables.batches`), so the hot keys of a step cool off over the next ones and
stop, while keys never seen before keep arriving. Of a step's ~115k distinct keys, 50-65k are
new in the timed steps (most from Zipf's long tail, drawn once), and a run sees ~3.9M keys.

Each case is a dynamic table (``use_hashtable=True``) trained on the same batches: ``fill``
untimed steps (two thirds of the timed ones), then the timed steps; samples/s is the median
over the timed steps, and the amortized rate (samples over the timed steps' total time) is the
figure the goals use. Cores busy: the process's CPU time over the wall time of the timed steps.

    roomy             capacity 10M (the folded table), no policy: the table that never forgets
    roomy_tracked     the same with track_changes=True: change tracking alone
    lru_roomy         eviction_policy="lru" that never fills: the bucketed index's bookkeeping alone
    lru_full          "lru" with capacity = the distinct keys of the first third of the run, so
                      it is full before the timed steps and evicts throughout them
    lfu_full          the same with "lfu"
    lru_admission     lru_full with min_count=2 (count-min sketch admission), capacity = the keys
                      seen twice in the first third of the run, so it too is full
    lru_full_w16      lru_full with buckets of 16 rows (bucket_capacity=16; default 8)
    *_adagrad         roomy and lru_full with Adagrad (slots restarted for reused rows)

and two bounds, which are not tables: ``lru_full`` and ``lru_roomy`` with the choice of each new
key's row made free (`free_choice`): what their steps would cost if finding the lowest-scored row
of each new key's bucket, and a distinct one for new keys of one bucket, cost nothing. The rest of
the step stays: the lookup, the touch, the writes of the taken buckets' keys and marks, the log.

Besides speed: ``hit_rates`` replays the stream through an LRU table and an exact LRU cache of
the same capacity (`sok_tutorial.embedding.hit_rate`), for buckets of 8 and 16, on this stream
and on a stationary Zipf stream, and an LRU table with ``min_count=2`` beside one that admits every
key at the admitted capacity (what admission leaves the recurring keys); ``deltas`` times
`export_delta` against a full export of the ``lru_full`` table after 1, 3 and 6 steps past a mark
(three churn levels).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks import _tables
from benchmarks._bench import page_faults

DRIFT = 100  # Zipf ranks shifted per step in every table: the ~400 ids a table draws every step turn over in 4
STEPS = 36  # timed steps; `fill` = 2/3 of them before
GOALS = {"lru_full": 0.85, "lfu_full": 0.8, "lru_admission": 0.8, "lru_roomy": 0.97,
         "lru_full_adagrad": 0.8}  # amortized samples/s against the roomy table of the same optimizer
HIT_RATE_GAP = 0.01  # bucket-local LRU within one percentage point of exact LRU
TWIN_SLACK = 0.03  # roomy_tracked does the roomy table's work and more: faster by more than this, roomy ran slow
WITHIN_RUN = (("lfu_full", "lru_full"), ("lru_full_w16", "lru_full"))  # (case, the case it is set against)
INDEX_BYTES = 12  # per row, the bucketed index of an "lru" table
CHURN_STEPS = (1, 3, 6)  # steps trained past the mark before each delta (the log holds ~8 steps of evictions)
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
#: bound: the case whose table it is, with the choice of rows made free (`free_choice`)
BOUNDS = {"lru_full_free_choice": "lru_full", "lru_roomy_free_choice": "lru_roomy"}
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


def free_choice(index: Any) -> None:
    """Make the `sok_tutorial.embedding.buckets.BucketedIndex` `index` place a step's new keys with
    the choice of their rows made free, for the bounds (`BOUNDS`): each takes the first empty row of
    its bucket as the lookup read it, or else the row that bits 7-9 of its key name, whatever that
    row holds (even a key of this step), without scores, grouping or ranks. Everything else a
    training lookup does stays: the lookup of the bucket, the touch of the hits, the write of each
    taken bucket's keys (built from the row the lookup read, one per new key, so of two new keys of
    one bucket one is lost, and comes back as new) and of the taken rows' marks."""
    import tensorflow as tf

    from sok_tutorial.embedding.bucket_search import nth_true
    from sok_tutorial.embedding.buckets import Placed
    from sok_tutorial.embedding.ops import masked, take, tf_variable, updated

    width = index.width

    def place(keys: tf.Tensor, counts: tf.Tensor | None, now: tf.Tensor, admit: Any = None) -> Placed:
        bucket, held_keys, row, held, _ = index._find(keys, now)
        stamp = tf.cast(now, index.mark_dtype)
        hits = take(row, tf.where(held)[:, 0])
        touched = tf_variable(index.marks).scatter_update(tf.IndexedSlices(tf.fill(tf.shape(hits), stamp), hits))
        new = tf.where(~held)[:, 0]
        new_keys, new_bucket = take(keys, new), take(bucket, new)
        new_held, empty_key = take(held_keys, new), index._empty_key(new_bucket)
        empty = nth_true(tf.equal(new_held, empty_key[:, None]), tf.zeros(tf.shape(new), tf.int32))
        position = tf.where(empty >= 0, tf.cast(empty, tf.int64),
                            tf.bitwise.bitwise_and(tf.bitwise.right_shift(new_keys, 7), width - 1))
        taken, at = new_bucket * width + position, tf.range(tf.size(new, out_type=tf.int64)) * width + position
        new_held = tf.reshape(new_held, [-1])
        before = take(new_held, at)
        evicted = masked(before, tf.not_equal(before, empty_key))  # (a row that held no key evicts none)
        with tf.control_dependencies([touched]):
            rows = tf.reshape(updated(new_held, at, new_keys), [-1, width])
            tf_variable(index.keys).scatter_update(tf.IndexedSlices(rows, new_bucket))
            tf_variable(index.marks).scatter_update(tf.IndexedSlices(tf.fill(tf.shape(taken), stamp), taken))
        return Placed(updated(tf.where(held, row, -1), new, taken), new_keys, taken, evicted,
                      tf.constant(0, tf.int64))

    index.place = place


def train(case: str, steps: int = STEPS, profile: bool = False) -> dict[str, Any]:
    """One case or bound (`BOUNDS`): step times, evictions and rows placed per timed step (and a
    per-op profile)."""
    import tensorflow as tf

    _tables.set_threads(profile)
    optimizer, room, options = CASES[BOUNDS.get(case, case)]
    fill = plan(steps)[0]
    extra = PROFILE_STEPS if profile else 0
    data = [(tf.constant(k), tf.constant(y)) for k, y in _tables.batches(fill + steps + extra, DRIFT)]
    capacity = ROOMY if room == "roomy" else full_capacity(steps, admitted=room == "full_admitted")
    embedding, step = _tables.model(optimizer, capacity, data[0][0], use_hashtable=True, **options)
    table = embedding.table
    if case in BOUNDS:  # (the step is traced at its first call, below: it places keys the free way)
        free_choice(table.buckets)
    counters: list[tuple[int, int]] = []

    def count() -> None:  # (rows evicted so far, keys left without a row so far): two scalars
        counters.append((table.evictions, table.unplaced))

    # The rows in use are counted before and after the timed steps only: counting them means reading
    # every row's mark (and key), tens of MiB that would push the next step's rows out of the caches.
    _tables.timed(step, data[:fill])
    count()
    size_before, faults = table.size, page_faults()
    cpu, wall = time.process_time(), time.perf_counter()
    times = _tables.timed(step, data[fill:fill + steps], after=count)
    busy = (time.process_time() - cpu) / (time.perf_counter() - wall)  # every thread of the process
    faults = (page_faults() - faults) / steps
    evicted = [b[0] - a[0] for a, b in zip(counters, counters[1:])]
    placed = (table.size - size_before + sum(evicted)) / steps  # rows given to new keys, a step
    evicting = [t for t, e in zip(times, evicted) if e]
    other = [t for t, e in zip(times, evicted) if not e]
    result = {"samples_per_s": statistics.median(_tables.BATCH / t for t in times),
              "samples_per_s_amortized": _tables.BATCH * len(times) / sum(times), "capacity": capacity,
              "rows_in_use": table.size, "evicted_per_step": statistics.mean(evicted),
              "evicting_steps": len(evicting), "new_rows_per_step": placed,
              "ms_evicting_step": statistics.median(evicting) * 1e3 if evicting else None,
              "ms_other_step": statistics.median(other) * 1e3 if other else None,
              "unplaced_per_step": (counters[-1][1] - counters[0][1]) / steps,
              "index_bytes_per_row": table.index_bytes_per_row, "page_faults_per_step": faults,
              "cores_busy": busy}
    if profile:
        ops = _tables.profile_ops(step, data[fill + steps:], top=40)
        count()
        result["profile"] = {"steps": extra, "evicted_rows": counters[-1][0] - counters[-2][0], "ops_ms": ops}
    return result


def report(results: dict[str, list[dict[str, Any]]], profiles: dict[str, Any], stream_stats: dict[str, Any],
           hits: dict[str, Any] | None = None,
           deltas: list[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and notes of the eviction group: medians over rounds, ratios to the roomy table of the
    same optimizer, the goals, hit rates against exact LRU and delta exports. ``roomy_check`` says
    whether the roomy table, every SGD ratio's denominator, ran slower than its tracked twin by more
    than `TWIN_SLACK` (amortized): the twin does the same work and more, so such a run's ratios
    read high. ``within_run`` sets the tables that differ from LRU at capacity by one option
    against it (`WITHIN_RUN`, amortized): ratios that need no roomy table, flagged or not."""
    def med(case: str, key: str) -> float:
        return statistics.median(r[key] for r in results[case])

    rows, goals, bounds = [], {}, {}
    amortized: dict[str, float] = {}  # case -> its ratio to the roomy table (the tables come before their bounds)
    for case in (*CASES, *BOUNDS):
        if case not in results:
            continue
        optimizer = CASES[BOUNDS.get(case, case)][0]
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
               "new_rows_per_step": round(med(case, "new_rows_per_step")),
               "cores_busy": round(med(case, "cores_busy"), 2)}
        for key in ("ms_evicting_step", "ms_other_step"):
            values = [r[key] for r in runs if r[key] is not None]
            row[key] = round(statistics.median(values), 1) if values else None
        row["unplaced_per_step"] = round(med(case, "unplaced_per_step"), 1)
        row["index_bytes_per_row"] = runs[0]["index_bytes_per_row"]
        amortized[case] = row["vs_roomy_amortized"]
        if case in BOUNDS:  # (not a table: what its table's step would be with the choice of rows free)
            row["bound_of"] = BOUNDS[case]
            bounds[case] = {"vs_roomy_amortized": row["vs_roomy_amortized"], "goal_of_its_table":
                            GOALS.get(BOUNDS[case])}
            if BOUNDS[case] in amortized:
                bounds[case]["its_table_vs_roomy_amortized"] = amortized[BOUNDS[case]]
        if case in GOALS:
            row.update(goal=GOALS[case], goal_met=row["vs_roomy_amortized"] >= GOALS[case])
            goals[f"{case}_vs_{roomy}_amortized"] = {"goal": GOALS[case], "measured": row["vs_roomy_amortized"],
                                                     "met": row["goal_met"]}
        rows.append(row)
    if set(PROFILED) <= set(profiles):  # what an evicting table's steps add, op by op
        base = {(o["phase"], o["op"]): o["ms"] for o in profiles[PROFILED[0]]["ops_ms"]}
        full = {(o["phase"], o["op"]): o["ms"] for o in profiles[PROFILED[1]]["ops_ms"]}
        extra = sorted(((k, ms - base.get(k, 0.0)) for k, ms in full.items()), key=lambda x: -x[1])
        profiles["extra_ms_lru_full_over_roomy"] = [{"phase": k[0], "op": k[1], "ms": round(ms, 2)}
                                                    for k, ms in extra[:12]]
    checks = {}
    if {"roomy", "roomy_tracked"} <= set(results):  # every ratio's denominator, against a twin that must not beat it
        twin = med("roomy_tracked", "samples_per_s_amortized") / med("roomy", "samples_per_s_amortized")
        checks = {"tracked_vs_roomy_amortized": round(twin, 2), "roomy_ran_slow": twin > 1 + TWIN_SLACK}
    within = {f"{case}_vs_{base}_amortized": round(med(case, "samples_per_s_amortized")
                                                   / med(base, "samples_per_s_amortized"), 2)
              for case, base in WITHIN_RUN if {case, base} <= set(results)}
    if "lru_full" in results:
        measured = results["lru_full"][0]["index_bytes_per_row"]
        goals["index_bytes_per_row_lru"] = {"goal": INDEX_BYTES, "measured": measured, "met": measured <= INDEX_BYTES}
    for name, rates in (hits or {}).items():
        if name == "admission":  # (LRU with and without min_count, not against exact LRU)
            rows.append({"case": "hit_rate", "table": f"lru_min_count_{rates['min_count']}",
                         "capacity": rates["capacity"], "admitted": round(rates["admitted"], 4),
                         "every_key": round(rates["every_key"], 4)})
            continue
        gap = round(rates["bucketed"] - rates["exact"], 4)
        rows.append({"case": "hit_rate", "table": name, "capacity": rates["capacity"],
                     "bucketed": round(rates["bucketed"], 4), "exact_lru": round(rates["exact"], 4), "gap": gap,
                     "goal_met": abs(gap) <= HIT_RATE_GAP})
        goals[f"hit_rate_gap_{name}"] = {"goal": HIT_RATE_GAP, "measured": gap, "met": abs(gap) <= HIT_RATE_GAP}
    for d in deltas or []:
        rows.append({"case": "delta", "table": f"lru_full +{d['steps']} steps", **{k: v for k, v in d.items()
                                                                                   if k != "steps"}})
    return rows, {"workload": __doc__.split("\n\n")[1].replace("\n", " "), "stream": stream_stats, "goals": goals,
                  "bounds": bounds, "roomy_check": checks, "within_run": within, "profiles_ms_per_step": profiles}


def hit_rates(steps: int = STEPS) -> dict[str, Any]:
    """Hit rates of bucket-local LRU against exact LRU, with buckets of 8 and 16: this stream at the
    full capacity, and a stationary Zipf stream (no drift) at half its distinct keys; and of LRU with
    and without ``min_count=2`` at the admitted capacity on this stream (``admission``)."""
    import numpy as np

    _tables.set_threads()
    from sok_tutorial.embedding.hit_rate import admission_hit_rates, lru_hit_rates

    fill = plan(steps)[0]
    drifting = [k for k, _ in _tables.batches(fill + steps, DRIFT)]
    capacity = full_capacity(steps)
    out = {f"drifting_w{w}": lru_hit_rates(drifting, capacity, w, skip=fill) for w in (8, 16)}
    still = [k for k, _ in _tables.batches(fill + steps)]
    half = len(np.unique(np.concatenate([k.ravel() for k in still]))) // 2
    out.update({f"zipf_w{w}": lru_hit_rates(still, half, w, skip=fill) for w in (8, 16)})
    out["admission"] = admission_hit_rates(drifting, full_capacity(steps, admitted=True), skip=fill)
    return out


def deltas(steps: int = STEPS) -> list[dict[str, Any]]:
    """Delta export against full export of the ``lru_full`` table: train the fill steps, export in
    full (the mark), then after 1, 3 and 6 more steps a delta since the mark and a full export."""
    import tempfile
    import time
    from pathlib import Path

    import tensorflow as tf

    _tables.set_threads()
    from sok_tutorial.data.describe import disk_bytes
    from sok_tutorial.embedding import lifecycle
    from sok_tutorial.training import export_delta, export_model_tables

    fill = plan(steps)[0]
    data = [(tf.constant(k), tf.constant(y)) for k, y in _tables.batches(fill + CHURN_STEPS[-1], DRIFT)]
    embedding, step = _tables.model("sgd", full_capacity(steps), data[0][0], use_hashtable=True,
                                    eviction_policy="lru")
    table = embedding.table
    _tables.timed(step, data[:fill])
    work = Path(tempfile.mkdtemp())

    def export(kind: str, since: Path | None = None) -> tuple[Path, float]:
        start = time.perf_counter()
        path = export_model_tables(embedding, work / kind, overwrite=True) if since is None else \
            export_delta(embedding, work / kind, since=since, overwrite=True)
        return path, time.perf_counter() - start

    base, _ = export("base")
    since, evictions, done, out = lifecycle.mark(table), table.evictions, 0, []
    for churn in CHURN_STEPS:
        _tables.timed(step, data[fill + done:fill + churn])
        done = churn
        delta, delta_s = export("delta", since=base)
        full, full_s = export("full")
        changed = len(lifecycle.changed_since(table, since))
        delta_bytes, full_bytes = disk_bytes(delta), disk_bytes(full)
        out.append({"steps": churn, "rows_changed": changed, "changed_share": round(changed / table.size, 3),
                    "evicted": table.evictions - evictions, "delta_mib": round(delta_bytes / 2**20, 2),
                    "full_mib": round(full_bytes / 2**20, 2), "delta_s": round(delta_s, 3),
                    "full_s": round(full_s, 3), "bytes_vs_full": round(delta_bytes / full_bytes, 3),
                    "time_vs_full": round(delta_s / full_s, 3)})
    return out

