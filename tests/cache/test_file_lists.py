"""File lists for continuous training: consecutive parts, the union of their keysets beside each,
and how a stream of keysets grows the tables."""
from __future__ import annotations

import numpy as np
import pytest

from data_gen.criteo import write_criteo_parquet
from sok_tutorial.cache.file_lists import keyset_growth, write_file_lists
from sok_tutorial.data import ParquetLoader
from sok_tutorial.data.keyset import keyset_path, read_keyset
from sok_tutorial.data.schema import read_file_list, resolve_files

CARDS = [50 + 10 * i for i in range(26)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("lists") / "days"
    write_criteo_parquet(out, 5 * 200, cardinalities=CARDS, num_parts=5, keysets=True, progress=False)
    return out


def test_lists_name_consecutive_parts_with_the_union_of_their_keysets(dataset):
    parts = resolve_files(dataset)
    lists = write_file_lists(dataset, 2)
    assert [p.name for p, _ in lists] == ["file_list.0.txt", "file_list.1.txt", "file_list.2.txt"]
    assert [read_file_list(p) for p, _ in lists] == [parts[0:2], parts[2:4], parts[4:]]  # the rest: a shorter list
    for (path, keyset), first in zip(lists, (0, 2, 4)):
        assert keyset == keyset_path(path)
        expected = np.unique(np.concatenate([read_keyset(keyset_path(p)) for p in parts[first:first + 2]]))
        np.testing.assert_array_equal(read_keyset(keyset), expected)
    loader = ParquetLoader(lists[0][0], 64, ["label"], cat_names=["C1"], shuffle=False)
    assert loader.num_rows == 2 * 200  # the loader reads a list as it reads _file_list.txt


def test_missing_keysets_and_bad_sizes_fail_before_writing(dataset, tmp_path):
    with pytest.raises(ValueError, match="parts_per_list"):
        write_file_lists(dataset, 0)
    with pytest.raises(NotADirectoryError, match="dataset="):
        write_file_lists(tmp_path / "nowhere", 1)
    bare = tmp_path / "bare"
    write_criteo_parquet(bare, 2 * 100, cardinalities=CARDS, num_parts=2, progress=False)
    with pytest.raises(FileNotFoundError, match="no keyset beside the data files"):
        write_file_lists(bare, 1)
    assert not list(bare.glob("file_list.*"))


def test_keyset_growth_counts_new_and_seen_keys():
    rng = np.random.default_rng(0)
    keysets = [np.unique(rng.integers(0, 1000, 300)) for _ in range(4)]
    growth = keyset_growth(keysets)
    for i, row in enumerate(growth):
        earlier = np.unique(np.concatenate(keysets[:i])) if i else np.zeros(0, np.int64)
        assert row["keys"] == len(keysets[i])
        assert row["new keys"] == len(np.setdiff1d(keysets[i], earlier))
        assert row["keys seen so far"] == len(np.unique(np.concatenate(keysets[:i + 1])))
    assert keyset_growth([]) == []
