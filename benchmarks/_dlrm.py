"""The whole model: notebook 05's DLRM against TorchRec's DLRM on the same batches (``dlrm`` group).

Workload: notebook 05's shapes at its defaults: 26 one-hot categorical features over tables of
``scaled_cardinalities(0.03)`` x 0.75 rows (708,027 in all), dim 16, 13 count features, bottom MLP
64 -> 16, top MLP 128 -> 64 -> 1, batch 2048; ids Zipf(1.1) scrambled per table; 3 warm-up steps,
then the median samples/s of 30 steps, 2 threads. The batches are drawn once into one ``.npz``
(`write_batches`), which both sides read: ours here, TorchRec's through the peer script
``bench_torchrec_dlrm.py`` (``DLRM_DATA``).

Each optimizer is run the same way on both sides: the tables and the dense layers by the same
kind (SGD with SGD; Adagrad with Adagrad; row-wise Adagrad tables with Adagrad dense layers, as
our `RowWiseAdagrad` treats non-table variables). TorchRec runs as ``dmp``
(DistributedModelParallel, table-wise fused FBGEMM kernels, optimizer applied in backward) and
``fused`` (a FusedEmbeddingBagCollection). Ours is `sok_tutorial.models.DLRM` (one static table
over the 26 features; the interaction and top MLP in slices of 512 examples, its CPU default), the
step `sok_tutorial.training.make_sok_step` builds, in four configurations (`CASE_SUFFIX`); the
last, ``ours_onednn``, is notebook 05's: one thread per op, two ops at once, and TensorFlow's
oneDNN kernels for the matmuls and transposes (``TF_ENABLE_ONEDNN_OPTS=1``, `CASE_ENV`), which
TensorFlow turns on by itself only on CPUs with AVX-512's neural-network instructions. PyTorch
runs its matmuls on oneDNN and MKL as it comes.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._bench import page_faults

WARM, STEPS, BATCH, DIM = 3, 30, 2048, 16
OPTIMIZERS = {"sgd": ("SGD", 0.01), "adagrad": ("Adagrad", 0.01), "rowwise_adagrad": ("RowWiseAdagrad", 0.01)}
TORCHREC = {"sgd": "sgd", "adagrad": "adagrad", "rowwise_adagrad": "adagrad"}  # the peer's dense optimizer


def table_rows() -> list[int]:
    """Rows of each of the 26 tables: notebook 05's hash buckets at its defaults."""
    from data_gen.criteo import scaled_cardinalities

    return [max(1, int(0.75 * c)) for c in scaled_cardinalities(0.03)]


def write_batches(path: str | Path, steps: int = STEPS) -> Path:
    """Draw ``WARM + steps`` batches into `path` (``cat [N, B, 26]``, ``cont [N, B, 13]``,
    ``label [N, B]``, ``rows [26]``), the file both sides train on; kept if already there."""
    import numpy as np

    path = Path(path)
    if path.exists():
        return path
    rows = np.array(table_rows(), np.int64)
    n = WARM + steps
    rng = np.random.default_rng(0)
    cat = np.empty((n, BATCH, len(rows)), np.int64)
    for f, r in enumerate(rows):
        ids = (rng.zipf(1.1, size=(n, BATCH)) - 1) % r
        cat[:, :, f] = (ids * 2654435761) % r  # a prime multiplier permutes the ids of a table
    cont = rng.geometric(0.05, size=(n, BATCH, 13)).astype(np.float32) - 1
    label = (rng.random((n, BATCH)) < 0.25).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, cat=cat, cont=cont, label=label, rows=rows)
    partial.replace(path)
    return path


def train(optimizer: str, data: str, profile: bool = False, pipeline: bool = False,
          cpu_threads: bool = False) -> dict[str, Any]:
    """samples/s and cores busy of our DLRM with `optimizer` on the batches of `data` (with
    `profile`, and the top ops of the last 4 batches once more, under the profiler). With
    `pipeline`, the batches come from a ``tf.data`` pipeline that deduplicates their keys ahead
    (``dataset.map(model.deduplicate).prefetch(2)``); a step's time includes taking its batch.
    With `cpu_threads`, each op runs on one thread and two at once
    (`sok_tutorial.distribute.cpu_threads`), where the default splits each op over both cores."""
    import numpy as np
    import tensorflow as tf

    import sok_tutorial as sok

    if not tf.config.threading.get_intra_op_parallelism_threads():  # before TensorFlow's runtime starts
        from benchmarks._tables import set_threads

        if cpu_threads and not profile:
            sok.cpu_threads(1, 2, device="cpu")  # (2: the reference machine's cores, as set_threads)
        else:
            set_threads(profile)
    from data_gen.criteo import CAT_NAMES, CONT_NAMES
    from sok_tutorial.training.step import make_sok_step

    d = np.load(data)
    batches = [({"categorical": tf.constant(d["cat"][i]), "continuous": tf.constant(d["cont"][i])},
                tf.constant(d["label"][i][:, None])) for i in range(len(d["label"]))]
    model = sok.models.DLRM([int(r) for r in d["rows"]], CAT_NAMES, CONT_NAMES, embedding_dim=DIM)
    name, rate = OPTIMIZERS[optimizer]
    model(batches[0][0])
    step = make_sok_step(model, getattr(sok.optimizers, name)(rate), global_batch_size=BATCH)
    before = model.embedding.embedding_variable.numpy()[:int(d["rows"][0])].copy()
    feed = iter(batches)
    if pipeline:
        dataset = tf.data.Dataset.from_tensor_slices(({"categorical": d["cat"], "continuous": d["cont"]},
                                                      d["label"][:, :, None]))
        feed = iter(dataset.map(model.deduplicate).prefetch(2))
    times = []
    for i in range(len(batches)):
        if i == WARM:
            cpu, wall, faults = time.process_time(), time.perf_counter(), page_faults()
        start = time.perf_counter()
        features, labels = next(feed)
        float(step(features, labels))
        if i >= WARM:
            times.append(time.perf_counter() - start)
    busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
    faults = (page_faults() - faults) / len(times)
    changed = int(np.any(model.embedding.embedding_variable.numpy()[:len(before)] != before, axis=1).sum())
    rates = [BATCH / t for t in times]
    result = {"samples_per_s": statistics.median(rates), "min_samples_per_s": min(rates),
              "max_samples_per_s": max(rates), "cpu_busy": busy, "table_rows_changed": changed,
              "page_faults_per_step": faults, "onednn": sok.onednn_enabled()}
    if profile:
        from benchmarks._tables import profile_ops

        again = batches[-4:] if not pipeline else [(model.deduplicate(f), y) for f, y in batches[-4:]]
        result["profile_ms"] = profile_ops(step, again, top=16)
    return result


def run_peer(python: str, peers: str, impl: str, optimizer: str, data: str) -> dict[str, Any]:
    """One run of TorchRec's DLRM (``bench_torchrec_dlrm.py``) on `data`: its RESULT record."""
    import json
    import os
    import subprocess

    script = Path(peers) / "bench_torchrec_dlrm.py"
    env = {**os.environ, "DLRM_DATA": str(Path(data).resolve())}
    out = subprocess.run([python, str(script), impl, optimizer, TORCHREC[optimizer]], capture_output=True,
                         text=True, cwd=str(script.parent), env=env)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not line:
        raise RuntimeError(f"TorchRec DLRM {impl} {optimizer} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[0][7:])


#: our systems and the suffix of their benchmark case: keys deduplicated in the step (``ours``), ahead
#: in the input pipeline (``ours_pipeline``), or in the step with one thread per op and two ops at once
#: (``ours_cpu_threads``; `train`), that with TensorFlow's oneDNN kernels on (``ours_onednn``, `CASE_ENV`)
CASE_SUFFIX = {"ours": "", "ours_pipeline": ":pipeline", "ours_cpu_threads": ":cpu_threads",
               "ours_onednn": ":cpu_threads"}
#: the environment of a system's child process beside the benchmark's own (read when TensorFlow is imported)
CASE_ENV = {"ours_onednn": {"TF_ENABLE_ONEDNN_OPTS": "1"}}
OURS = tuple(CASE_SUFFIX)


def report(ours: dict[tuple[str, str], list[dict]],
           peers: dict[tuple[str, str], list[dict]]) -> tuple[list[dict], dict]:
    """Rows (medians over rounds) and goals (ours >= 2x each TorchRec DLRM) of the dlrm group;
    `ours` by (one of `OURS`, optimizer)."""
    rows, goals = [], {}
    for optimizer in OPTIMIZERS:
        sps = {}
        for system in OURS:
            runs = ours[(system, optimizer)]
            sps[system] = statistics.median([r["samples_per_s"] for r in runs])
            rows.append({"system": system, "optimizer": optimizer, "samples_per_s": round(sps[system]),
                         "cpu_busy": round(statistics.median([r["cpu_busy"] for r in runs]), 2),
                         "onednn": all(r["onednn"] for r in runs)})
        for impl in ("dmp", "fused"):
            theirs = peers.get((impl, optimizer))
            if not theirs:
                continue
            peer_sps = statistics.median([r["median_sps"] for r in theirs])
            rows.append({"system": f"torchrec_{impl}", "optimizer": optimizer, "samples_per_s": round(peer_sps),
                         "cpu_busy": round(statistics.median([r["cpu_per_wall"] for r in theirs]), 2),
                         **{f"{s}_vs_this": round(sps[s] / peer_sps, 2) for s in OURS}})
            for system in OURS:
                goals[f"dlrm_{system}_{optimizer}_vs_torchrec_{impl}"] = {
                    "goal": 2.0, "measured": round(sps[system] / peer_sps, 2)}
    notes = {"workload": " ".join(__doc__.split("\n\n")[1].split()), "goals": goals, "table_rows": sum(table_rows())}
    return rows, notes
