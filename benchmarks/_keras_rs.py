"""The ``keras_rs`` group of ``benchmarks/embedding.py``: coming from Keras-RS, what our layer
built from the same configuration gains on CPU.

26 features, each looking up its own table (``keras_rs.layers.TableConfig``, dim 16, combiner
sum, ``optimizer=keras.optimizers.Adam(1e-3)``) of 100k or 400k rows, one Criteo-like (Zipf) id
per feature and sample, batch 8192, the activations concatenated into Dense(1), binary
cross-entropy. ``ours``: `sok_tutorial.embedding.keras_rs.from_keras_rs` of that configuration,
trained by ``sok_tutorial.optimizers.Adam``, which hands each table to its own (sparse) Adam;
``ours_fused``: the same built with ``fused=True``, each table's Adam applied in the backward pass
(what lets a model compile with a Keras optimizer; not a goal, its cost); ``keras_rs``:
``keras_rs.layers.DistributedEmbedding`` (TensorFlow backend, CPU, its default-device path), whose
tables Keras' Adam updates densely, as ``model.compile``'s optimizer does there. One training step
= lookups, loss, backward, optimizer, in a ``tf.function``; each case in its own process,
samples/s over `STEPS` steps after 2 warm-up steps, the median over interleaved rounds.
"""
from __future__ import annotations

import statistics
from typing import Any

FEATURES, DIM, BATCH = 26, 16, 8192
ROWS = (100_000, 400_000)
CASES = ("ours", "ours_fused", "keras_rs")
STEPS = 10
GOALS = {100_000: 3.0, 400_000: 10.0}  # ours / keras_rs


def train(case: str, rows: int, steps: int) -> dict[str, Any]:
    """samples/s of one case at `rows` rows per table."""
    import keras
    import keras_rs
    import numpy as np
    import tensorflow as tf

    import sok_tutorial as sok
    from benchmarks._bench import draw_keys, seconds_per_step

    names = [f"f{i:02d}" for i in range(FEATURES)]
    configs = {name: keras_rs.layers.FeatureConfig(
        name, keras_rs.layers.TableConfig(f"t{name}", rows, DIM, optimizer=keras.optimizers.Adam(1e-3),
                                          combiner="sum"), (BATCH,), (BATCH, DIM)) for name in names}
    if case.startswith("ours"):
        embedding, optimizer = sok.from_keras_rs(configs, fused=case == "ours_fused"), sok.optimizers.Adam(1e-3)
    else:
        embedding, optimizer = keras_rs.layers.DistributedEmbedding(configs), keras.optimizers.Adam(1e-3)
    head, loss_fn = keras.layers.Dense(1), keras.losses.BinaryCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(4):
        keys = draw_keys(rng, rows, (BATCH, FEATURES), "criteo_like")
        batches.append(({n: tf.constant(keys[:, i]) for i, n in enumerate(names)},
                        tf.constant(rng.integers(0, 2, (BATCH, 1)).astype("float32"))))

    def forward(ids: dict, training: bool) -> Any:
        out = embedding(ids, training=training)
        return head(tf.concat([out[n] for n in names], 1))

    forward(batches[0][0], False)
    variables = embedding.trainable_variables + head.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step(ids: dict, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, forward(ids, True))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    seconds = seconds_per_step(step, batches, steps)
    return {"samples_per_s": BATCH / seconds, "seconds_per_step": seconds}


def report(results: dict[tuple[str, int], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (median samples/s per case and table size, ours / keras_rs) and the goals."""
    rows, goals = [], {}
    for size in ROWS:
        sps = {case: statistics.median(r["samples_per_s"] for r in results[(case, size)]) for case in CASES}
        ratio = round(sps["ours"] / sps["keras_rs"], 2)
        for case in CASES:
            rows.append({"case": "keras_rs", "layer": case, "rows_per_table": size, "samples_per_s": round(sps[case]),
                         "vs_keras_rs": round(sps[case] / sps["keras_rs"], 2)})
        goals[f"ours_vs_keras_rs_at_{size // 1000}k_rows"] = {"goal": GOALS[size], "measured": ratio}
    notes = {"workload": __doc__.split("\n\n")[1].replace("\n", " "), "goals": goals}
    return rows, notes
