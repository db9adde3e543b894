"""What the notebook must show: at the smoke size, and on more data."""

from __future__ import annotations

import platform
from typing import Any

NOTEBOOK = "05-dlrm-native-vs-accelerated"


def check_05(m: dict[str, Any], p: dict[str, Any]) -> None:
    devices, timed = m["devices"], bool(p["SPEED_STEPS"])
    assert m["steps"] == p["STEPS"] and m["batch_size"] == p["BATCH_SIZE"] and devices[0] in ("CPU", "GPU")
    assert m["interactions"] == p["INTERACTIONS"] and m["hashed_fields"]  # the largest fields are hashed
    if p.get("CPU_THREADS", True) and "GPU" not in devices:  # set first thing, on a CPU only
        assert m["cpu_threads"]["intra_op"] == 1 and m["cpu_threads"]["inter_op"] >= 1
    else:
        assert m["cpu_threads"] is None
    if platform.machine() in ("x86_64", "AMD64"):  # chosen before TensorFlow loads (x86 wheels carry oneDNN)
        assert m["onednn"] is p.get("ONEDNN", True)
    every = max(1, p["STEPS"] // p["EVALS"])  # the learning curves: an AUC every `every` steps and at the end
    for name, curve in m["val_auc_curves"].items():
        steps = [step for step, _ in curve]
        assert steps == sorted(set(steps)) and steps[0] == every and all(0.4 < auc <= 1 for _, auc in curve)
        assert steps[-1] == p["STEPS"] if "-" in name else steps[-1] <= p["STEPS"]  # a regression may stop early
    assert m["val_auc"] == {k: m["val_auc_curves"][k][-1][1] for k in m["val_auc"]}
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
    """One pass over more rows with the planted interactions: both DLRMs beat the logistic
    regression on the same ids and counts by more than 0.01 AUC (what their dot products learn and
    a weight per id cannot), the counts carry signal, and tf.data's threads show in the profile.
    (Within 0.01 of the oracle takes the tutorial's 2M rows.)"""
    assert all(auc > m["logistic_counts_auc"] + 0.01 for auc in m["val_auc"].values())
    assert 0.55 < m["logistic_auc"] < m["logistic_counts_auc"] <= m["oracle_auc"] + 0.02
    assert all(0.2 < loss < 0.7 for loss in m["final_loss"].values())
    assert m["phases_ms_per_step"]["cpu-native"]["input"] > 0


SMOKE = (
    {
        "ROWS": 16_384,
        "VALID_ROWS": 4096,
        "NUM_PARTS": 2,
        "CRITEO_SCALE": 0.001,
        "BATCH_SIZE": 512,
        "STEPS": 30,
        "SPEED_STEPS": 0,
        "PROFILE_STEPS": 0,
        "TABLE_FRACTIONS": [],
        "INTERACTIONS": 0.5,
        "EVALS": 4,
        "PROGRESS": False,
    },
    check_05,
)

LARGER = (
    {
        "ROWS": 40_000,
        "VALID_ROWS": 8192,
        "NUM_PARTS": 2,
        "CRITEO_SCALE": 0.001,
        "BATCH_SIZE": 512,
        "STEPS": 78,
        "SPEED_STEPS": 30,
        "PROFILE_START": 5,
        "PROFILE_STEPS": 2,
        "TABLE_FRACTIONS": [0.5, 2.0],
        "INTERACTIONS": 0.7,
        "EVALS": 3,
        "PROGRESS": False,
    },
    margins_05,
)
