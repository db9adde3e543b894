"""Notebooks pointed at real downloads: here a directory laid out like one (Criteo-format day
files, one of them gzipped, without the generator's metadata), so there is no oracle to compare
with, and a directory that holds no download at all.

The readers behind these paths have their own tests (tests/data_gen: MovieLens layouts, Criteo
day files, gzip, Kaggle's train.txt, a vocabulary fitted on the training rows); these runs check
that each notebook takes the path end to end, and are the ``slow`` tier."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest

from tests.notebook_checks.nb05 import check_05
from tests.notebook_checks.nb07 import check_07
from tests.test_notebooks import SMOKE, run_notebook

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]

NB_05 = "05-dlrm-native-vs-accelerated"
NB_07 = "07-continuous-training-cache"


def _criteo_download(root, rows_per_day: int, days: int, scale: float) -> None:
    """Day files as the 1TB set has them: ``day_<n>``, one gzipped, no metadata.json."""
    from data_gen.criteo import scaled_cardinalities, write_criteo_tsv

    files = write_criteo_tsv(root, rows_per_day * days, num_files=days, cardinalities=scaled_cardinalities(scale),
                             seed=3, progress=False)
    for extra in root.iterdir():
        if extra not in files:
            extra.unlink()  # metadata.json (the oracle) and the writer's marker
    with open(files[2], "rb") as src, gzip.open(root / "day_2.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    files[2].unlink()


def test_notebook_07_on_a_real_criteo_layout(tmp_path):
    smoke = SMOKE[NB_07][0]
    days = 6 * smoke["DAYS_PER_LIST"]
    download = tmp_path / "criteo"
    _criteo_download(download, smoke["ROWS_PER_DAY"], days, smoke["CRITEO_SCALE"])
    params, m = run_notebook(NB_07, tmp_path, CRITEO_DIR=str(download))
    assert m["oracle_auc"] is None and m["real_data"] is True
    assert all(a > 0.6 for run in m["auc"].values() for a in run)  # the generated clicks are learnable
    check_07({**m, "oracle_auc": 1.0}, params)  # every other invariant of the cache; without an oracle AUC <= 1
    taken = sorted(p.name for p in (tmp_path / "data").glob("criteo-real-*/day_*"))
    assert taken == [f"day_{i}" for i in range(days)]


def test_notebook_07_names_the_expected_files_when_criteo_dir_holds_none(tmp_path):
    import papermill as pm

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(pm.PapermillExecutionError) as info:
        run_notebook(NB_07, tmp_path, CRITEO_DIR=str(empty))
    message = str(info.value)
    assert "FileNotFoundError" in message and str(empty) in message and "is empty" in message
    assert "day_0" in message and "train.txt" in message
    assert not (tmp_path / "out" / "metrics.json").exists()


NB_03 = "03-training-overview-movielens"


def _ml_100k(root, ratings: int = 6000) -> None:
    """The ml-100k layout: ``u.data`` (user, item, rating, time; tabs) and ``u.item`` (pipes, the
    last 19 fields the 'unknown' flag and the 18 genre flags)."""
    import numpy as np

    rng = np.random.default_rng(1)
    root.mkdir()
    flags = rng.random((80, 19)) < 0.15
    (root / "u.item").write_text("".join(
        f"{m}|Movie {m} (1995)|01-Jan-1995||http://example.org|" + "|".join(str(int(f)) for f in flags[m - 1]) + "\n"
        for m in range(1, 81)), encoding="latin-1")
    users, movies = rng.integers(1, 121, ratings), rng.integers(1, 81, ratings)
    stars = np.clip(np.round(3 + (users % 3 - 1) + (movies % 2) + rng.normal(0, 0.7, ratings)), 1, 5).astype(int)
    (root / "u.data").write_text("".join(f"{u}\t{m}\t{r}\t{881250949 + 7 * i}\n"
                                         for i, (u, m, r) in enumerate(zip(users, movies, stars))))


def test_notebook_03_on_an_ml_100k_layout_with_baselines_beside_the_model(tmp_path):
    _ml_100k(tmp_path / "ml-100k")
    _, m = run_notebook(NB_03, tmp_path, MOVIELENS_DIR=str(tmp_path / "ml-100k"), MAX_EPOCHS=4, LEARNING_RATE=0.01)
    assert m["layout"] == "ml-100k" and m["oracle_auc"] is None and m["train_rows"] + m["valid_rows"] == 6000
    assert abs(m["final_auc"] - m["best_auc"]) < 1e-6 and m["final_auc"] > 0.6  # user and movie effects are planted
    assert 0.5 < m["popularity_auc"] < m["logistic_auc"]  # the users' effects are only in the regression
    assert m["export_max_abs_diff"] < 1e-6


@pytest.mark.parametrize("layout", ["missing", "other"])
def test_notebook_03_lists_the_expected_files_when_movielens_dir_holds_none(tmp_path, layout):
    import papermill as pm

    target = tmp_path / "ml"
    if layout == "other":
        target.mkdir()
        (target / "ratings.parquet").write_bytes(b"")
    with pytest.raises(pm.PapermillExecutionError) as info:
        run_notebook(NB_03, tmp_path, MOVIELENS_DIR=str(target))
    message = str(info.value)
    assert "FileNotFoundError" in message and str(target) in message
    assert "u.data + u.item (ml-100k)" in message and "ratings.dat + movies.dat" in message
    assert ("does not exist" if layout == "missing" else "found ratings.parquet") in message
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_notebook_05_on_a_kaggle_train_txt_fits_its_vocabulary_on_the_training_rows(tmp_path):
    """Kaggle's layout: one gzipped ``train.txt``; ROWS training rows, then VALID_ROWS after them."""
    from data_gen.criteo import scaled_cardinalities, write_criteo_tsv

    smoke = SMOKE[NB_05][0]
    download = tmp_path / "kaggle"
    [day] = write_criteo_tsv(download, smoke["ROWS"] + smoke["VALID_ROWS"] + 500,
                             cardinalities=scaled_cardinalities(smoke["CRITEO_SCALE"]), seed=5, progress=False)
    with open(day, "rb") as src, gzip.open(download / "train.txt.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    for extra in list(download.iterdir()):
        if extra.name != "train.txt.gz":
            extra.unlink()
    params, m = run_notebook(NB_05, tmp_path, CRITEO_DIR=str(download), MIN_COUNT=2)
    assert m["oracle_auc"] is None and m["real_data"] is True
    check_05({**m, "oracle_auc": 1.0}, params)  # speed, phases, losses and AUCs as on generated data
    data = next((tmp_path / "data").glob("criteo-dlrm-real-*"))
    train, valid = (json.loads((data / f"{part}-min2" / "source.json").read_text()) for part in ("train", "valid"))
    assert [f[0] for f in train["files"]] == ["day_0", "day_1"] and [f[0] for f in valid["files"]] == ["day_2"]
    assert valid["vocabulary_from"].endswith("categorify")  # validation ids come from the training vocabulary
