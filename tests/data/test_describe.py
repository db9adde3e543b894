from __future__ import annotations

import pandas as pd
import pytest

from sok_tutorial.data.convert import to_parquet_dataset
from sok_tutorial.data.describe import disk_bytes, disk_mib, schema_table
from sok_tutorial.data.schema import ColumnSchema, Schema


def test_schema_table_shows_the_fields_some_column_sets(tmp_path):
    frame = pd.DataFrame({"user": [3, 1, 3, 2], "tags": [[1, 2], [], [3], [1]], "click": [0, 1, 1, 0]})
    schema = to_parquet_dataset(frame, tmp_path / "ds", cat_names=["user"], list_names=["tags"],
                                label_names=["click"], progress=False)
    table = schema_table(schema)
    assert list(table.index) == ["user", "click", "tags"]
    assert list(table.columns) == ["kind", "dtype", "max_nnz"]
    assert table.loc["tags", "max_nnz"] == 2 and table.loc["user", "max_nnz"] == ""


def test_schema_table_keeps_slots_and_key_offsets():
    schema = Schema((ColumnSchema("feature", "list", "int64", cardinality=8, slots=3, nnz=2, key_offset=10),))
    table = schema_table(schema)
    assert table.loc["feature"].to_dict() == {"kind": "list", "dtype": "int64", "cardinality": 8, "slots": 3,
                                              "key_offset": 10}


def test_disk_mib_counts_nested_files_and_single_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"0" * 2**20)
    (tmp_path / "y.bin").write_bytes(b"0" * 2**19)
    assert disk_mib(tmp_path) == 1.5 and disk_mib(tmp_path / "y.bin") == 0.5
    assert disk_bytes(tmp_path) == 3 * 2**19


def test_disk_mib_names_a_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        disk_mib(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="missing"):
        disk_bytes(tmp_path / "missing")
