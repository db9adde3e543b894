"""What the notebook must show: at the smoke size, and (no larger run)."""

from __future__ import annotations

from typing import Any

NOTEBOOK = "04-sok-dense-demo"


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


SMOKE = (
    {
        "DEVICE": "auto",
        "NUM_REPLICAS": 2,
        "GLOBAL_BATCH_SIZE": 256,
        "ITERATIONS": 8,
        "SLOT_NUM": 10,
        "NNZ_PER_SLOT": 4,
        "VOCABULARY_SIZE": 1000,
        "NUM_DENSE_LAYERS": 2,
        "DENSE_UNITS": 64,
        "LEARNING_RATE": 0.01,
        "KERAS_RS_EPOCHS": 2,
    },
    check_04,
)
