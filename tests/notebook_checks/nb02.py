"""What the notebook must show: at the smoke size, and (no larger run)."""

from __future__ import annotations

from typing import Any

NOTEBOOK = "02-parquet-loader"


def check_02(m: dict[str, Any], p: dict[str, Any]) -> None:
    assert min(m["loader_vs_tfrecord_native"], m["hashbucket_vs_tfrecord_native"], m["loader_vs_raw_decode"]) > 0
    assert m["shards_disjoint"] and m["shards_complete"]
    assert m["train_steps"] == p["TRAIN_EPOCHS"] * (p["ROWS"] // p["TRAIN_BATCH_SIZE"])
    assert len(m["train_losses"]) == p["TRAIN_EPOCHS"] and all(0.3 < loss < 0.75 for loss in m["train_losses"])
    assert 0.5 < m["train_auc"] <= m["oracle_auc"] + 0.02
    assert m["ragged_genres_shape"] == [5, None]


SMOKE = (
    {
        "ROWS": 20_000,
        "CRITEO_SCALE": 0.001,
        "NATIVE_ROWS": 8192,
        "BATCH_SIZE": 4096,
        "SHUFFLE_BUFFER": 4096,
        "HASH_BUCKETS": 1000,
        "TRAIN_BATCH_SIZE": 2048,
        "TRAIN_EPOCHS": 2,
        "MOVIELENS_RATINGS": 5_000,
        "PROGRESS": False,
    },
    check_02,
)
