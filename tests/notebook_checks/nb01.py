"""What the notebook must show: at the smoke size, and (no larger run)."""

from __future__ import annotations

from typing import Any

NOTEBOOK = "01-synthetic-data-and-parquet"


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


SMOKE = (
    {
        "CRITEO_ROWS": 60_000,
        "CRITEO_SCALE": 0.001,
        "CRITEO_TSV_ROWS": 9_000,
        "CRITEO_TSV_FILES": 3,
        "MOVIELENS_RATINGS": 20_000,
        "MOVIELENS_USERS": 300,
        "MOVIELENS_MOVIES": 200,
        "SOK_SAMPLES": 1_000,
        "SOK_SLOT_NUM": 10,
        "SOK_NNZ_PER_SLOT": 4,
        "SOK_VOCABULARY_SIZE": 1000,
        "NUM_PARTS": 2,
        "SCHEDULER": "synchronous",
        "PROGRESS": False,
    },
    check_01,
)
