from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernels.hash_bucket import hash_bucket
from sok_tutorial.data.categorify import Categorify
from sok_tutorial.data.loader_base import LoaderCore, LoaderError
from sok_tutorial.data.schema import ColumnSchema, Schema
from sok_tutorial.data.transforms import HashBucket
from sok_tutorial.data.writer import DatasetWriter

ROWS = 2_345


def _lists(rng, n, max_len):
    lengths = rng.integers(0, max_len + 1, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 1000, offsets[-1])))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """3 parts, row groups of 100 rows; row_id identifies rows; tags ragged; slots nested."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("loader") / "ds"
    schema = Schema([ColumnSchema("row_id", "categorical", "int64"), ColumnSchema("item", "categorical", "int64"),
                     ColumnSchema("x", "continuous", "float32"), ColumnSchema("tags", "list", "int64"),
                     ColumnSchema("slots", "list", "int64", slots=3), ColumnSchema("y", "label", "int8")])
    inner = _lists(rng, ROWS * 3, 2)
    nested = pa.ListArray.from_arrays(pa.array(np.arange(0, ROWS * 3 + 1, 3, dtype=np.int32)), inner)
    with DatasetWriter(path, schema, num_parts=3, total_rows=ROWS, row_group_size=100) as w:
        w.write({"row_id": np.arange(ROWS), "item": rng.integers(-2**62, 2**62, ROWS), "x": rng.random(ROWS),
                 "tags": _lists(rng, ROWS, 4), "slots": nested, "y": rng.integers(0, 2, ROWS)})
    return path


def _table(path) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in sorted(path.glob("*.parquet"))]).sort_by("row_id")


def _core(path, **kw) -> LoaderCore:
    """A loader over the test dataset, on the host unless `device` is given ("auto" would take a
    visible GPU, and these tests compare NumPy batches; the GPU path has its own parity test)."""
    kw.setdefault("device", "cpu")
    kw.setdefault("cat_names", ["row_id", "item"])
    kw.setdefault("cont_names", ["x"])
    return LoaderCore(path, kw.pop("batch_size", 128), ["y"], **kw)


def _ids(core: LoaderCore, epoch: int | None = None) -> list[np.ndarray]:
    return [b["row_id"].copy() for b in core.iterate(lambda b: b, prefetch=2, epoch=epoch)]


@pytest.mark.parametrize("global_size, batch_size, parts_per_chunk", [(1, 128, 1), (2, 100, 3), (3, 333, 2), (4, 7, 1)])
def test_every_row_exactly_once_across_disjoint_ranks(dataset, global_size, batch_size, parts_per_chunk):
    seen = []
    for rank in range(global_size):
        core = _core(dataset, batch_size=batch_size, global_size=global_size, global_rank=rank,
                     parts_per_chunk=parts_per_chunk)
        batches = _ids(core)
        assert len(batches) == len(core)
        assert all(len(b) == batch_size for b in batches[:-1]) and 0 < len(batches[-1]) <= batch_size
        seen.append(np.concatenate(batches))
    for a in range(global_size):
        for b in range(a + 1, global_size):
            assert not set(seen[a]) & set(seen[b])
    everything = np.sort(np.concatenate(seen))
    np.testing.assert_array_equal(everything, np.arange(ROWS))
    assert max(map(len, seen)) - min(map(len, seen)) <= 1


def test_order_is_seeded_reproducible_and_changes_per_epoch(dataset):
    first = np.concatenate(_ids(_core(dataset, seed=7)))
    again = np.concatenate(_ids(_core(dataset, seed=7)))
    np.testing.assert_array_equal(first, again)
    core = _core(dataset, seed=7)
    epoch0, epoch1 = np.concatenate(_ids(core)), np.concatenate(_ids(core))
    np.testing.assert_array_equal(epoch0, first)
    assert not np.array_equal(epoch0, epoch1) and np.array_equal(np.sort(epoch0), np.sort(epoch1))
    np.testing.assert_array_equal(np.concatenate(_ids(core, epoch=1)), epoch1)  # replay an epoch
    other_seed = np.concatenate(_ids(_core(dataset, seed=8)))
    assert not np.array_equal(first, other_seed)
    # rows are permuted within chunks, not only row groups reordered
    assert (np.abs(np.diff(first)) == 1).mean() < 0.1


def test_without_shuffle_rows_come_in_file_order(dataset):
    ids = np.concatenate(_ids(_core(dataset, shuffle=False)))
    np.testing.assert_array_equal(ids, np.arange(ROWS))


@pytest.mark.parametrize("drop_last", [False, True])
def test_last_partial_batch_kept_or_dropped(dataset, drop_last):
    core = _core(dataset, batch_size=1000, drop_last=drop_last)
    sizes = [len(b) for b in _ids(core)]
    assert sizes == ([1000, 1000] if drop_last else [1000, 1000, 345]) and len(core) == len(sizes)


def test_ragged_and_slotted_lists_are_exact(dataset):
    ref = _table(dataset)
    tags, slots = ref["tags"].to_pylist(), ref["slots"].to_pylist()
    core = _core(dataset, list_names=["tags", "slots"], batch_size=97)
    for batch in core.iterate(lambda b: b, prefetch=2):
        ids = batch["row_id"]
        t, s = batch["tags"], batch["slots"]
        assert t.slots is None and s.slots == 3 and len(s.offsets) == 3 * len(ids) + 1
        for i, row in enumerate(ids):
            assert t.values[t.offsets[i]:t.offsets[i + 1]].tolist() == tags[row]
            got = [s.values[s.offsets[3 * i + k]:s.offsets[3 * i + k + 1]].tolist() for k in range(3)]
            assert got == slots[row]


def test_fixed_nnz_columns_are_stored_flat_and_read_as_slots(tmp_path):
    keys = np.arange(6 * 3 * 2).reshape(6, 3, 2)
    schema = Schema([ColumnSchema("f", "list", "int64", slots=3, nnz=2), ColumnSchema("y", "label", "int8")])
    with DatasetWriter(tmp_path / "ds", schema) as w:
        w.write({"f": keys.reshape(6, 6), "y": np.zeros(6)})
    assert pq.read_schema(tmp_path / "ds" / "part-00000.parquet").field("f").type == pa.list_(pa.int64())
    dense = next(LoaderCore(tmp_path / "ds", 6, ["y"], list_names=["f"], sparse_as_dense=True, shuffle=False,
                            device="cpu").iterate(lambda b: b, prefetch=1))["f"]
    np.testing.assert_array_equal(dense, keys)
    rag = next(LoaderCore(tmp_path / "ds", 6, ["y"], list_names=["f"], shuffle=True, seed=1, device="cpu")
               .iterate(lambda b: b, prefetch=1))["f"]
    assert rag.slots == 3 and rag.offsets.tolist() == list(range(0, 37, 2))
    with pytest.raises(ValueError, match="slots=3 x nnz=2 needs 6"):
        with DatasetWriter(tmp_path / "bad", schema) as w:
            w.write({"f": pa.array([[1, 2, 3]] * 6), "y": np.zeros(6)})


def test_sparse_as_dense_pads_with_zero(dataset):
    ref = _table(dataset)
    core = _core(dataset, list_names=["tags", "slots"], sparse_as_dense=True, shuffle=False, batch_size=50)
    batch = next(core.iterate(lambda b: b, prefetch=1))
    assert batch["tags"].shape == (50, 4) and batch["slots"].shape == (50, 3, 2)
    for i in range(50):
        row = ref["tags"][i].as_py()
        assert batch["tags"][i].tolist() == row + [0] * (4 - len(row))


def test_transforms_hash_and_categorify(dataset):
    ref = _table(dataset)
    core = _core(dataset, shuffle=False, transforms=[HashBucket(50, columns=["item"])], batch_size=ROWS)
    batch = next(core.iterate(lambda b: b, prefetch=1))
    np.testing.assert_array_equal(batch["item"], hash_bucket(ref["item"].to_numpy(), 50))
    np.testing.assert_array_equal(batch["row_id"], np.arange(ROWS))  # other columns untouched
    cat = Categorify(["item"], freq_threshold=1).fit({"item": ref["item"].to_numpy()[:1000]})
    core = _core(dataset, shuffle=False, transforms=[cat], batch_size=ROWS)
    batch = next(core.iterate(lambda b: b, prefetch=1))
    expected = cat.transform({"item": ref["item"]})["item"].to_numpy()
    np.testing.assert_array_equal(batch["item"], expected)
    assert (batch["item"][1000:] == 0).mean() > 0.99  # unseen keys -> OOV row


def test_nan_is_an_error_or_filled(tmp_path):
    pq.write_table(pa.table({"x": pa.array([1.0, None, float("nan"), 4.0], pa.float32()), "y": [0, 1, 0, 1]}),
                   tmp_path / "a.parquet")
    core = LoaderCore(tmp_path / "a.parquet", 4, ["y"], cont_names=["x"])
    with pytest.raises(LoaderError, match=r"column 'x' of '.*a.parquet' has 2 missing/NaN values.*fill_nan"):
        next(core.iterate(lambda b: b, prefetch=1))
    core = LoaderCore(tmp_path / "a.parquet", 4, ["y"], cont_names=["x"], fill_nan=-1.0, shuffle=False)
    assert next(core.iterate(lambda b: b, prefetch=1))["x"].tolist() == [1.0, -1.0, -1.0, 4.0]


def test_lists_longer_than_max_nnz_error_or_truncate(dataset):
    with pytest.raises(LoaderError, match=r"column 'tags' .* more than max_nnz=2.*truncate_lists=True"):
        list(_core(dataset, list_names=["tags"], max_nnz={"tags": 2}).iterate(lambda b: b, prefetch=1))
    core = _core(dataset, list_names=["tags"], max_nnz={"tags": 2}, truncate_lists=True, shuffle=False,
                 batch_size=ROWS)
    batch = next(core.iterate(lambda b: b, prefetch=1))
    ref = _table(dataset)["tags"].to_pylist()
    t = batch["tags"]
    assert [t.values[t.offsets[i]:t.offsets[i + 1]].tolist() for i in range(ROWS)] == [r[:2] for r in ref]


def test_early_stop_leaves_no_thread_behind(dataset):
    before = threading.active_count()
    core = _core(dataset, batch_size=10)
    for i, _ in enumerate(core.iterate(lambda b: b, prefetch=2)):
        if i == 3:
            break
    gc.collect()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before, [t.name for t in threading.enumerate()]


def test_an_error_in_a_background_thread_surfaces_with_its_traceback(tmp_path):
    good = pa.table({"a": np.arange(1000), "y": np.zeros(1000)})
    pq.write_table(good, tmp_path / "good.parquet", row_group_size=100)
    raw = bytearray((tmp_path / "good.parquet").read_bytes())
    raw[400:2000] = b"\x00" * 1600  # damage early row groups, keep the footer readable
    (tmp_path / "bad.parquet").write_bytes(bytes(raw))
    core = LoaderCore([tmp_path / "good.parquet", tmp_path / "bad.parquet"], 100, ["y"], cat_names=["a"],
                      shuffle=False)
    with pytest.raises(LoaderError, match=r"bad.parquet") as info:
        list(core.iterate(lambda b: b, prefetch=1))
    assert "read_segment" in "".join(__import__("traceback").format_tb(info.value.__traceback__))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch_size": 0}, ValueError, "batch_size=0"),
    ({"global_size": 2, "global_rank": 2}, ValueError, "global_rank=2 is invalid"),
    ({"cat_names": ["nope"]}, LoaderError, r"no column\(s\) \['nope'\]"),
    ({"cat_names": ["x"], "cont_names": []}, LoaderError, "column 'x' .* must hold integer ids"),
    ({"cont_names": ["tags"]}, LoaderError, "column 'tags' .* must hold a number"),
    ({"buffer_size": 10}, ValueError, "buffer_size=10 rows is smaller than the largest row group"),
    ({"device": "tpu"}, ValueError, "device='tpu'"),
    ({"transforms": [HashBucket(5, columns=["x"])]}, ValueError, "not among cat_names"),
    ({"transforms": ["hash"]}, TypeError, r"transforms\[0\]"),
])
def test_bad_arguments_are_named(dataset, kwargs, error, match):
    with pytest.raises(error, match=match):
        _core(dataset, **kwargs)


def test_missing_and_truncated_files_are_named(tmp_path, dataset):
    with pytest.raises(FileNotFoundError, match="no parquet files"):
        LoaderCore(tmp_path / "nothing-*.parquet", 10, ["y"])
    source = sorted(dataset.glob("*.parquet"))[0]
    (tmp_path / "cut.parquet").write_bytes(source.read_bytes()[:-100])
    with pytest.raises(LoaderError, match=r"cut.parquet.*corrupt or truncated"):
        LoaderCore(tmp_path / "cut.parquet", 10, ["y"])


def test_gpu_without_a_gpu_is_an_error_not_a_fallback(dataset):
    from kernels import backend
    if backend.GPU_AVAILABLE:
        pytest.skip("a GPU is visible here")
    with pytest.raises(RuntimeError, match="device='gpu'"):
        _core(dataset, device="gpu")


def _categorify_item_and_tags(dataset) -> Categorify:
    """Fitted on part of the rows, so both columns also hold keys the vocabulary has not seen."""
    ref = _table(dataset)
    return Categorify(["item", "tags"], freq_threshold=1).fit(ref.select(["item", "tags"]).slice(0, 150))


@pytest.mark.gpu
@pytest.mark.parametrize("make_transforms", [lambda ds: [HashBucket(77, columns=["item"])],
                                             lambda ds: [_categorify_item_and_tags(ds)]],
                         ids=["hash_bucket", "categorify"])
def test_gpu_batches_equal_cpu_batches(gpu, dataset, make_transforms):
    kw = dict(list_names=["tags", "slots"], transforms=make_transforms(dataset), batch_size=300, seed=5)
    cpu = list(_core(dataset, device="cpu", **kw).iterate(lambda b: b, prefetch=1))
    dev = list(_core(dataset, device="gpu", **kw).iterate(lambda b: b, prefetch=1))
    assert len(cpu) == len(dev)
    for a, b in zip(cpu, dev):
        assert isinstance(b["row_id"], gpu.ndarray)
        for name in ("row_id", "item", "x", "y"):
            np.testing.assert_array_equal(gpu.asnumpy(b[name]), a[name])
        for name in ("tags", "slots"):
            np.testing.assert_array_equal(gpu.asnumpy(b[name].values), a[name].values)
            np.testing.assert_array_equal(gpu.asnumpy(b[name].offsets), a[name].offsets)
