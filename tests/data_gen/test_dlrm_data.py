"""`criteo_for_dlrm`: notebook 05's data, made once and reused, and its hashing plan."""
from __future__ import annotations

import pytest

from data_gen.criteo import CAT_NAMES
from data_gen.dlrm_data import criteo_for_dlrm


def test_a_second_call_reuses_every_file_and_another_interaction_strength_does_not(tmp_path):
    first = criteo_for_dlrm(tmp_path, 2000, 500, scale=0.001, num_parts=2, progress=False)
    files = [*first.train.glob("*.parquet"), *first.train_tfrecords, *first.valid_tfrecords]
    stamps = {f: f.stat().st_mtime_ns for f in files}
    again = criteo_for_dlrm(tmp_path, 2000, 500, scale=0.001, num_parts=2, progress=False)
    assert again == first and {f: f.stat().st_mtime_ns for f in files} == stamps
    other = criteo_for_dlrm(tmp_path, 2000, 500, scale=0.001, num_parts=2, interactions=0.5, progress=False)
    assert other.train != first.train and other.oracle_auc != first.oracle_auc
    assert other.cardinalities == first.cardinalities and other.train_rows == 2000 and 0 < other.click_rate < 1


def test_only_the_fields_above_the_threshold_are_hashed(tmp_path):
    data = criteo_for_dlrm(tmp_path, 1000, 500, scale=0.001, num_parts=1, tfrecords=False, progress=False)
    assert data.train_tfrecords == [] and data.valid_tfrecords == []
    hashed, rows = data.tables(fraction=2.0, hash_above=64)
    big = {n for n, c in zip(CAT_NAMES, data.cardinalities) if c > 64}
    assert set(hashed) == big and list(rows) == CAT_NAMES
    assert all(rows[n] == (2 * c if n in big else c) for n, c in zip(CAT_NAMES, data.cardinalities))
    assert data.tables(1.0, 10**9)[0] == {}  # nothing hashed
    with pytest.raises(ValueError, match="fraction"):
        data.tables(0.0, 64)


def test_bad_sizes_are_named(tmp_path):
    with pytest.raises(ValueError, match="valid_rows=0"):
        criteo_for_dlrm(tmp_path, 100, 0, progress=False)
    assert not any(tmp_path.iterdir())
