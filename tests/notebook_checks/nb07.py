"""What the notebook must show: at the smoke size, and (no larger run)."""

from __future__ import annotations

from typing import Any

NOTEBOOK = "07-continuous-training-cache"


def check_07(m: dict[str, Any], p: dict[str, Any]) -> None:
    aucs = m["auc"]
    assert all(0.5 < a <= m["oracle_auc"] + 0.02 for run in aucs.values() for a in run) and len(aucs["host"]) == 2
    assert all(abs(a - b) < 0.01 for run in ("disk", "low_level") for a, b in zip(aucs[run], aucs["host"]))
    # the low-level loop trains the same batches with the same step as model.fit: its AUC (exact) differs from
    # model.evaluate's (1000 thresholds) by rounding only
    assert all(abs(a - b) < 0.003 for a, b in zip(aucs["low_level"], aucs["host"]))
    assert abs(m["reloaded_auc_stage_2"] - m["auc_stage_2"]) < 1e-5  # the save restores the whole state
    assert m["resumed_optimizer_steps"] == m["optimizer_steps"] > 0
    for stage, keys in zip(("stage_1", "stage_2"), m["stage_keys"]):
        sizes = m["incremental_sizes"][stage]
        assert 0 < sizes["deep"] < sizes["wide"] <= keys and sizes["wide"] > 0.99 * keys  # crosses: wide only
        assert m["incremental_sizes_low_level"][stage] == sizes
    assert m["incremental_again"] == {"wide": 0, "deep": 0}  # nothing changed since the last call
    rollback = m["rollback"]  # a pass on list 5 published, then load_params_from_files back to the save
    assert rollback["rolled_back"] == rollback["served_in_save"] and rollback["rolled_back"]["wide"] > 0
    assert rollback["deleted"] == rollback["new_keys"] and rollback["new_keys"]["wide"] > 0
    assert abs(rollback["auc"] - m["reloaded_auc_stage_2"]) < 1e-5
    assert set(m["samples_per_s"]) == {"HostMemoryPS", "DiskPS", "DiskPS, low-level"}
    assert all(v > 0 for v in m["samples_per_s"].values())
    assert all(rows == {"wide": m["trained_keys"], "deep": m["trained_keys"]} for rows in m["ps_rows"].values())
    assert m["device_capacity_rows"] == max(m["keyset_sizes"]) < m["trained_keys"] < m["vocabulary"]
    for passes in m["pass_seconds"].values():
        assert [r["file_list"] for r in passes] == [0, 1, 3, 4]
        assert all(r["pull_s"] > 0 and r["train_s"] > 0 and r["write_back_s"] > 0 for r in passes)
        assert all(r["samples"] == p["ROWS_PER_DAY"] * p["DAYS_PER_LIST"] for r in passes)  # no batch left out
    rows, batch = p["ROWS_PER_DAY"] * p["DAYS_PER_LIST"], p["BATCH_SIZE"]
    assert m["low_level_step_sizes"] == sorted({batch, rows % batch} - {0})  # a step of its own for a short batch


SMOKE = (
    {
        "ROWS_PER_DAY": 3000,
        "DAYS_PER_LIST": 1,
        "CRITEO_SCALE": 0.001,
        "BATCH_SIZE": 512,
        "HIDDEN": [32],
        "LEARNING_RATE": 0.005,
        "PROGRESS": False,
        "DEVICE": "auto",
    },
    check_07,
)
