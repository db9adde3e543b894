"""The ``memory`` group of ``benchmarks/embedding.py``: what smaller tables cost a training step.

Workload: 26 features of 38,461 ids each folded into one 1M-id key space, dim 16, batch 8192,
one Zipf(1.1) id per feature, a Linear(416 -> 1) head, LazyAdam. Key ``rank * 26 + feature``:
ids in order of frequency (rank 0 of every feature first), as `MixedDimensionEmbedding`
expects; every case trains on the same keys.

    full        DistributedEmbedding of row ids, 1M x 16
    qr2/4/16    QREmbedding, 2, 4 and 16 collisions ("mult")
    mixed       MixedDimensionEmbedding, blocks of the 2.6k / 26k / 260k most frequent ids and the
                rest, widths by `mixed_dimensions` (alpha 0.3, block lookups counted on the batches)

Figures: the layer's bytes (weights; LazyAdam adds two slots of the tables' size), samples/s
(median over the timed steps, each case in its own process), both as ratios to ``full``.

Measured on the 2-core machine (``--quick``: one round of 6 steps, the machine otherwise idle):
QR with 2, 4 and 16 collisions takes 0.5, 0.25 and 0.0625 of the bytes at 0.97x, 1.03x and 1.15x
the full table's samples/s (two lookups and a product per key where the full table does one, on
tables that fit the caches better); mixed dimensions (widths 16, 6, 3, 3) take 0.19 of the bytes
at 0.96x. On a busy machine the same run gave 0.81x, 0.73x, 0.66x and 1.33x: single quick rounds
move by more than the differences between the cases.
"""
from __future__ import annotations

import statistics
from typing import Any

NT, DIM, BATCH = 26, 16, 8192
VOCABULARY = 38_461 * NT
BLOCKS = [2_600, 26_000, 260_000]  # first ids of each block after the first (frequency order)
WARM, STEPS = 3, 20
CASES = ("full", "qr2", "qr4", "qr16", "mixed")


def batches(n: int) -> list[tuple[Any, Any]]:
    """(keys [batch, 26] in frequency order, labels [batch, 1])."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        ranks = np.minimum(rng.zipf(1.1, size=(BATCH, NT)) - 1, VOCABULARY // NT - 1)
        keys = ranks * NT + np.arange(NT)
        out.append((keys.astype(np.int64), rng.integers(0, 2, (BATCH, 1)).astype(np.float32)))
    return out


def block_sizes() -> list[int]:
    edges = [0, *BLOCKS, VOCABULARY]
    return [b - a for a, b in zip(edges, edges[1:])]


def layer(case: str, data: list[tuple[Any, Any]]) -> Any:
    import numpy as np

    import sok_tutorial as sok
    from sok_tutorial.embedding import MixedDimensionEmbedding, QREmbedding, mixed_dimensions

    if case == "full":
        return sok.DistributedEmbedding("sum", VOCABULARY, DIM, slot_num=NT, max_nnz=1, use_hashtable=False)
    if case.startswith("qr"):
        return QREmbedding("sum", VOCABULARY, DIM, num_collisions=int(case[2:]), slot_num=NT)
    counts = np.add.reduceat(np.bincount(np.concatenate([k.ravel() for k, _ in data]), minlength=VOCABULARY),
                             [0, *BLOCKS])
    dims = mixed_dimensions(block_sizes(), DIM, 0.3, block_counts=counts)
    return MixedDimensionEmbedding("sum", block_sizes(), DIM, block_dims=dims, slot_num=NT)


def train(case: str, steps: int = STEPS) -> dict[str, Any]:
    """samples/s and bytes of one case."""
    import tensorflow as tf

    from benchmarks import _tables

    _tables.set_threads()
    import sok_tutorial as sok
    from sok_tutorial.embedding import replica_bytes

    data = [(tf.constant(k), tf.constant(y)) for k, y in batches(WARM + steps)]
    embedding = layer(case, [(k.numpy(), y) for k, y in data])
    step = _tables.train_step(embedding, sok.optimizers.LazyAdam(1e-3), data[0][0])
    rates = [BATCH / t for t in _tables.timed(step, data)[WARM:]]
    return {"samples_per_s": statistics.median(rates), "bytes": replica_bytes([embedding]),
            "widths": getattr(embedding, "block_dims", None)}


def report(results: dict[str, list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (median over rounds) with ratios to ``full``, and notes."""
    rows = []
    for case in CASES:
        runs = results[case]
        rows.append({"case": case, "bytes": runs[0]["bytes"],
                     "samples_per_s": round(statistics.median(r["samples_per_s"] for r in runs))})
    full = rows[0]
    for row in rows:
        row["bytes_vs_full"] = round(row["bytes"] / full["bytes"], 4)
        row["speed_vs_full"] = round(row["samples_per_s"] / full["samples_per_s"], 2)
    notes = {"workload": __doc__.split("\n\n")[1].replace("\n", " "), "mixed_block_sizes": block_sizes(),
             "mixed_block_dims": results["mixed"][0]["widths"]}
    return rows, notes
