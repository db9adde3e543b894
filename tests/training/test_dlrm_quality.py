"""DLRM earns its interactions at the size notebook 05 trains it.

The notebook's own runs check that both DLRMs beat the logistic regression on ids and counts
by 0.01 AUC (the ``slow`` tier, at 40k rows, where that margin already holds). Coming within 0.01
of the oracle takes about the tutorial's 2M rows, too many for the notebook's native pipeline in
CI; this test trains the accelerated DLRM exactly as the notebook does, with the notebook's own
default parameters (read from its ``parameters`` cell, so the two cannot drift apart), and asserts
both margins.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "05-dlrm-native-vs-accelerated.ipynb"


def notebook_defaults() -> dict[str, Any]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    [cell] = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    tree = ast.parse("".join(cell["source"]))
    return {node.target.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.AnnAssign)}


@pytest.mark.slow
def test_at_the_tutorial_size_dlrm_is_within_001_of_the_oracle_and_001_above_the_regression(tmp_path):
    import keras

    import sok_tutorial as sok
    from data_gen.criteo import CAT_NAMES, CONT_NAMES
    from data_gen.dlrm_data import criteo_for_dlrm
    from sok_tutorial.data import HashBucket, ParquetLoader
    from sok_tutorial.models import DLRM, LogisticRegression
    from sok_tutorial.training import evaluate, fit

    p = notebook_defaults()
    data = criteo_for_dlrm(tmp_path, p["ROWS"], p["VALID_ROWS"], num_parts=p["NUM_PARTS"], scale=p["CRITEO_SCALE"],
                           interactions=p["INTERACTIONS"], seed=p["SEED"], tfrecords=False, progress=False)
    hashed, rows = data.tables(p["HASH_FRACTION"], p["HASH_ABOVE"])

    def loader(valid: bool = False) -> ParquetLoader:
        return ParquetLoader(data.valid if valid else data.train, 16384 if valid else p["BATCH_SIZE"], ["label"],
                             cat_names=CAT_NAMES, cont_names=CONT_NAMES, fill_nan=0.0, shuffle=not valid,
                             seed=p["SEED"], transforms=[HashBucket(hashed)], drop_last=not valid,
                             concat_categorical=True, concat_continuous=True)

    keras.utils.set_random_seed(p["SEED"])
    dlrm = DLRM([rows[n] for n in CAT_NAMES], CAT_NAMES, CONT_NAMES, embedding_dim=p["EMBEDDING_DIM"],
                bottom_mlp=p["BOTTOM_MLP"], top_mlp=p["TOP_MLP"], embedding="sok", pad_interaction_to=16)
    dlrm.compile(optimizer=sok.optimizers.Adam(p["LEARNING_RATE"]),
                 loss=keras.losses.BinaryCrossentropy(from_logits=True))
    dlrm.fit(loader(), steps_per_epoch=p["STEPS"], epochs=1, verbose=0)
    dlrm_auc = evaluate(dlrm, loader(valid=True))["auc"]
    keras.utils.set_random_seed(p["SEED"])
    regression = LogisticRegression([rows[n] for n in CAT_NAMES], num_continuous=len(CONT_NAMES), log_continuous=True)
    regression.compile(optimizer=sok.optimizers.Adam(p["BASELINE_LEARNING_RATE"]))
    history = fit(regression, loader(), max_steps=p["STEPS"], eval_loader=loader(valid=True),
                  eval_interval=max(1, p["STEPS"] // p["EVALS"]), patience=2, restore_best_weights=True,
                  progress=False, verbose=0)
    assert dlrm_auc >= history.best_value + 0.01, (dlrm_auc, history.best_value)
    assert data.oracle_auc - dlrm_auc <= 0.01, (dlrm_auc, data.oracle_auc)
