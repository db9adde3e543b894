"""The ``slow`` tier of `tests.test_notebooks`: the notebooks at the larger sizes of
`tests/notebook_checks` (``LARGER``), whose point only shows on more data, and notebook 03 on a
MovieLens download's layout.

A file of its own: these are the longest tests of the suite, and `tests/conftest.py` hands them
out to the test workers first, so no worker starts one of them last while the others wait.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_notebooks import LARGER, SMOKE, run_notebook


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
