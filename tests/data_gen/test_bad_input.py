"""Every public entry point of `data_gen` fed bad input: the error type and a message naming the
argument; overwrite never deletes what this library did not write; out_dir is checked before
the (hours-long, on real Criteo) statistics pass."""
from __future__ import annotations

import subprocess
import sys

import pytest

from data_gen.criteo import write_criteo_parquet, write_criteo_tsv
from data_gen.criteo_tsv import iter_criteo_tsv, preprocess_criteo
from data_gen.movielens import (
    MalformedRatingsError,
    generate_movielens,
    iter_movielens,
    read_movielens,
    write_movielens,
)
from data_gen.sok_samples import generate_random_samples, write_random_samples


def _tsv(tmp_path):
    return write_criteo_tsv(tmp_path / "tsv", 50, cardinalities=[20] * 26, progress=False)


def _occupied(tmp_path):
    (tmp_path / "taken").mkdir(exist_ok=True)
    (tmp_path / "taken" / "thesis.tex").write_text("years of work")
    return tmp_path / "taken"


def _ml_1m(root, ratings: str):
    (root / "movies.dat").write_text("1::A (1999)::Drama\n")
    (root / "ratings.dat").write_text(ratings)
    return root


CASES = [
    ("movielens chunk_bytes 0", lambda t: list(iter_movielens(_ml_1m(t, "1::1::4::5\n"), chunk_bytes=0)), ValueError,
     r"chunk_bytes=0"),
    ("movielens empty ratings", lambda t: read_movielens(_ml_1m(t, "")), MalformedRatingsError,
     r"ratings.dat: holds no ratings"),
    ("movielens rating a word", lambda t: read_movielens(_ml_1m(t, "1::1::good::5\n")), MalformedRatingsError,
     r"ratings.dat:1: rating='good' is not a finite number"),
    ("criteo on_bad_lines", lambda t: list(iter_criteo_tsv(t / "x", on_bad_lines="ignore")), ValueError,
     r"on_bad_lines='ignore'"),
    ("criteo rows 0", lambda t: write_criteo_parquet(t / "o", 0, progress=False), ValueError, r"num_rows=0"),
    ("criteo parts 0", lambda t: write_criteo_parquet(t / "o", 10, num_parts=0, progress=False), ValueError,
     r"num_parts=0"),
    ("criteo positive_rate", lambda t: write_criteo_parquet(t / "o", 10, positive_rate=1.5, progress=False), ValueError,
     r"positive_rate=1\.5"),
    ("criteo cardinalities", lambda t: write_criteo_parquet(t / "o", 10, cardinalities=[5] * 3, progress=False),
     ValueError, r"cardinalities"),
    ("criteo overwrite other files", lambda t: write_criteo_parquet(_occupied(t), 10, overwrite=True, progress=False),
     FileExistsError, r"out_dir=.*did not write"),
    ("tsv files 0", lambda t: write_criteo_tsv(t / "o", 10, num_files=0, progress=False), ValueError, r"num_files=0"),
    ("tsv overwrite other files", lambda t: write_criteo_tsv(_occupied(t), 10, overwrite=True, progress=False),
     FileExistsError, r"out_dir=.*did not write"),
    ("preprocess no inputs", lambda t: preprocess_criteo([], t / "o"), ValueError, r"inputs=\[\]"),
    ("preprocess missing", lambda t: preprocess_criteo([t / "day_0"], t / "o"), FileNotFoundError, r"day_0"),
    ("preprocess min_count 0", lambda t: preprocess_criteo(_tsv(t), t / "o", min_count=0), ValueError,
     r"min_count=0"),
    ("preprocess bad lines", lambda t: preprocess_criteo(_tsv(t), t / "o", on_bad_lines="warn"), ValueError,
     r"on_bad_lines='warn'"),
    ("preprocess cross", lambda t: preprocess_criteo(_tsv(t), t / "o", feature_crosses=[("C1", "I1")]), ValueError,
     r"feature_crosses"),
    ("tsv reader bad lines", lambda t: next(iter_criteo_tsv(_tsv(t)[0], on_bad_lines="warn")), ValueError,
     r"on_bad_lines='warn'"),
    ("sok samples 0", lambda t: generate_random_samples(0, 10, 2, 1), ValueError, r"num_samples=0"),
    ("sok slot_num 0", lambda t: generate_random_samples(4, 10, 0, 1), ValueError, r"slot_num=0"),
    ("sok writer overwrite", lambda t: write_random_samples(_occupied(t), 4, 10, 2, 1, overwrite=True, progress=False),
     FileExistsError, r"out_dir=.*did not write"),
    ("movielens ratings 0", lambda t: generate_movielens(0), ValueError, r"num_ratings=0"),
    ("movielens overwrite", lambda t: write_movielens(_occupied(t), 100, overwrite=True, progress=False),
     FileExistsError, r"out_dir=.*did not write"),
    ("movielens read missing", lambda t: read_movielens(t / "none"), FileNotFoundError, r"none"),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_by_name(tmp_path, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(tmp_path)
    if (tmp_path / "taken").exists():
        assert (tmp_path / "taken" / "thesis.tex").read_text() == "years of work"


def test_preprocess_checks_out_dir_before_the_statistics_pass(tmp_path, monkeypatch):
    import data_gen.criteo_tsv as criteo_tsv

    files = _tsv(tmp_path)

    def no_reading(*args, **kwargs):
        raise AssertionError("the statistics pass ran before out_dir was checked")
    monkeypatch.setattr(criteo_tsv, "parallel_map", no_reading)
    with pytest.raises(FileExistsError, match=r"out_dir=.*exists and is not empty"):
        preprocess_criteo(files, _occupied(tmp_path), scheduler="synchronous", progress=False)


def test_preprocess_never_overwrites_the_directory_of_its_inputs(tmp_path):
    files = write_criteo_tsv(tmp_path / "days", 50, cardinalities=[20] * 26, progress=False)
    before = files[0].read_bytes()
    with pytest.raises(ValueError, match=r"out_dir=.*holds the input"):
        preprocess_criteo(files, tmp_path / "days", overwrite=True, scheduler="synchronous", progress=False)
    assert files[0].read_bytes() == before


def test_the_cli_refuses_to_overwrite_the_current_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    done = subprocess.run([sys.executable, "-m", "data_gen", "movielens", ".", "--ratings", "100",
                           "--overwrite", "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=_env())
    assert done.returncode == 2, done.stderr
    assert "out_dir=" in done.stderr and "did not write" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep"


def _env() -> dict:
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
