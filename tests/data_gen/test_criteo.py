from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_gen._common import AucAccumulator
from data_gen.criteo import (
    CAT_NAMES,
    CONT_NAMES,
    CriteoLike,
    hex_tokens,
    scaled_cardinalities,
    write_criteo_parquet,
    write_criteo_tsv,
)
from data_gen.criteo_tsv import iter_criteo_tsv
from sok_tutorial.data.schema import resolve_files


def _digest(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    kw = dict(cardinalities=scaled_cardinalities(0.001), num_parts=2, progress=False)
    write_criteo_parquet(tmp_path / "a", 70_000, seed=3, **kw)
    write_criteo_parquet(tmp_path / "b", 70_000, seed=3, **kw)
    write_criteo_parquet(tmp_path / "c", 70_000, seed=4, **kw)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a")["part-00000.parquet"] != _digest(tmp_path / "c")["part-00000.parquet"]


def test_rows_are_independent_of_how_many_are_generated():
    model = CriteoLike(seed=1)
    short = next(model.iter_blocks(1000))
    long = next(model.iter_blocks(200_000))
    for name in ["label", "I1", "C1"]:
        np.testing.assert_array_equal(short[name], long[name][:1000])


@pytest.fixture(scope="module")
def sample():
    model = CriteoLike(seed=0)
    return model, model.sample(65_536, 0)


def test_columns_and_types(sample):
    model, block = sample
    assert set(block) == {"label", "probability", *CONT_NAMES, *CAT_NAMES}
    for f, name in enumerate(CAT_NAMES):
        assert block[name].dtype == np.int64
        assert 0 <= block[name].min() and block[name].max() < model.cardinalities[f]
    assert all(block[n].dtype == np.float32 for n in CONT_NAMES)


def test_continuous_are_count_like_heavy_tailed_with_missing(sample):
    _, block = sample
    i12 = block["I12"]
    assert abs(np.isnan(i12).mean() - 0.76) < 0.02 and np.isnan(block["I2"]).sum() == 0
    for name in CONT_NAMES:
        x = block[name][~np.isnan(block[name])]
        assert np.all(x == np.floor(x))
        assert np.max(x) > 20 * max(np.median(x), 1)  # heavy tail
    assert block["I2"].min() < 0  # shifted, like Criteo's I2


def test_categorical_frequencies_follow_zipf(sample):
    model, block = sample
    counts = np.sort(np.bincount(block["C1"]))[::-1]
    ranks = np.arange(1, 201)
    slope = np.polyfit(np.log(ranks), np.log(counts[:200]), 1)[0]
    assert abs(slope + model.zipf_exponents[0]) < 0.15
    assert np.all(np.abs(model.zipf_exponents / model.zipf_exponent - 1) <= 0.15)
    assert np.ptp(model.zipf_exponents) > 0.05


def test_oracle_auc_is_the_auc_of_the_true_probability(sample):
    _, block = sample
    p, y = block["probability"], block["label"].astype(bool)
    order = np.argsort(p)
    ranks = np.empty(len(p))
    ranks[order] = np.arange(1, len(p) + 1)
    exact = (ranks[y].sum() - y.sum() * (y.sum() + 1) / 2) / (y.sum() * (~y).sum())
    acc = AucAccumulator()
    acc.update(p, y)
    assert abs(acc.auc() - exact) < 1e-4
    assert 0.75 < exact < 0.85
    assert abs(y.mean() - 0.25) < 0.02


def test_signal_controls_difficulty():
    aucs = []
    for signal in (0.5, 1.0, 2.0):
        block = CriteoLike(seed=0, signal=signal).sample(40_000)
        acc = AucAccumulator()
        acc.update(block["probability"], block["label"])
        aucs.append(acc.auc())
    assert aucs[0] < aucs[1] < aucs[2]


def test_parquet_dataset_schema_and_reuse(tmp_path):
    kw = dict(cardinalities=scaled_cardinalities(0.001), seed=0, progress=False)
    schema = write_criteo_parquet(tmp_path / "ds", 5000, **kw)
    assert schema.names_of("continuous") == CONT_NAMES and schema.names_of("categorical") == CAT_NAMES
    assert schema["C1"].cardinality == scaled_cardinalities(0.001)[0]
    assert 0.7 < schema.metadata["oracle_auc"] < 0.9
    before = _digest(tmp_path / "ds")
    mtime = (tmp_path / "ds" / "part-00000.parquet").stat().st_mtime_ns
    assert write_criteo_parquet(tmp_path / "ds", 5000, reuse=True, **kw).to_dict() == schema.to_dict()
    assert (tmp_path / "ds" / "part-00000.parquet").stat().st_mtime_ns == mtime
    with pytest.raises(FileExistsError, match=r"out_dir=.*overwrite=True"):
        write_criteo_parquet(tmp_path / "ds", 6000, reuse=True, **kw)  # parameters changed
    assert _digest(tmp_path / "ds") == before
    assert write_criteo_parquet(tmp_path / "ds", 6000, reuse=True, overwrite=True, **kw).num_rows == 6000


@pytest.mark.parametrize("kwargs, match", [
    ({"num_rows": 0}, "num_rows=0"),
    ({"num_rows": 10, "cardinalities": [5] * 3}, "3 entries"),
    ({"num_rows": 10, "cardinalities": [0] * 26}, r"cardinalities\[0\]=0"),
    ({"num_rows": 10, "seed": -1}, "seed=-1"),
    ({"num_rows": 10, "positive_rate": 1.5}, "positive_rate=1.5"),
])
def test_bad_arguments_are_named(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        write_criteo_parquet(tmp_path / "ds", progress=False, **kwargs)
    assert not (tmp_path / "ds").exists()


def test_tsv_matches_parquet_of_same_seed(tmp_path):
    kw = dict(cardinalities=scaled_cardinalities(0.001), seed=5, progress=False)
    files = write_criteo_tsv(tmp_path / "tsv", 3000, num_files=2, **kw)
    write_criteo_parquet(tmp_path / "pq", 3000, **kw)
    tsv = pa.concat_tables([t for f in files for t in iter_criteo_tsv(f)])
    ref = pa.concat_tables([pq.read_table(f) for f in resolve_files(tmp_path / "pq")])
    np.testing.assert_array_equal(tsv["label"].to_numpy(), ref["label"].to_numpy())
    np.testing.assert_array_equal(tsv["I3"].to_numpy(zero_copy_only=False), ref["I3"].to_numpy(zero_copy_only=False))
    assert tsv["C4"].to_pylist() == hex_tokens(3, ref["C4"].to_numpy()).to_pylist()
    assert (tmp_path / "tsv" / "metadata.json").is_file()


def test_hex_tokens_are_a_bijection_per_feature():
    ids = np.arange(100_000)
    tokens = hex_tokens(7, ids).to_pylist()
    assert len(set(tokens)) == len(ids) and all(len(t) == 8 for t in tokens)
    assert tokens[:3] != hex_tokens(8, ids[:3]).to_pylist()
