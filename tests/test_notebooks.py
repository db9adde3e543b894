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

Each notebook's runs and checks live in `tests/notebook_checks/nbNN.py`; a notebook without one
fails. Speed ratios are printed by the notebooks and measured by ``benchmarks/``; here a ratio
is only asserted to have been measured (> 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.notebook_checks import collect

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SMOKE, LARGER = collect()


def test_every_notebook_has_a_smoke_test():
    names = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
    assert names, "no notebooks found"
    missing = [n for n in names if n not in SMOKE]
    assert not missing, f"notebooks without a module in tests/notebook_checks: {missing}"
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
    pm.execute_notebook(
        str(NOTEBOOKS / f"{name}.ipynb"),
        str(tmp_path / f"{name}.ipynb"),
        parameters=params,
        cwd=str(NOTEBOOKS),
        kernel_name="python3",
        progress_bar=False,
        log_output=False,
    )
    return params, json.loads((out / "metrics.json").read_text())


@pytest.mark.notebooks
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_notebook_smoke(name, tmp_path):
    params, metrics = run_notebook(name, tmp_path)
    SMOKE[name][1](metrics, params)


@pytest.mark.notebooks
@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.multiprocess) if n[:3] in ("06-", "08-") else n for n in sorted(LARGER)]
)
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
    (data / "movies.dat").write_text(
        "".join(f"{m}::Movie {m} (1999)::{'|'.join(rng.choice(genres, 2, False))}\n" for m in range(1, 61)),
        encoding="latin-1",
    )
    users, movies = rng.integers(1, 81, 12_000), rng.integers(1, 61, 12_000)
    stars = np.clip(np.round(3 + (users % 3 - 1) + (movies % 2) + rng.normal(0, 0.7, 12_000)), 1, 5).astype(int)
    (data / "ratings.dat").write_text(
        "".join(f"{u}::{m}::{r}::{978300000 + i}\n" for i, (u, m, r) in enumerate(zip(users, movies, stars)))
    )
    _, m = run_notebook("03-training-overview-movielens", tmp_path, MAX_EPOCHS=3, DATA_DIR=str(data))
    assert m["layout"] == "ml-1m" and m["oracle_auc"] is None and m["auc_gap"] is None
    assert m["train_rows"] + m["valid_rows"] == 12_000 and m["export_max_abs_diff"] < 1e-6
    assert m["final_auc"] > 0.6  # the planted user and movie effects are learnable
