"""Every notebook runs end to end through papermill, and the numbers it wrote to metrics.json are checked.

Two sizes, chosen through each notebook's parameters:
- SMOKE, the fast tier (marker ``notebooks``): every notebook once, tiny, leaving out what other
  tests cover (speed sweeps, profiles, extra precisions, worker processes). Its check asserts what
  holds at any size: counts and shapes, numbers that must agree with each other, and what must be
  exact (N replicas equal one device, a restored or served model equals the trained one).
- LARGER, the ``slow`` tier (``multiprocess`` too where the notebook starts worker processes): the
  notebooks whose point only shows on more data (a model beating its baselines by a margin, early
  stopping, LRU keeping the AUC of an unbounded table, 16-bit tables training like 32-bit ones,
  worker processes). Its check adds those margins to the smoke check. Those runs are in
  `tests.test_notebooks_larger`. As a larger run asserts the smoke check too, the smoke run of
  such a notebook is marked ``superseded``, and ``make test-all`` leaves it out.

Each notebook's runs and checks live in `tests/notebook_checks/nbNN.py`; a notebook without one
fails. Speed ratios are printed by the notebooks and measured by ``benchmarks/``; here a ratio
is only asserted to have been measured (> 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.superseded) if n in LARGER else n
                                  for n in sorted(SMOKE)])
def test_notebook_smoke(name, tmp_path):
    params, metrics = run_notebook(name, tmp_path)
    SMOKE[name][1](metrics, params)
