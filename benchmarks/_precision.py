"""The ``precision`` group of ``benchmarks/embedding.py``: what a float16 or bfloat16 table saves
and costs.

The torchrec_shape workload (`benchmarks._tables`: 26 x 8192 Zipf(1.1) ids a step folded into
one table, dim 16) in a dynamic table (``use_hashtable=True``) of `CAPACITY` rows, stored in
float32, bfloat16 or float16 (``storage_dtype``), with SGD and Adam (slots in float32), and
bfloat16 with ``stochastic_rounding=True``. Each case runs in its own process; samples/s is the
median over the timed steps after `_tables.WARM` warm-up steps. ``bytes_per_row`` counts the
stored row alone; ``bytes_per_row_with_slots`` adds the optimizer's per-row slots.
"""
from __future__ import annotations

import statistics
from typing import Any

from benchmarks import _tables

CAPACITY = 4_000_000  # rows: more than the distinct keys of a full run
QUICK_CAPACITY = 1_500_000
# case: (storage_dtype, optimizer, stochastic_rounding)
CASES: dict[str, tuple[str, str, bool]] = {
    "float32_sgd": ("float32", "sgd", False), "bfloat16_sgd": ("bfloat16", "sgd", False),
    "float16_sgd": ("float16", "sgd", False),
    "float32_adam": ("float32", "adam", False), "bfloat16_adam": ("bfloat16", "adam", False),
    "float16_adam": ("float16", "adam", False), "bfloat16_sr_adam": ("bfloat16", "adam", True),
}


def train(case: str, steps: int, quick: bool = False) -> dict[str, Any]:
    """samples/s and bytes per row of one case."""
    import tensorflow as tf

    _tables.set_threads()
    dtype, optimizer, stochastic = CASES[case]
    capacity = QUICK_CAPACITY if quick else CAPACITY
    data = [(tf.constant(k), tf.constant(y)) for k, y in _tables.batches(_tables.WARM + steps)]
    embedding, step = _tables.model(optimizer, capacity, data[0][0], use_hashtable=True, storage_dtype=dtype,
                                    stochastic_rounding=stochastic)
    times = _tables.timed(step, data)[_tables.WARM:]
    table = embedding.table
    row = table.dim * tf.as_dtype(table.variable.dtype).size
    slot_bytes = {"sgd": 0, "adam": 2 * table.dim * 4}[optimizer]  # Adam's m | v, float32
    return {"samples_per_s": statistics.median(_tables.BATCH / t for t in times), "bytes_per_row": row,
            "bytes_per_row_with_slots": row + slot_bytes, "table_mib": capacity * row / 2**20,
            "rows_in_use": table.size}


def report(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows: medians over rounds, with ratios to the float32 table of the same optimizer."""
    def med(case: str, key: str) -> float:
        return statistics.median(r[key] for r in results[case])

    rows = []
    for case, (dtype, optimizer, stochastic) in CASES.items():
        if case not in results:
            continue
        base = f"float32_{optimizer}"
        rows.append({"case": "precision", "table": case, "storage_dtype": dtype, "optimizer": optimizer,
                     "stochastic_rounding": stochastic, "bytes_per_row": results[case][0]["bytes_per_row"],
                     "bytes_per_row_with_slots": results[case][0]["bytes_per_row_with_slots"],
                     "table_mib": round(results[case][0]["table_mib"], 1),
                     "samples_per_s": round(med(case, "samples_per_s")),
                     "memory_vs_float32": round(results[case][0]["bytes_per_row"]
                                                / results[base][0]["bytes_per_row"], 2),
                     "speed_vs_float32": round(med(case, "samples_per_s") / med(base, "samples_per_s"), 2)})
    return rows
