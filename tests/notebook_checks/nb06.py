"""What the notebook must show: at the smoke size, and on more data."""

from __future__ import annotations

from typing import Any

NOTEBOOK = "06-model-parallel-embeddings"


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


SMOKE = (
    {
        "DEVICE": "auto",
        "NUM_REPLICAS": 2,
        "GLOBAL_BATCH_SIZE": 256,
        "STEPS": 6,
        "ITEM_VOCABULARY": 5_000,
        "FIELD_SIZES": [2_000, 1_000, 500, 100],
        "SCRIPT_RUNS": False,
    },
    check_06,
)

LARGER = (
    {
        "DEVICE": "auto",
        "NUM_REPLICAS": 2,
        "GLOBAL_BATCH_SIZE": 256,
        "STEPS": 8,
        "ITEM_VOCABULARY": 20_000,
        "FIELD_SIZES": [5_000, 2_000, 1_000, 200],
        "SCRIPT_RUNS": True,
        "SCRIPT_STEPS": 5,
        "SCRIPT_VOCABULARY": 2_000,
    },
    margins_06,
)
