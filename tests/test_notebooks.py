"""Every notebook runs end to end through papermill, and the numbers it wrote to metrics.json are checked.

Two sizes, chosen through each notebook's parameters:
- SMOKE, the fast tier (marker ``notebooks``): every notebook once, tiny, leaving out what other
  tests cover (speed sweeps, profiles, extra precisions, worker processes). Its check asserts what
  holds at any size: counts and shapes, numbers that must agree with each other, and what must be
  exact (N replicas equal one device, a restored or served model equals the trained one).
- LARGER, the ``slow`` tier (``multiprocess`` too where the notebook starts worker processes): the
  notebooks whose point only shows on more data (a model beating its baselines by a margin, early
  stopping, LRU keeping the AUC of an unbounded table, 16-bit tables training like 32-bit ones,
  worker processes). Its check adds those margins to the smoke check.

A notebook without a SMOKE entry fails. Speed ratios are printed by the notebooks and measured by
``benchmarks/``; here a ratio is only asserted to have been measured (> 0).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
Check = Callable[[dict, dict], None]


def check_01(m: dict[str, Any], p: dict[str, Any]) -> None:
    assert m["criteo_rows"] == p["CRITEO_ROWS"] and m["criteo_parts"] == p["NUM_PARTS"]
    assert 0.74 < m["criteo_oracle_auc"] < 0.86
    assert abs(m["criteo_positive_rate"] - 0.25) < 0.03
    assert all(abs(r - m["criteo_positive_rate"]) < 0.03 for r in m["criteo_part_positive_rates"])
    assert all(-1.5 < s < -0.7 for s in m["criteo_zipf_slopes"].values())
    assert m["movielens_rows"] == p["MOVIELENS_RATINGS"] and 0.6 < m["movielens_oracle_auc"] < 0.95
    assert m["movielens_cardinalities"]["genres"] <= 19
    assert m["movielens_cardinalities"]["userId"] <= p["MOVIELENS_USERS"] + 1
    assert (m["sok_rows"], m["sok_slots"], m["sok_nnz"]) == (p["SOK_SAMPLES"], p["SOK_SLOT_NUM"], p["SOK_NNZ_PER_SLOT"])
    assert m["days_rows"] == p["CRITEO_TSV_ROWS"] and m["days_parts"] == p["CRITEO_TSV_FILES"]
    assert all(0 < k <= m["days_total_keys"] for k in m["days_keyset_sizes"]) and m["days_bad_lines"] == 0


def check_02(m: dict[str, Any], p: dict[str, Any]) -> None:
    assert min(m["loader_vs_tfrecord_native"], m["hashbucket_vs_tfrecord_native"], m["loader_vs_raw_decode"]) > 0
    assert m["shards_disjoint"] and m["shards_complete"]
    assert m["train_steps"] == p["TRAIN_EPOCHS"] * (p["ROWS"] // p["TRAIN_BATCH_SIZE"])
    assert len(m["train_losses"]) == p["TRAIN_EPOCHS"] and all(0.3 < loss < 0.75 for loss in m["train_losses"])
    assert 0.5 < m["train_auc"] <= m["oracle_auc"] + 0.02
    assert m["ragged_genres_shape"] == [5, None]


def check_03(m: dict[str, Any], p: dict[str, Any]) -> None:
    per_epoch, aucs = m["steps_per_epoch"], m["eval_auc"]
    assert per_epoch == -(-m["train_rows"] // p["BATCH_SIZE"]) and m["batch_size"] == p["BATCH_SIZE"]
    assert m["eval_steps"] == [per_epoch * (i + 1) for i in range(len(aucs))]  # one evaluation an epoch
    assert m["epochs_trained"] == len(aucs) <= p["MAX_EPOCHS"] and m["best_auc"] == max(aucs)
    assert abs(m["final_auc"] - m["best_auc"]) < 1e-6  # the best is kept
    assert m["export_max_abs_diff"] < 1e-6 and m["snapshots"] == m["epochs_trained"]
    assert m["train_rows"] + m["valid_rows"] == p["NUM_RATINGS"] and m["popularity_rows"] == m["valid_rows"]
    assert 0.5 < min(m["popularity_auc"], m["logistic_auc"], m["final_auc"])
    assert max(m["popularity_auc"], m["logistic_auc"], m["final_auc"]) <= m["oracle_auc"] + 0.02


def margins_03(m: dict[str, Any], p: dict[str, Any]) -> None:
    """Run long enough to overfit: training stops PATIENCE evaluations after the best, and the
    model beats the logistic regression, which beats popularity."""
    assert m["stopped_early"] and m["epochs_trained"] < p["MAX_EPOCHS"]
    assert m["epochs_trained"] == m["best_epoch"] + p["PATIENCE"] and m["last_eval_auc"] < m["best_auc"]
    assert m["popularity_auc"] < m["logistic_auc"] < m["final_auc"]


def check_04(m: dict[str, Any], p: dict[str, Any]) -> None:
    assert m["num_replicas"] == p["NUM_REPLICAS"] == 2
    assert len(m["losses"]) == p["ITERATIONS"] and all(0.4 < loss < 0.8 for loss in m["losses"])
    assert m["last_loss"] < m["first_loss"]  # the planted labels are learnable
    assert m["samples_per_s"] > 0 and m["loader_speedup"] > 0
    assert m["embedding_parameters"] == p["VOCABULARY_SIZE"] * 4
    rs = m["keras_rs"]  # step 5: Keras-RS's example, its layer built by from_keras_rs
    assert rs["features"] == p["SLOT_NUM"] and rs["tables"] == 1  # every slot's feature looks up the one table
    assert rs["placement"]["keys"] != "replicated"  # the budget is below a whole copy: the planner shards it
    assert rs["same_start_max_abs_diff"] < 1e-5  # same weights, same predictions as Keras-RS's layer
    for losses in (rs["ours_losses"], rs["keras_rs_losses"]):
        assert len(losses) == p["KERAS_RS_EPOCHS"] and losses[-1] < losses[0]
    assert 0 < rs["ours_rmse"] < 1 and 0 < rs["keras_rs_rmse"] < 1
    assert rs["ours_samples_per_s"] > 0 and rs["keras_rs_samples_per_s"] > 0 and rs["speedup"] > 0


def check_05(m: dict[str, Any], p: dict[str, Any]) -> None:
    devices, timed = m["devices"], bool(p["SPEED_STEPS"])
    assert m["steps"] == p["STEPS"] and m["batch_size"] == p["BATCH_SIZE"] and devices[0] == "CPU"
    assert m["accelerated_vs_native"] > 0 and all(v > 0 for v in m["samples_per_s"].values())
    assert len(m["samples_per_s"]) == (2 + 5 * timed) * len(devices)  # main runs; speed, 16-bit, unpadded
    assert all(0.5 < auc <= m["oracle_auc"] + 0.02 for auc in m["val_auc"].values())
    assert 0.5 < m["logistic_auc"] <= m["oracle_auc"] + 0.02 and m["logistic_best_step"] <= p["STEPS"]
    assert m["train_rows"] == p["ROWS"] and all(0.2 < loss < 0.75 for loss in m["final_loss"].values())
    assert m["table_rows"] < m["embedding_parameters"] / 16 + 1 and m["dense_parameters"] > 0
    assert len(m["phases_ms_per_step"]) == 2 * len(devices) * bool(p["PROFILE_STEPS"])
    for phases in m["phases_ms_per_step"].values():
        assert phases["optimizer"] > 0 and phases["forward"] > 0
    assert len(m["table_size_sweep"]["native"]) == len(p["TABLE_FRACTIONS"]) * timed


def margins_05(m: dict[str, Any], p: dict[str, Any]) -> None:
    """One pass over more rows: both DLRMs and the regressions are well above chance, the counts
    carry signal, and tf.data's threads show in the profile."""
    assert all(auc > 0.55 for auc in m["val_auc"].values())
    assert 0.55 < m["logistic_auc"] < m["logistic_counts_auc"] <= m["oracle_auc"] + 0.02
    assert all(0.2 < loss < 0.7 for loss in m["final_loss"].values())
    assert m["phases_ms_per_step"]["cpu-native"]["input"] > 0


def check_06(m: dict[str, Any], p: dict[str, Any]) -> None:
    assert m["num_replicas"] == p["NUM_REPLICAS"] and len(m["losses_replicas"]) == p["STEPS"]
    assert m["max_loss_diff_vs_one_device"] < 1e-5 and m["max_table_diff_vs_one_device"] < 1e-4
    assert m["restore_max_prediction_diff"] < 1e-5
    assert m["grouped_lookup_max_diff"] < 1e-6
    assert m["losses_replicas"][-1] < m["losses_replicas"][0]  # the planted labels are learnable
    assert sum(m["table_wise_rows_per_replica"]) == sum(p["FIELD_SIZES"])
    skipped = [m[k] for k in ("workers2_max_loss_diff", "memory_per_replica_bytes", "exchange_bytes_per_step")]
    assert p["SCRIPT_RUNS"] or skipped == [None] * 3


def margins_06(m: dict[str, Any], p: dict[str, Any]) -> None:
    """The example script as 2 worker processes, and at 1, 2 and 4 replicas."""
    assert m["workers2_max_loss_diff"] < 1e-5 and m["workers2_max_table_diff"] < 1e-5
    memory, exchange = m["memory_per_replica_bytes"], m["exchange_bytes_per_step"]
    for mode in ("row", "table"):
        for n in (2, 4):  # 1/n of rows, key index and state; table-wise shards add each row's slot (8 bytes)
            assert memory[mode]["1"] <= memory[mode][str(n)] * n <= 1.1 * memory[mode]["1"]
    assert memory["replicated"]["4"] == memory["replicated"]["1"]
    for mode in ("column", "row_column"):  # slices of the width; the key index stays whole per row group
        assert memory["row"]["4"] < memory[mode]["4"] < memory[mode]["2"] <= memory[mode]["1"]
    assert set(memory) == {"row", "table", "column", "row_column", "replicated"}
    assert all(exchange[mode]["1"] == 0 for mode in exchange)
    assert exchange["replicated"]["2"] < exchange["row"]["2"] < exchange["table"]["2"]


def check_07(m: dict[str, Any], p: dict[str, Any]) -> None:
    aucs = m["auc"]
    assert all(0.5 < a <= m["oracle_auc"] + 0.02 for run in aucs.values() for a in run) and len(aucs["host"]) == 2
    assert all(abs(a - b) < 0.01 for run in ("disk", "low_level") for a, b in zip(aucs[run], aucs["host"]))
    assert abs(m["reloaded_auc_stage_2"] - m["auc_stage_2"]) < 1e-5  # the save restores the whole state
    assert m["resumed_optimizer_steps"] == m["optimizer_steps"] > 0
    for stage, keys in zip(("stage_1", "stage_2"), m["stage_keys"]):
        sizes = m["incremental_sizes"][stage]
        assert 0 < sizes["deep"] < sizes["wide"] <= keys and sizes["wide"] > 0.99 * keys  # crosses: wide only
        assert m["incremental_sizes_low_level"][stage] == sizes
    assert m["incremental_again"] == {"wide": 0, "deep": 0}  # nothing changed since the last call
    assert set(m["samples_per_s"]) == {"HostMemoryPS", "DiskPS", "DiskPS, low-level"}
    assert all(v > 0 for v in m["samples_per_s"].values())
    assert all(rows == {"wide": m["trained_keys"], "deep": m["trained_keys"]} for rows in m["ps_rows"].values())
    assert m["device_capacity_rows"] == max(m["keyset_sizes"]) < m["trained_keys"] < m["vocabulary"]
    for passes in m["pass_seconds"].values():
        assert [r["file_list"] for r in passes] == [0, 1, 3, 4]
        assert all(r["pull_s"] > 0 and r["train_s"] > 0 and r["write_back_s"] > 0 for r in passes)
        assert all(r["samples"] == p["ROWS_PER_DAY"] * p["DAYS_PER_LIST"] for r in passes)


def check_08(m: dict[str, Any], p: dict[str, Any]) -> None:
    rows = m["rows_held"]
    assert all(len(r) == p["DAYS"] for r in rows.values())
    assert max(rows["lru"]) <= m["capacity"] and max(rows["lfu_admission"]) <= m["capacity"]
    assert rows["unbounded"][-1] == m["distinct_keys"] > m["capacity"]  # the stream outgrows the table
    assert m["evicted"]["lru"] > 0 and m["evicted"]["unbounded"] == 0
    assert all(0.5 < a < 1 for a in m["mean_next_day_auc"].values())
    assert m["served_max_abs_diff"] < 1e-6 and m["served_auc"] == m["next_day_auc"]["lru"][1:]
    assert all(d < f for d, f in zip(m["delta_bytes"], m["full_export_bytes"]))
    assert m["index_bytes_per_row"]["lru"] == 12 and m["index_bytes_per_row"]["lfu_admission"] == 16
    # a tiny table (~200 buckets of 8) loses more to bucket-local eviction than a large one (~1 point)
    assert 0.3 < m["hit_rate_exact"] < 1 and abs(m["hit_rate_bucketed"] - m["hit_rate_exact"]) < 0.03
    for run, count in ((m["sharded"], "replicas"), (m["workers"], "processes")):  # step 8: sharded as one device
        if run[count] > 1:
            assert len(run["auc"]) == p["DAYS"] - 1 and run["served_max_abs_diff"] < 1e-6
            # the same training; the replicas sum a key's gradients in another order, which Adam's steps
            # amplify over days (at the tutorial's size, up to 0.0012 on one day, 0.0001 on the mean)
            assert np.max(np.abs(np.subtract(run["auc"], m["reference_auc"]))) < 0.002
            assert abs(np.mean(run["auc"]) - m["mean_next_day_auc"]["lru"]) < 0.001  # model.fit's, to rounding
    assert m["sharded"]["replicas"] == p["NUM_REPLICAS"] and m["workers"]["processes"] == p["WORKER_PROCESSES"]


def margins_08(m: dict[str, Any], p: dict[str, Any]) -> None:
    """Over more days, LRU forgets only what the stream stopped showing: its next-day AUC stays
    with the unbounded table's, and both beat the baseline."""
    auc = m["mean_next_day_auc"]
    assert abs(auc["lru"] - auc["unbounded"]) < 0.005
    assert auc["unbounded"] > m["mean_baseline_auc"] + 0.01 and auc["lfu_admission"] > m["mean_baseline_auc"]


def check_09(m: dict[str, Any], p: dict[str, Any]) -> None:
    assert m["plan_bytes_per_replica"] <= m["budget_bytes"] < m["replicated_bytes"]  # the plan fits; replicas would not
    assert m["measured_bytes_per_replica"] == m["plan_bytes_per_replica"] and m["estimate_max_relative_error"] < 0.1
    shardings = set(m["placements"].values())  # small tables replicated, large ones split
    assert "replicated" in shardings and shardings & {"row", "column"} and m["num_replicas"] == p["NUM_REPLICAS"]
    auc, held = m["auc"], m["bytes_per_replica"]
    assert sorted(auc) == sorted(held) == sorted(p["VARIANTS"])
    assert all(0 < a <= m["oracle_auc"] + 0.02 for a in auc.values())
    assert held["bfloat16"] < held["float32"] == m["plan_bytes_per_replica"]
    assert all(held[v] < m["budget_bytes"] for v in ("qr", "mixed") if v in held)  # small enough to replicate


def margins_09(m: dict[str, Any], p: dict[str, Any]) -> None:
    """On more rows, 16-bit rows train like float32 ones and every variant learns."""
    assert sorted(m["auc"]) == ["bfloat16", "float32", "mixed", "qr"]
    assert abs(m["auc"]["bfloat16"] - m["auc"]["float32"]) < 0.005
    assert all(0.6 < a <= m["oracle_auc"] + 0.02 for a in m["auc"].values())


SMOKE: dict[str, tuple[dict[str, Any], Check]] = {
    "01-synthetic-data-and-parquet": (
        {"CRITEO_ROWS": 60_000, "CRITEO_SCALE": 0.001, "CRITEO_TSV_ROWS": 9_000, "CRITEO_TSV_FILES": 3,
         "MOVIELENS_RATINGS": 20_000, "MOVIELENS_USERS": 300, "MOVIELENS_MOVIES": 200, "SOK_SAMPLES": 1_000,
         "SOK_SLOT_NUM": 10, "SOK_NNZ_PER_SLOT": 4, "SOK_VOCABULARY_SIZE": 1000, "NUM_PARTS": 2,
         "SCHEDULER": "synchronous", "PROGRESS": False},
        check_01,
    ),
    "02-parquet-loader": (
        {"ROWS": 20_000, "CRITEO_SCALE": 0.001, "NATIVE_ROWS": 8192, "BATCH_SIZE": 4096, "SHUFFLE_BUFFER": 4096,
         "HASH_BUCKETS": 1000, "TRAIN_BATCH_SIZE": 2048, "TRAIN_EPOCHS": 2, "MOVIELENS_RATINGS": 5_000,
         "PROGRESS": False},
        check_02,
    ),
    "03-training-overview-movielens": (
        {"NUM_RATINGS": 10_000, "NUM_USERS": 200, "NUM_MOVIES": 200, "BATCH_SIZE": 512, "LEARNING_RATE": 0.02,
         "MAX_EPOCHS": 2, "EVALS_PER_EPOCH": 1, "PATIENCE": 2, "EMBEDDING_DIM": 8, "L2": 0.0, "PROGRESS": False},
        check_03,
    ),
    "04-sok-dense-demo": (
        {"NUM_REPLICAS": 2, "GLOBAL_BATCH_SIZE": 256, "ITERATIONS": 8, "SLOT_NUM": 10, "NNZ_PER_SLOT": 4,
         "VOCABULARY_SIZE": 1000, "NUM_DENSE_LAYERS": 2, "DENSE_UNITS": 64, "LEARNING_RATE": 0.01,
         "KERAS_RS_EPOCHS": 2},
        check_04,
    ),
    "05-dlrm-native-vs-accelerated": (
        {"ROWS": 16_384, "VALID_ROWS": 4096, "NUM_PARTS": 2, "CRITEO_SCALE": 0.001, "BATCH_SIZE": 512, "STEPS": 30,
         "SPEED_STEPS": 0, "PROFILE_STEPS": 0, "TABLE_FRACTIONS": [], "PROGRESS": False},
        check_05,
    ),
    "06-model-parallel-embeddings": (
        {"NUM_REPLICAS": 2, "GLOBAL_BATCH_SIZE": 256, "STEPS": 6, "ITEM_VOCABULARY": 5_000,
         "FIELD_SIZES": [2_000, 1_000, 500, 100], "SCRIPT_RUNS": False},
        check_06,
    ),
    "07-continuous-training-cache": (
        {"ROWS_PER_DAY": 3000, "DAYS_PER_LIST": 1, "CRITEO_SCALE": 0.001, "BATCH_SIZE": 512, "HIDDEN": [32],
         "LEARNING_RATE": 0.005, "PROGRESS": False},
        check_07,
    ),
    "08-online-training-tables-that-forget": (
        {"DAYS": 3, "ROWS_PER_DAY": 4000, "POPULATION": 1500, "ITEM_DRIFT": 400, "USER_DRIFT": 150,
         "NUM_REPLICAS": 2, "WORKER_PROCESSES": 0, "PROGRESS": False},
        check_08,
    ),
    "09-fitting-tables-in-memory": (
        {"ROWS": 16_384, "VALID_ROWS": 4096, "CRITEO_SCALE": 0.002, "EMBEDDING_DIM": 8, "BATCH_SIZE": 1024,
         "NUM_REPLICAS": 2, "BUDGET_FRACTION": 0.6, "VARIANTS": ["float32", "bfloat16"], "PROGRESS": False},
        check_09,
    ),
}

# The notebooks whose point needs more data, at the sizes that show it: (parameters, margins).
LARGER: dict[str, tuple[dict[str, Any], Check]] = {
    # 60 ratings per user and per movie, 32-wide vectors without the L2 penalty: the model passes the
    # baselines within a few epochs, then overfits well before MAX_EPOCHS (with 100 users and movies
    # it still improved at epoch 8 on some CPUs, whose float rounding differs)
    "03-training-overview-movielens": (
        {"NUM_RATINGS": 30_000, "NUM_USERS": 500, "NUM_MOVIES": 500, "BATCH_SIZE": 512, "LEARNING_RATE": 0.02,
         "MAX_EPOCHS": 10, "EVALS_PER_EPOCH": 1, "PATIENCE": 2, "EMBEDDING_DIM": 32, "L2": 0.0, "PROGRESS": False},
        margins_03,
    ),
    "05-dlrm-native-vs-accelerated": (
        {"ROWS": 40_000, "VALID_ROWS": 8192, "NUM_PARTS": 2, "CRITEO_SCALE": 0.001, "BATCH_SIZE": 512, "STEPS": 60,
         "SPEED_STEPS": 30, "PROFILE_START": 5, "PROFILE_STEPS": 2, "TABLE_FRACTIONS": [0.5, 2.0],
         "PROGRESS": False},
        margins_05,
    ),
    "06-model-parallel-embeddings": (
        {"NUM_REPLICAS": 2, "GLOBAL_BATCH_SIZE": 256, "STEPS": 8, "ITEM_VOCABULARY": 20_000,
         "FIELD_SIZES": [5_000, 2_000, 1_000, 200], "SCRIPT_RUNS": True, "SCRIPT_STEPS": 5, "SCRIPT_VOCABULARY": 2_000},
        margins_06,
    ),
    "08-online-training-tables-that-forget": (
        {"DAYS": 4, "ROWS_PER_DAY": 8000, "POPULATION": 3000, "ITEM_DRIFT": 750, "USER_DRIFT": 250,
         "NUM_REPLICAS": 2, "WORKER_PROCESSES": 2, "PROGRESS": False},
        margins_08,
    ),
    "09-fitting-tables-in-memory": (
        {"ROWS": 24_000, "VALID_ROWS": 8192, "CRITEO_SCALE": 0.002, "EMBEDDING_DIM": 16, "BATCH_SIZE": 1024,
         "NUM_REPLICAS": 2, "BUDGET_FRACTION": 0.6, "VARIANTS": ["float32", "bfloat16", "qr", "mixed"],
         "PROGRESS": False},
        margins_09,
    ),
}


def test_every_notebook_has_a_smoke_test():
    names = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
    assert names, "no notebooks found"
    missing = [n for n in names if n not in SMOKE]
    assert not missing, f"notebooks without a smoke entry in tests/test_notebooks.py: {missing}"
    stale = [n for n in SMOKE if n not in names]
    assert not stale, f"smoke entries without a notebook: {stale}"


def test_notebooks_are_committed_clean():
    for path in NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"):
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert not any(c.get("outputs") or c.get("execution_count") for c in code), f"{path.name} has outputs"
        tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged 'parameters'"


def run_notebook(name: str, tmp_path: Path, **overrides: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run notebook `name` at its smoke parameters (with `overrides`), data and output under
    `tmp_path`; returns (the parameters it ran with, the metrics it wrote)."""
    import papermill as pm

    out = tmp_path / "out"
    params = {**SMOKE[name][0], "DATA_DIR": str(tmp_path / "data"), "OUTPUT_DIR": str(out), **overrides}
    pm.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(tmp_path / f"{name}.ipynb"), parameters=params,
                        cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False, log_output=False)
    return params, json.loads((out / "metrics.json").read_text())


@pytest.mark.notebooks
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_notebook_smoke(name, tmp_path):
    params, metrics = run_notebook(name, tmp_path)
    SMOKE[name][1](metrics, params)


@pytest.mark.notebooks
@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.multiprocess) if n[:3] in ("06-", "08-") else n
                                  for n in sorted(LARGER)])
def test_notebook_at_a_larger_size(name, tmp_path):
    params, metrics = run_notebook(name, tmp_path, **LARGER[name][0])
    SMOKE[name][1](metrics, params)
    LARGER[name][1](metrics, params)


def test_every_larger_run_sets_all_the_smoke_parameters():
    """A LARGER entry overrides every SMOKE parameter, so a smoke change cannot shift it."""
    for name, (params, _) in LARGER.items():
        assert set(SMOKE[name][0]) <= set(params), f"{name}: {set(SMOKE[name][0]) - set(params)}"


@pytest.mark.notebooks
@pytest.mark.slow
def test_notebook_03_reads_a_real_movielens_layout_in_data_dir(tmp_path):
    """DATA_DIR holding a download (here a small ml-1m layout, '::'-separated) is used as is."""
    rng = np.random.default_rng(0)
    data = tmp_path / "ml-1m"
    data.mkdir()
    genres = ["Action", "Comedy", "Drama", "Romance"]
    (data / "movies.dat").write_text("".join(f"{m}::Movie {m} (1999)::{'|'.join(rng.choice(genres, 2, False))}\n"
                                             for m in range(1, 61)), encoding="latin-1")
    users, movies = rng.integers(1, 81, 12_000), rng.integers(1, 61, 12_000)
    stars = np.clip(np.round(3 + (users % 3 - 1) + (movies % 2) + rng.normal(0, 0.7, 12_000)), 1, 5).astype(int)
    (data / "ratings.dat").write_text("".join(f"{u}::{m}::{r}::{978300000 + i}\n"
                                              for i, (u, m, r) in enumerate(zip(users, movies, stars))))
    _, m = run_notebook("03-training-overview-movielens", tmp_path, MAX_EPOCHS=3, DATA_DIR=str(data))
    assert m["layout"] == "ml-1m" and m["oracle_auc"] is None and m["auc_gap"] is None
    assert m["train_rows"] + m["valid_rows"] == 12_000 and m["export_max_abs_diff"] < 1e-6
    assert m["final_auc"] > 0.6  # the planted user and movie effects are learnable
