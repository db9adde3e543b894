from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sok_tutorial.data.categorify import Categorify
from sok_tutorial.data.convert import convert_files, to_parquet_dataset
from sok_tutorial.data.keyset import keyset_path, read_keyset
from sok_tutorial.data.schema import Schema, resolve_files


def _frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "user": rng.choice([f"u{i}" for i in range(30)], n),
        "item": rng.integers(1000, 1100, n),
        "price": rng.random(n),
        "tags": [list(rng.choice(["a", "b", "c", "d"], rng.integers(0, 3), replace=False)) for _ in range(n)],
        "click": rng.integers(0, 2, n),
    })


def _read(out) -> pd.DataFrame:
    return pa.concat_tables([pq.read_table(f) for f in resolve_files(out)]).to_pandas()


def test_dataframe_to_parts_with_categorify_and_schema(tmp_path):
    df = _frame(500, 0)
    cat = Categorify(["user", "item", "tags"])
    schema = to_parquet_dataset(df, tmp_path / "ds", cat_names=["user", "item"], cont_names=["price"],
                                label_names=["click"], list_names=["tags"], categorify=cat, num_parts=4,
                                chunk_size=64, progress=False)
    assert [c.kind for c in schema.columns] == ["categorical", "categorical", "continuous", "label", "list"]
    assert schema["user"].cardinality == 31 and schema["tags"].cardinality == 5
    assert len(schema.parts) == 4 and schema.num_rows == 500
    back = _read(tmp_path / "ds")
    expected = cat.transform(df).to_pandas()
    np.testing.assert_array_equal(back["user"], expected["user"])
    assert [list(t) for t in back["tags"]] == [list(t) for t in expected["tags"]]
    assert back["price"].dtype == np.float32 and back["click"].dtype == np.int8


def test_stream_of_files_larger_than_chunks(tmp_path):
    files = []
    for i in range(3):
        files.append(tmp_path / f"in{i}.parquet")
        pq.write_table(pa.Table.from_pandas(_frame(300, i), preserve_index=False), files[-1])
    cat = Categorify(["user"])
    schema = to_parquet_dataset([str(f) for f in files], tmp_path / "ds", cat_names=["user"],
                                cont_names=["price"], label_names=["click"], categorify=cat,
                                chunk_size=50, num_parts=2, progress=False)
    assert schema.num_rows == 900
    raw = pd.concat([_frame(300, i) for i in range(3)], ignore_index=True)
    np.testing.assert_array_equal(_read(tmp_path / "ds")["price"], raw["price"].astype(np.float32))


def test_one_pass_stream_needs_fitted_categorify(tmp_path):
    chunks = (_frame(10, i) for i in range(3))
    with pytest.raises(ValueError, match="one-pass stream"):
        to_parquet_dataset(chunks, tmp_path / "ds", cat_names=["user"], categorify=Categorify(["user"]),
                           progress=False)
    fitted = Categorify(["user"]).fit(_frame(50, 9))
    schema = to_parquet_dataset((_frame(10, i) for i in range(3)), tmp_path / "ds", cat_names=["user"],
                                label_names=["click"], categorify=fitted, progress=False)
    assert schema.num_rows == 30


def test_unknown_column_and_empty_selection_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['nope'\]"):
        to_parquet_dataset(_frame(5, 0), tmp_path / "ds", cat_names=["nope"], progress=False)
    with pytest.raises(ValueError, match="no columns selected"):
        to_parquet_dataset(_frame(5, 0), tmp_path / "ds", progress=False)
    with pytest.raises(ValueError, match="chunk_size=0"):
        to_parquet_dataset(_frame(5, 0), tmp_path / "ds", label_names=["click"], chunk_size=0, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_refused_by_its_argument_name(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"out_dir=.*ds' exists and is not empty"):
        to_parquet_dataset(_frame(5, 0), tmp_path / "ds", label_names=["click"], progress=False)
    assert [p.name for p in (tmp_path / "ds").iterdir()] == ["keep.txt"]


def test_strings_without_categorify_are_refused(tmp_path):
    with pytest.raises(TypeError, match="run Categorify"):
        to_parquet_dataset(_frame(5, 0), tmp_path / "ds", cat_names=["user"], progress=False)


def _write_inputs(tmp_path, n_files=3):
    files = []
    for i in range(n_files):
        files.append(tmp_path / f"in{i}.parquet")
        pq.write_table(pa.Table.from_pandas(_frame(200, i), preserve_index=False), files[-1])
    return files


def test_convert_files_one_part_per_file_with_keysets(tmp_path):
    files = _write_inputs(tmp_path)
    cat = Categorify(["user", "item"])
    schema = convert_files(files, tmp_path / "ds", cat_names=["user", "item"], cont_names=["price"],
                           label_names=["click"], categorify=cat, scheduler="synchronous",
                           keyset_columns=["user"], progress=False)
    assert [p["num_rows"] for p in schema.parts] == [200, 200, 200]
    for i, part in enumerate(resolve_files(tmp_path / "ds")):
        users = cat.transform(_frame(200, i))["user"].to_numpy()
        np.testing.assert_array_equal(read_keyset(keyset_path(part)), np.unique(users))


def test_convert_files_on_a_local_dask_cluster_matches_synchronous(tmp_path):
    files = _write_inputs(tmp_path, 2)
    kwargs = dict(cat_names=["user"], cont_names=["price"], label_names=["click"], progress=False)
    a = convert_files(files, tmp_path / "a", categorify=Categorify(["user"]), scheduler="synchronous", **kwargs)
    b = convert_files(files, tmp_path / "b", categorify=Categorify(["user"]), scheduler="local", n_workers=2, **kwargs)
    assert a.to_dict() == b.to_dict()
    pd.testing.assert_frame_equal(_read(tmp_path / "a"), _read(tmp_path / "b"))


def test_convert_files_bad_input_leaves_nothing(tmp_path):
    files = _write_inputs(tmp_path, 2)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(files[0].read_bytes()[:300])
    with pytest.raises(ValueError, match="corrupt.parquet"):
        convert_files([files[0], corrupt], tmp_path / "ds", cont_names=["price"], scheduler="synchronous",
                      progress=False)
    assert not (tmp_path / "ds").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ds")]
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        convert_files([tmp_path / "missing.parquet"], tmp_path / "ds", cont_names=["price"], progress=False)
    with pytest.raises(ValueError, match="scheduler='nowhere'"):
        convert_files(files, tmp_path / "ds", cont_names=["price"], scheduler="nowhere", progress=False)


def test_loads_back_through_schema(tmp_path):
    to_parquet_dataset(_frame(20, 0), tmp_path / "ds", cont_names=["price"], label_names=["click"],
                       metadata={"note": "x"}, progress=False)
    schema = Schema.load(tmp_path / "ds")
    assert schema.metadata == {"note": "x"} and schema.names == ["price", "click"]
