from __future__ import annotations

import os
import stat

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sok_tutorial.data.keyset import keyset_path, read_keyset
from sok_tutorial.data.schema import ColumnSchema, Schema, read_file_list, resolve_files
from sok_tutorial.data.writer import DatasetWriter


def _schema(**kw) -> Schema:
    return Schema([ColumnSchema("item", "categorical", "int64", cardinality=kw.get("card", 100)),
                   ColumnSchema("x", "continuous", "float32"),
                   ColumnSchema("tags", "list", "int64", max_nnz=kw.get("max_nnz")),
                   ColumnSchema("label", "label", "int8")])


def _chunk(rng: np.random.Generator, n: int, start: int = 0) -> dict:
    lengths = rng.integers(0, 4, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return {"item": np.arange(start, start + n) % 100, "x": rng.random(n).astype(np.float32),
            "tags": pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 50, offsets[-1]))),
            "label": rng.integers(0, 2, n)}


def test_contiguous_parts_keep_order_and_row_groups(tmp_path):
    rng = np.random.default_rng(0)
    out = tmp_path / "ds"
    with DatasetWriter(out, _schema(), num_parts=3, total_rows=1000, row_group_size=128) as w:
        for start in range(0, 1000, 170):
            w.write(_chunk(rng, min(170, 1000 - start), start))
    schema = Schema.load(out)
    assert [p["num_rows"] for p in schema.parts] == [333, 333, 334]
    files = read_file_list(out / "_file_list.txt")
    assert [f.name for f in files] == [p["file"] for p in schema.parts]
    items = np.concatenate([pq.read_table(f)["item"].to_numpy() for f in files])
    np.testing.assert_array_equal(items, np.arange(1000) % 100)
    meta = pq.ParquetFile(files[0]).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [128, 128, 77]
    assert schema["tags"].max_nnz == 3 and schema["item"].cardinality == 100


def test_streaming_without_total_deals_row_groups_round_robin(tmp_path):
    rng = np.random.default_rng(1)
    with DatasetWriter(tmp_path / "ds", _schema(), num_parts=2, row_group_size=100) as w:
        for start in range(0, 450, 90):
            w.write(_chunk(rng, 90, start))
    schema = Schema.load(tmp_path / "ds")
    assert schema.num_rows == 450
    assert [p["num_rows"] for p in schema.parts] == [250, 200]
    got = np.sort(np.concatenate([pq.read_table(f)["item"].to_numpy() for f in resolve_files(tmp_path / "ds")]))
    np.testing.assert_array_equal(got, np.sort(np.arange(450) % 100))


def test_dense_numpy_list_columns_and_slots(tmp_path):
    keys = np.arange(4 * 3 * 2).reshape(4, 3, 2)
    schema = Schema([ColumnSchema("f", "list", "int64", slots=3), ColumnSchema("y", "label", "int8")])
    with DatasetWriter(tmp_path / "ds", schema) as w:
        w.write({"f": keys, "y": np.zeros(4, np.int8)})
    loaded = Schema.load(tmp_path / "ds")
    assert (loaded["f"].slots, loaded["f"].max_nnz) == (3, 2)
    back = pq.read_table(tmp_path / "ds" / "part-00000.parquet")["f"].to_pylist()
    assert back == keys.tolist()


def test_keysets_use_global_offsets(tmp_path):
    schema = Schema([ColumnSchema("a", "categorical", "int64", cardinality=10, key_offset=0),
                     ColumnSchema("b", "categorical", "int64", cardinality=5, key_offset=10)])
    with DatasetWriter(tmp_path / "ds", schema, num_parts=2, total_rows=4, keyset_columns=["a", "b"]) as w:
        w.write({"a": [1, 1, 7, 9], "b": [0, 4, 4, 2]})
    files = resolve_files(tmp_path / "ds")
    assert read_keyset(keyset_path(files[0])).tolist() == [1, 10, 14]
    assert read_keyset(keyset_path(files[1])).tolist() == [7, 9, 12, 14]


def test_refuses_non_empty_output_unless_overwrite(tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        DatasetWriter(out, _schema())
    assert (out / "precious.txt").read_text() == "keep me"
    with pytest.raises(FileExistsError, match="did not write"):  # overwrite replaces only our own output
        DatasetWriter(out, _schema(), overwrite=True)
    assert (out / "precious.txt").read_text() == "keep me"
    (out / "precious.txt").unlink()
    for rows in (5, 7):  # an empty directory, then a dataset this library wrote
        with DatasetWriter(out, _schema(), overwrite=True) as w:
            w.write(_chunk(np.random.default_rng(0), rows))
        assert Schema.load(out).num_rows == rows


def test_failure_leaves_nothing_behind_and_keeps_previous(tmp_path):
    out = tmp_path / "ds"
    with DatasetWriter(out, _schema()) as w:
        w.write(_chunk(np.random.default_rng(0), 5))
    before = sorted(os.listdir(out))
    with pytest.raises(RuntimeError, match="boom"):
        with DatasetWriter(out, _schema(), overwrite=True) as w:
            w.write(_chunk(np.random.default_rng(1), 5))
            raise RuntimeError("boom")
    assert sorted(os.listdir(out)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no temporary siblings left


def test_ids_outside_declared_cardinality_fail_and_write_nothing(tmp_path):
    chunk = _chunk(np.random.default_rng(0), 10)
    with pytest.raises(ValueError, match="'item'.*cardinality=5"):
        with DatasetWriter(tmp_path / "ds", _schema(card=5)) as w:
            w.write(chunk)
    assert list(tmp_path.iterdir()) == []


def test_declared_max_nnz_is_enforced(tmp_path):
    with pytest.raises(ValueError, match="max_nnz=1"):
        with DatasetWriter(tmp_path / "ds", _schema(max_nnz=1)) as w:
            w.write(_chunk(np.random.default_rng(0), 50))


@pytest.mark.parametrize("kwargs, match", [
    ({"num_parts": 0}, "num_parts=0"),
    ({"row_group_size": -5}, "row_group_size=-5"),
    ({"num_parts": 4, "total_rows": 3}, "num_parts=4"),
])
def test_bad_sizes_are_named(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        DatasetWriter(tmp_path / "ds", _schema(), **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_missing_column_and_wrong_type_are_named(tmp_path):
    chunk = _chunk(np.random.default_rng(0), 4)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['x'\]"):
        with DatasetWriter(tmp_path / "a", _schema()) as w:
            w.write({k: v for k, v in chunk.items() if k != "x"})
    with pytest.raises(TypeError, match="'item'"):
        with DatasetWriter(tmp_path / "b", _schema()) as w:
            w.write({**chunk, "item": ["a", "b", "c", "d"]})


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_parent_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(PermissionError, match="not writable"):
            DatasetWriter(locked / "ds", _schema())
    finally:
        locked.chmod(stat.S_IRWXU)


def test_unwritable_path_is_named_even_as_root(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(PermissionError, match="path="):
        DatasetWriter(blocker / "ds", _schema())


def test_resolve_files_forms(tmp_path):
    with DatasetWriter(tmp_path / "ds", _schema(), num_parts=2, total_rows=6) as w:
        w.write(_chunk(np.random.default_rng(0), 6))
    by_dir = resolve_files(tmp_path / "ds")
    assert resolve_files(tmp_path / "ds" / "_file_list.txt") == by_dir
    assert resolve_files(str(tmp_path / "ds" / "part-*.parquet")) == by_dir
    assert resolve_files([str(f) for f in by_dir]) == by_dir
    with pytest.raises(FileNotFoundError, match="no parquet files"):
        resolve_files(tmp_path / "nothing-*.parquet")
