from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sok_tutorial.data.convert import to_parquet_dataset
from sok_tutorial.data.throughput import count_rows, rows_per_second, tensor_slices_dataset


def _dataset(path, rows: int = 50):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"item": rng.integers(0, 9, rows), "price": rng.random(rows),
                          "click": rng.integers(0, 2, rows)})
    frame.loc[::7, "price"] = np.nan
    to_parquet_dataset(frame, path, cat_names=["item"], cont_names=["price"], label_names=["click"], num_parts=2,
                       progress=False)
    return frame


def test_rows_per_second_times_the_second_pass_only():
    calls = []

    def one_pass() -> int:
        calls.append(1)
        return 10

    assert rows_per_second(one_pass) > 0 and len(calls) == 2
    assert rows_per_second(one_pass, warmup=False) > 0 and len(calls) == 3


def test_rows_per_second_refuses_an_empty_pass():
    with pytest.raises(ValueError, match="rows=0"):
        rows_per_second(lambda: 0)


def test_tensor_slices_dataset_fills_nans_and_keeps_every_row(tmp_path):
    frame = _dataset(tmp_path / "ds")
    ds = tensor_slices_dataset(tmp_path / "ds", 16, ["click"], cont_names=["price"], fill_nan=-1.0)
    batches = list(ds)
    assert count_rows(batches) == 50 and [int(y.shape[0]) for _, y in batches] == [16, 16, 16, 2]
    features = {k: np.concatenate([f[k].numpy() for f, _ in batches]) for k in ("item", "price")}
    labels = np.concatenate([y.numpy() for _, y in batches])
    assert set(batches[0][0]) == {"item", "price"} and labels.shape == (50, 1)
    np.testing.assert_array_equal(features["item"], frame["item"].to_numpy())
    np.testing.assert_allclose(features["price"], frame["price"].fillna(-1.0).to_numpy())
    np.testing.assert_array_equal(labels[:, 0], frame["click"].to_numpy())


def test_tensor_slices_dataset_shuffles_by_seed(tmp_path):
    _dataset(tmp_path / "ds")

    def order(seed):
        ds = tensor_slices_dataset(tmp_path / "ds", 50, ["click"], shuffle_buffer=50, seed=seed)
        return next(iter(ds))[0]["price"].numpy()

    first = order(1)
    np.testing.assert_array_equal(first, order(1))
    assert not np.array_equal(first, order(2), equal_nan=True)
    np.testing.assert_array_equal(np.sort(first), np.sort(order(2)))  # the same rows, in another order


@pytest.mark.parametrize("kw, match", [({"label_names": ["nope"]}, "nope"), ({"label_names": []}, "label_names"),
                                       ({"cont_names": ["nope"]}, "nope"), ({"batch_size": 0}, "batch_size")])
def test_tensor_slices_dataset_names_bad_arguments(tmp_path, kw, match):
    _dataset(tmp_path / "ds")
    args = {"batch_size": 8, "label_names": ["click"], **kw}
    with pytest.raises(ValueError, match=match):
        tensor_slices_dataset(tmp_path / "ds", **args)
