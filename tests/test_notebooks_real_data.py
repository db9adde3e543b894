"""Notebooks pointed at real downloads: here a directory laid out like one (Criteo-format day
files, one of them gzipped, without the generator's metadata), so there is no oracle to compare
with, and a directory that holds no download at all."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest

from tests.test_notebooks import NOTEBOOKS, SMOKE, check_07

NB_07 = "07-continuous-training-cache"


def _run(name: str, tmp_path, **parameters) -> dict:
    import papermill as pm

    out = tmp_path / "out"
    params = {**SMOKE[name][0], "DATA_DIR": str(tmp_path / "data"), "OUTPUT_DIR": str(out), **parameters}
    pm.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(tmp_path / f"{name}.ipynb"), parameters=params,
                        cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False, log_output=False)
    return params


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
    params = _run(NB_07, tmp_path, CRITEO_DIR=str(download))
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
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
        _run(NB_07, tmp_path, CRITEO_DIR=str(empty))
    message = str(info.value)
    assert "FileNotFoundError" in message and str(empty) in message and "is empty" in message
    assert "day_0" in message and "train.txt" in message
    assert not (tmp_path / "out" / "metrics.json").exists()
