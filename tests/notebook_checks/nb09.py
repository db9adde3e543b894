"""What the notebook must show: at the smoke size, and on more data."""

from __future__ import annotations

from typing import Any

NOTEBOOK = "09-fitting-tables-in-memory"


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
    n, by_replica = p["NUM_REPLICAS"], m["measured_bytes_by_replica"]  # read on the trained replicas' variables
    assert m["trained_replicas"] == {v: n for v in p["VARIANTS"]} and sorted(by_replica) == sorted(p["VARIANTS"])
    assert all(b == [held[v]] * n for v, b in by_replica.items())  # every replica holds the same bytes
    planned = m["planned_bytes_per_replica"]
    assert by_replica["float32"] == [planned["float32"]] * n and by_replica["bfloat16"] == [planned["bfloat16"]] * n


def margins_09(m: dict[str, Any], p: dict[str, Any]) -> None:
    """On more rows, 16-bit rows train like float32 ones and every variant learns."""
    assert sorted(m["auc"]) == ["bfloat16", "float32", "mixed", "qr"]
    assert abs(m["auc"]["bfloat16"] - m["auc"]["float32"]) < 0.005
    assert all(0.6 < a <= m["oracle_auc"] + 0.02 for a in m["auc"].values())


SMOKE = (
    {
        "ROWS": 16_384,
        "VALID_ROWS": 4096,
        "CRITEO_SCALE": 0.002,
        "EMBEDDING_DIM": 8,
        "BATCH_SIZE": 1024,
        "NUM_REPLICAS": 2,
        "BUDGET_FRACTION": 0.6,
        "VARIANTS": ["float32", "bfloat16"],
        "PROGRESS": False,
    },
    check_09,
)

LARGER = (
    {
        "ROWS": 24_000,
        "VALID_ROWS": 8192,
        "CRITEO_SCALE": 0.002,
        "EMBEDDING_DIM": 16,
        "BATCH_SIZE": 1024,
        "NUM_REPLICAS": 2,
        "BUDGET_FRACTION": 0.6,
        "VARIANTS": ["float32", "bfloat16", "qr", "mixed"],
        "PROGRESS": False,
    },
    margins_09,
)
