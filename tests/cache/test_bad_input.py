"""Every public entry point of `sok_tutorial.cache` fed bad input: the error type and a message
naming the argument; a closed DiskPS says so; a bare layer is named as one."""
from __future__ import annotations

import os

import keras
import numpy as np
import pytest

pytest.importorskip("rocksdict")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.cache import DiskPS, EmbeddingTrainingCache, HostMemoryPS  # noqa: E402


def _model() -> keras.Model:
    inp = keras.Input([2], dtype="int64")
    table = sok.DistributedEmbedding("sum", 32, 4, slot_num=2, max_nnz=1, use_hashtable=False, name="items")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(table(inp)))
    model = keras.Model(inp, out)
    model.compile(optimizer=sok.optimizers.LazyAdam(0.01), loss="mse")
    model(np.zeros((1, 2), np.int64))
    return model


def _table_of_width_2() -> HostMemoryPS:
    ps = HostMemoryPS()
    ps.ensure_table("t", 2)
    return ps


def _file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a store")
    return path


CASES = [
    ("host initial_rows 0", lambda t: HostMemoryPS(initial_rows=0), ValueError, r"initial_rows=0"),
    ("table width 0", lambda t: HostMemoryPS().ensure_table("t", 0), ValueError, r"width=0"),
    ("table named by an int", lambda t: DiskPS(t / "ps").ensure_table(7, 2), ValueError,
     r"table name=7 is invalid: expected a non-empty str"),
    ("table width changes", lambda t: _table_of_width_2().ensure_table("t", 3),
     ValueError, r"width 2, not 3"),
    ("pull unknown table", lambda t: HostMemoryPS().pull("none", [1]), KeyError, r"no table 'none'"),
    ("push wrong shape", lambda t: _table_of_width_2().push("t", [1, 2], np.zeros((2, 3))),
     ValueError, r"rows have shape \(2, 3\), expected \(2, 2\)"),
    ("push repeated keys", lambda t: _table_of_width_2().push("t", [3, 3], np.zeros((2, 2))),
     ValueError, r"keys must be unique"),
    ("disk empty path", lambda t: DiskPS(""), ValueError, r"DiskPS path=''"),
    ("disk path None", lambda t: DiskPS(None), ValueError, r"DiskPS path=None"),
    ("disk path a file", lambda t: DiskPS(_file(t)), NotADirectoryError, r"DiskPS path=.*a-file.* is a file"),
    ("cache capacity 0", lambda t: EmbeddingTrainingCache(_model(), HostMemoryPS(), 0), ValueError,
     r"device_capacity_rows=0"),
    ("cache bare layer", lambda t: EmbeddingTrainingCache(sok.DistributedEmbedding("sum", 8, 2, slot_num=1, max_nnz=1),
                                                          HostMemoryPS(), 8), TypeError,
     r"model=DistributedEmbedding .* is a layer: EmbeddingTrainingCache takes a Keras model"),
    ("cache no tables", lambda t: EmbeddingTrainingCache(_dense_only(), HostMemoryPS(), 8), ValueError,
     r"no embedding tables"),
    ("cache save keep_last 0", lambda t: EmbeddingTrainingCache(_model(), HostMemoryPS(), 16).save_params_to_files(
        t, keep_last=0), ValueError, r"keep_last=0"),
    ("cache load nothing", lambda t: EmbeddingTrainingCache(_model(), HostMemoryPS(), 16).load_params_from_files(t),
     FileNotFoundError, r"directory=.*holds no save"),
]


def _dense_only() -> keras.Model:
    model = keras.Sequential([keras.Input([2]), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_by_name(tmp_path, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(tmp_path)


def test_an_empty_path_never_writes_into_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError):
        DiskPS("")
    assert os.listdir(tmp_path) == []


def test_a_closed_disk_store_says_so(tmp_path):
    ps = DiskPS(tmp_path / "store")
    ps.ensure_table("t", 2)
    ps.push("t", [1, 2], np.ones((2, 2), np.float32))
    ps.close()
    for use in (lambda: ps.pull("t", [1]), lambda: ps.push("t", [3], np.ones((1, 2))), lambda: ps.keys("t"),
                lambda: ps.ensure_table("u", 2)):
        with pytest.raises(RuntimeError, match=r"DiskPS\(path=.*store'\) is closed"):
            use()
    with DiskPS(tmp_path / "store") as again:  # the data outlived the closed handle
        np.testing.assert_array_equal(again.pull("t", [1, 2])[0], np.ones((2, 2)))


def test_a_directory_of_other_files_is_not_made_a_store(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "important.txt").write_text("keep")
    with pytest.raises(FileExistsError, match=r"DiskPS path=.*mine.* holds other files"):
        DiskPS(tmp_path / "mine")
    assert sorted(os.listdir(tmp_path / "mine")) == ["important.txt"]
    with DiskPS(tmp_path / "store") as ps:  # a store a DiskPS wrote opens again
        ps.ensure_table("t", 2)
    DiskPS(tmp_path / "store").close()


@pytest.mark.parametrize("ps", ["host", "disk"])
def test_unsigned_keys_past_int64_are_refused_not_wrapped(tmp_path, ps):
    store = HostMemoryPS() if ps == "host" else DiskPS(tmp_path / "s")
    store.ensure_table("t", 2)
    with pytest.raises(ValueError, match=r"keys must fit in int64, got 9223372036854775809"):
        store.push("t", np.array([2**63 + 1], np.uint64), np.ones((1, 2)))
    assert store.keys("t").tolist() == []


def test_a_cache_refused_for_one_tables_width_declares_none(tmp_path):
    inp = keras.Input([2], dtype="int64")
    tables = [sok.DistributedEmbedding("sum", 32, width, slot_num=1, max_nnz=1, use_hashtable=False, name=name)
              for name, width in (("a", 4), ("b", 2))]
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([keras.layers.Flatten()(t(inp[:, i:i + 1]))
                                                            for i, t in enumerate(tables)]))
    model = keras.Model(inp, out)
    model.compile(optimizer=sok.optimizers.SGD(0.1), loss="mse")
    model(np.zeros((1, 2), np.int64))
    ps = HostMemoryPS()
    ps.ensure_table("b", 3)  # another model's table b
    with pytest.raises(ValueError, match=r"table 'b' holds rows of width 3, not 2"):
        EmbeddingTrainingCache(model, ps, 16)
    assert ps.widths == {"b": 3}


def test_a_save_loaded_into_a_closed_store_changes_no_weight(tmp_path):
    cache = EmbeddingTrainingCache(_model(), DiskPS(tmp_path / "ps"), 16)
    saved = cache.save_params_to_files(tmp_path / "params")
    kernel = cache.model.layers[-1].kernel
    kernel.assign(kernel.numpy() + 1)
    before = kernel.numpy().copy()
    cache.ps.close()
    with pytest.raises(RuntimeError, match=r"is closed"):
        cache.load_params_from_files(saved.parent)
    np.testing.assert_array_equal(kernel.numpy(), before)
