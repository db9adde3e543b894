"""What the notebook must show: at the smoke size, and on more data."""

from __future__ import annotations

from typing import Any

NOTEBOOK = "03-training-overview-movielens"


def check_03(m: dict[str, Any], p: dict[str, Any]) -> None:
    from sok_tutorial import resolve_device  # imports TensorFlow: only when a run is checked

    per_epoch, aucs = m["steps_per_epoch"], m["eval_auc"]
    assert per_epoch == -(-m["train_rows"] // p["BATCH_SIZE"]) and m["batch_size"] == p["BATCH_SIZE"]
    assert m["eval_steps"] == [per_epoch * (i + 1) for i in range(len(aucs))]  # one evaluation an epoch
    assert m["epochs_trained"] == len(aucs) <= p["MAX_EPOCHS"] and m["best_auc"] == max(aucs)
    assert abs(m["final_auc"] - m["best_auc"]) < 1e-6  # the best is kept
    assert m["export_max_abs_diff"] < 1e-6 and m["snapshots"] == m["epochs_trained"]
    assert m["train_rows"] + m["valid_rows"] == p["NUM_RATINGS"] and m["popularity_rows"] == m["valid_rows"]
    assert 0.5 < min(m["popularity_auc"], m["logistic_auc"], m["final_auc"])
    assert max(m["popularity_auc"], m["logistic_auc"], m["final_auc"]) <= m["oracle_auc"] + 0.02
    assert m["device"] == resolve_device(p["DEVICE"])  # where the models were built and trained


def margins_03(m: dict[str, Any], p: dict[str, Any]) -> None:
    """Run long enough to overfit: training stops PATIENCE evaluations after the best, and the
    model beats the logistic regression, which beats popularity."""
    assert m["stopped_early"] and m["epochs_trained"] < p["MAX_EPOCHS"]
    assert m["epochs_trained"] == m["best_epoch"] + p["PATIENCE"] and m["last_eval_auc"] < m["best_auc"]
    assert m["popularity_auc"] < m["logistic_auc"] < m["final_auc"]


SMOKE = (
    {
        "NUM_RATINGS": 10_000,
        "NUM_USERS": 200,
        "NUM_MOVIES": 200,
        "BATCH_SIZE": 512,
        "LEARNING_RATE": 0.02,
        "MAX_EPOCHS": 2,
        "EVALS_PER_EPOCH": 1,
        "PATIENCE": 2,
        "EMBEDDING_DIM": 8,
        "L2": 0.0,
        "DEVICE": "auto",
        "PROGRESS": False,
    },
    check_03,
)

# 60 ratings per user and per movie, 32-wide vectors without the L2 penalty: the model passes the
# baselines within a few epochs, then overfits well before MAX_EPOCHS (with 100 users and movies
# it still improved at epoch 8 on some CPUs, whose float rounding differs)
LARGER = (
    {
        "NUM_RATINGS": 30_000,
        "NUM_USERS": 500,
        "NUM_MOVIES": 500,
        "BATCH_SIZE": 512,
        "LEARNING_RATE": 0.02,
        "MAX_EPOCHS": 10,
        "EVALS_PER_EPOCH": 1,
        "PATIENCE": 2,
        "EMBEDDING_DIM": 32,
        "L2": 0.0,
        "DEVICE": "auto",
        "PROGRESS": False,
    },
    margins_03,
)
