"""Every public entry point of `sok_tutorial.data` fed bad input: the error type, and a message that
names the argument (or the file) and what was expected. Also the data-loss defects of overwrite."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sok_tutorial.atomic import MARKER
from sok_tutorial.data import (
    Categorify,
    DatasetWriter,
    HashBucket,
    LoaderError,
    ParquetLoader,
    Schema,
    Workflow,
    convert_files,
    read_file_list,
    resolve_files,
    to_parquet_dataset,
)
from sok_tutorial.data.schema import ColumnSchema


def _frame(n: int = 8, label: list | None = None) -> pd.DataFrame:
    return pd.DataFrame({"item": np.arange(n) % 3, "x": np.linspace(0, 1, n),
                         "label": label if label is not None else [i % 2 for i in range(n)]})


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    to_parquet_dataset(_frame(), tmp_path / "ds", cat_names=["item"], cont_names=["x"], label_names=["label"],
                       cardinalities={"item": 3}, progress=False)
    return tmp_path / "ds"


def _schema() -> Schema:
    return Schema([ColumnSchema("item", "categorical", "int64", cardinality=3), ColumnSchema("label", "label", "int8")])


CASES = [
    # (id, call(tmp_path, dataset), exception, pattern naming the argument)
    ("loader batch_size 0", lambda t, d: ParquetLoader(d, 0, ["label"]), ValueError, r"batch_size=0"),
    ("loader batch_size str", lambda t, d: ParquetLoader(d, "8", ["label"]), ValueError, r"batch_size='8'"),
    ("loader negative rank", lambda t, d: ParquetLoader(d, 4, ["label"], global_rank=-1), ValueError,
     r"global_rank=-1"),
    ("loader rank >= size", lambda t, d: ParquetLoader(d, 4, ["label"], global_size=2, global_rank=2), ValueError,
     r"global_rank=2"),
    ("loader no labels", lambda t, d: ParquetLoader(d, 4, []), ValueError, r"label_names"),
    ("loader label_names ints", lambda t, d: ParquetLoader(d, 4, [1]), TypeError, r"label_names"),
    ("loader unknown column", lambda t, d: ParquetLoader(d, 4, ["label"], cat_names=["nope"]), LoaderError, r"nope"),
    ("loader missing path", lambda t, d: ParquetLoader(t / "absent", 4, ["label"]), FileNotFoundError,
     r"paths_or_dataset="),
    ("loader bad device", lambda t, d: ParquetLoader(d, 4, ["label"], device="tpu"), ValueError, r"device='tpu'"),
    ("loader bad label_range", lambda t, d: ParquetLoader(d, 4, ["label"], label_range=(1, 0)), ValueError,
     r"label_range=\(1, 0\)"),
    ("loader bad buffer_size", lambda t, d: ParquetLoader(d, 4, ["label"], buffer_size=-1), ValueError, r"buffer_size"),
    ("hash bucket 0", lambda t, d: HashBucket(0), ValueError, r"num_buckets=0"),
    ("writer num_parts 0", lambda t, d: DatasetWriter(t / "w", _schema(), num_parts=0), ValueError, r"num_parts=0"),
    ("writer total_rows < parts", lambda t, d: DatasetWriter(t / "w", _schema(), num_parts=3, total_rows=2),
     ValueError, r"num_parts=3"),
    ("convert no columns", lambda t, d: to_parquet_dataset(_frame(), t / "o", progress=False), ValueError,
     r"cat_names"),
    ("convert chunk_size 0", lambda t, d: to_parquet_dataset(_frame(), t / "o", label_names=["label"], chunk_size=0,
                                                             progress=False), ValueError, r"chunk_size=0"),
    ("convert unknown column", lambda t, d: to_parquet_dataset(_frame(), t / "o", label_names=["lbl"], progress=False),
     ValueError, r"lbl"),
    ("convert_files none", lambda t, d: convert_files([], t / "o", label_names=["label"]), ValueError, r"files=\[\]"),
    ("convert_files missing", lambda t, d: convert_files([t / "x.parquet"], t / "o", label_names=["label"]),
     FileNotFoundError, r"x\.parquet"),
    ("schema load missing", lambda t, d: Schema.load(t), FileNotFoundError, r"schema\.json"),
    ("categorify load missing", lambda t, d: Categorify.load(t / "nothing"), FileNotFoundError, r"path="),
    ("workflow load missing", lambda t, d: Workflow.load(t / "nothing"), FileNotFoundError, r"path="),
    ("resolve nothing", lambda t, d: resolve_files(str(t / "*.parquet")), FileNotFoundError, r"paths_or_dataset="),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_by_name(tmp_path, dataset, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(tmp_path, dataset)


def test_a_single_name_is_one_column_not_its_characters(tmp_path, dataset):
    features, labels = next(iter(ParquetLoader(dataset, 4, "label", cat_names="item", shuffle=False)))
    assert labels.shape == (4, 1) and list(features) == ["item"]
    schema = to_parquet_dataset(_frame(), tmp_path / "one", cat_names="item", label_names="label",
                                cardinalities={"item": 3}, progress=False)
    assert schema.names == ["item", "label"]
    assert Workflow(cat_names="item").cat_names == ["item"]


@pytest.mark.parametrize("label,pattern", [([0, 1, math.nan, 1, 0, 1, 0, 1], r"1 NaN or infinite"),
                                           ([0, 1, 2, 1, 0, 1, 0, 1], r"outside label_range")])
def test_nan_or_out_of_domain_labels_are_refused_by_column(tmp_path, label, pattern):
    path = tmp_path / "part.parquet"  # float NaN values, not nulls (nulls are refused as before)
    pq.write_table(pa.table({"item": np.arange(8) % 3, "label": pa.array(label, pa.float32(), from_pandas=False)}),
                   path)
    with pytest.raises(LoaderError, match="label column 'label' of .*" + pattern):
        list(ParquetLoader(path, 4, ["label"], cat_names=["item"]))
    if "range" in pattern:  # regression labels: any finite value with label_range=None
        assert len(list(ParquetLoader(path, 4, ["label"], cat_names=["item"], label_range=None))) == 2


def test_corrupt_json_names_the_file(dataset):
    (dataset / "schema.json").write_text('{"columns": [')
    with pytest.raises(ValueError, match=r"schema\.json.* not valid JSON"):
        Schema.load(dataset)


def test_a_file_list_entry_that_leaves_its_directory_is_refused(tmp_path, dataset):
    outside = tmp_path / "elsewhere.parquet"
    pq.write_table(pa.table({"label": [0, 1]}), outside)
    (dataset / "_file_list.txt").write_text("1\n../elsewhere.parquet\n")
    with pytest.raises(ValueError, match=r"leave its directory"):
        read_file_list(dataset / "_file_list.txt")
    with pytest.raises(ValueError, match=r"\.\./elsewhere\.parquet"):
        ParquetLoader(dataset, 4, ["label"])
    (dataset / "_file_list.txt").write_text(f"1\n{outside}\n")  # absolute entries are taken as they are
    assert read_file_list(dataset / "_file_list.txt") == [outside]


# ---------------------------------------------------------------- overwrite deletes only our own output
def test_overwrite_refuses_a_directory_of_other_files(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"out_dir=.*did not write.*notes\.txt"):
        to_parquet_dataset(_frame(), target, label_names=["label"], overwrite=True, progress=False)
    assert (target / "notes.txt").read_text() == "keep me"


def test_overwrite_replaces_a_dataset_this_library_wrote(dataset):
    assert (dataset / MARKER).is_file()
    schema = to_parquet_dataset(_frame(4), dataset, label_names=["label"], overwrite=True, progress=False)
    assert schema.num_rows == 4 and Schema.load(dataset).num_rows == 4


def test_overwrite_never_deletes_the_input_it_reads(tmp_path, dataset):
    source = dataset / "part-00000.parquet"
    before = source.read_bytes()
    with pytest.raises(ValueError, match=r"out_dir=.*holds the input"):
        to_parquet_dataset(str(source), dataset, label_names=["label"], overwrite=True, progress=False)
    with pytest.raises(ValueError, match=r"out_dir=.*holds the input"):
        convert_files([source], dataset, label_names=["label"], overwrite=True, scheduler="synchronous",
                      progress=False)
    assert source.read_bytes() == before


def test_overwrite_of_the_current_directory_is_refused_cleanly(tmp_path, monkeypatch):
    (tmp_path / "code.py").write_text("print(1)")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileExistsError, match=r"out_dir=.*did not write"):
        to_parquet_dataset(_frame(), ".", label_names=["label"], overwrite=True, progress=False)
    assert (tmp_path / "code.py").is_file()


def test_out_dir_is_checked_before_the_data_is_read(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    reads = []

    def chunks():
        reads.append(1)
        yield _frame()
    with pytest.raises(FileExistsError, match=r"out_dir="):
        to_parquet_dataset(chunks(), tmp_path / "taken", label_names=["label"], categorify=Categorify(["item"]),
                           progress=False)
    assert not reads
    with pytest.raises(FileExistsError, match=r"out_dir="):  # before the categorify fit pass
        convert_files(_two_files(tmp_path), tmp_path / "taken", label_names=["label"], cat_names=["item"],
                      categorify=_ExplodingCategorify(), progress=False, scheduler="synchronous")


def _two_files(tmp_path: Path) -> list[Path]:
    files = []
    for i in range(2):
        files.append(tmp_path / f"in{i}.parquet")
        pq.write_table(pa.Table.from_pandas(_frame(), preserve_index=False), files[-1])
    return files


class _ExplodingCategorify(Categorify):
    """A Categorify whose fit would fail loudly: the destination must be refused before it runs."""

    def __init__(self):
        super().__init__(["item"])

    def merge(self, other):  # noqa: ARG002
        raise AssertionError("the fit pass ran before out_dir was checked")


def test_writing_after_close_is_an_error_not_lost_rows(tmp_path):
    writer = DatasetWriter(tmp_path / "w", _schema())
    writer.write({"item": np.arange(3), "label": np.array([0, 1, 0])})
    writer.close()
    with pytest.raises(RuntimeError, match=r"DatasetWriter\(path=.*\) is closed"):
        writer.write({"item": np.arange(3), "label": np.array([0, 1, 0])})
    assert Schema.load(tmp_path / "w").num_rows == 3


def test_a_killed_writers_temporary_directory_is_cleaned_by_the_next_write(tmp_path, dataset):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stale = tmp_path / f".ds.tmp-{_host()}-{child.pid}-{'a' * 12}"
    child.kill()
    child.wait()
    stale.mkdir()
    (stale / "part-00000.parquet").write_bytes(b"half")
    live = tmp_path / f".ds.tmp-{_host()}-{os.getpid()}-{'b' * 12}"  # this process: alive, stays
    live.mkdir()
    to_parquet_dataset(_frame(), dataset, label_names=["label"], overwrite=True, progress=False)
    assert not stale.exists() and live.exists()


def _host() -> str:
    from sok_tutorial import atomic

    return atomic._HOST
