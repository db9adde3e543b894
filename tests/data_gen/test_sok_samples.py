from __future__ import annotations

import hashlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from data_gen.sok_samples import RaggedKeys, generate_random_samples, iter_random_samples, write_random_samples
from sok_tutorial.data.schema import resolve_files


def test_dense_keys_stay_in_their_slot_range():
    keys, labels = generate_random_samples(5000, vocabulary_size=8192, slot_num=100, max_nnz=10, seed=1)
    assert keys.shape == (5000, 100, 10) and keys.dtype == np.int64 and labels.shape == (5000,)
    per_slot = 8192 // 100
    np.testing.assert_array_equal(keys // per_slot, np.broadcast_to(np.arange(100)[None, :, None], keys.shape))
    assert set(np.unique(labels)) == {0, 1}


def test_masked_keys_are_ragged_with_empty_slots():
    keys, _ = generate_random_samples(3000, vocabulary_size=1000, slot_num=10, max_nnz=4, use_sparse_mask=True)
    assert isinstance(keys, RaggedKeys) and keys.lengths.shape == (3000, 10)
    assert keys.lengths.min() == 0 and keys.lengths.max() == 4
    assert len(keys.values) == keys.lengths.sum()
    slot_of = np.repeat(np.tile(np.arange(10), 3000), keys.lengths.reshape(-1))
    np.testing.assert_array_equal(keys.values // 100, slot_of)
    nested = keys.to_arrow().to_pylist()
    assert [len(s) for s in nested[7]] == keys.lengths[7].tolist()


def test_labels_carry_a_learnable_signal(tmp_path):
    schema = write_random_samples(tmp_path / "ds", 8192, 4096, 16, 4, progress=False)
    assert schema.metadata["oracle_auc"] > 0.7


def test_smaller_dataset_is_a_prefix_and_streaming_matches_memory():
    small, ls = generate_random_samples(100, 800, 8, 3, seed=2)
    big, lb = generate_random_samples(9000, 800, 8, 3, seed=2)
    np.testing.assert_array_equal(small, big[:100])
    np.testing.assert_array_equal(ls, lb[:100])
    streamed = np.concatenate([k for k, _ in iter_random_samples(9000, 800, 8, 3, seed=2)])
    np.testing.assert_array_equal(streamed, big)


@pytest.mark.parametrize("mask", [False, True])
def test_parquet_parts_hold_the_same_samples(tmp_path, mask):
    keys, labels = generate_random_samples(5000, 2000, 20, 5, use_sparse_mask=mask, seed=4)
    schema = write_random_samples(tmp_path / "ds", 5000, 2000, 20, 5, use_sparse_mask=mask, seed=4,
                                  num_parts=4, progress=False)
    assert len(schema.parts) == 4 and schema["feature"].slots == 20 and schema["feature"].max_nnz == 5
    assert schema["feature"].nnz == (None if mask else 5)  # fixed nnz is stored flat
    tables = [pq.read_table(f) for f in resolve_files(tmp_path / "ds")]
    back = [row for t in tables for row in t["feature"].to_pylist()]
    expected = keys.to_arrow().to_pylist() if mask else keys.reshape(len(keys), -1).tolist()
    assert back == expected
    np.testing.assert_array_equal(np.concatenate([t["label"].to_numpy() for t in tables]), labels)


def test_same_seed_same_bytes(tmp_path):
    for name in ("a", "b"):
        write_random_samples(tmp_path / name, 3000, 1000, 10, 3, use_sparse_mask=True, progress=False)
    digest = [hashlib.sha256((tmp_path / n / "part-00000.parquet").read_bytes()).hexdigest() for n in "ab"]
    assert digest[0] == digest[1]


@pytest.mark.parametrize("args, match", [
    ((10, 5, 10, 2), "vocabulary_size=5 is smaller than slot_num=10"),
    ((0, 100, 10, 2), "num_samples=0"),
    ((10, 100, 10, 0), "max_nnz=0"),
    ((10, -100, 10, 2), "vocabulary_size=-100"),
])
def test_bad_sizes_are_named(tmp_path, args, match):
    with pytest.raises(ValueError, match=match):
        generate_random_samples(*args)
    with pytest.raises(ValueError, match=match):
        write_random_samples(tmp_path / "ds", *args, progress=False)
    assert not (tmp_path / "ds").exists()
