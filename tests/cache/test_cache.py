"""The embedding training cache: equal to in-memory training, incremental models, crash safety,
clear errors."""
from __future__ import annotations

import errno
import hashlib
import importlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("rocksdict")

import sok_tutorial as sok  # noqa: E402
from data_gen.criteo import CAT_NAMES, write_criteo_parquet  # noqa: E402
from sok_tutorial.cache import DiskPS, EmbeddingTrainingCache, HostMemoryPS, PSLocked  # noqa: E402
from sok_tutorial.data import ParquetLoader  # noqa: E402
from sok_tutorial.data.keyset import keyset_path, read_keyset  # noqa: E402
from sok_tutorial.data.schema import Schema  # noqa: E402
from sok_tutorial.data.transforms import Transform  # noqa: E402
from sok_tutorial.training import latest_checkpoint  # noqa: E402

CARDS = [4000 + 100 * i for i in range(26)]
VOCAB = sum(CARDS)
CAPACITY = VOCAB // 10
ROOT = Path(__file__).resolve().parents[2]


class AddOffsets(Transform):
    """Per-column ids -> global keys (what the in-memory model is indexed by)."""

    def __init__(self, offsets):
        super().__init__(list(offsets))
        self.offsets = offsets

    def transform(self, values, column):
        return values + self.offsets[column]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("etc") / "criteo"
    write_criteo_parquet(out, 4 * 600, cardinalities=CARDS, num_parts=4, keysets=True, progress=False)
    schema = Schema.load(out)
    offsets = {c.name: c.key_offset for c in schema.columns if c.name in CAT_NAMES}
    files = sorted(out.glob("*.parquet"))
    return files, offsets


def build(rows: int, optimizer) -> keras.Model:
    keras.utils.set_random_seed(0)
    cat = keras.Input((26,), dtype="int64", name="categorical")
    deep = sok.DistributedEmbedding("sum", rows, 4, slot_num=26, max_nnz=1, use_hashtable=False, name="deep")(cat)
    wide = sok.DistributedEmbedding("sum", rows, 1, slot_num=26, max_nnz=1, use_hashtable=False, name="wide")(cat)
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(keras.layers.Flatten()(deep))
    logit = keras.layers.Add()([keras.layers.Dense(1, name="out")(hidden), keras.ops.sum(wide, axis=1)])
    model = keras.Model({"categorical": cat}, logit)
    model.compile(optimizer, keras.losses.BinaryCrossentropy(from_logits=True))
    model({"categorical": tf.zeros([1, 26], tf.int64)})
    return model


def loader(files, transform):
    return ParquetLoader(files, 100, ["label"], cat_names=CAT_NAMES, concat_categorical=True, seed=3,
                         transforms=[transform])


OPTIMIZERS = {"adam": lambda: sok.optimizers.Adam(0.01), "lazy_adam": lambda: sok.optimizers.LazyAdam(0.01),
              "sgd_momentum": lambda: sok.optimizers.SGD(0.05, momentum=0.9)}


@pytest.mark.parametrize("store,opt,prefetch", [("host", "adam", False), ("disk", "lazy_adam", True),
                                                ("host", "sgd_momentum", True), ("disk", "adam", False)])
def test_cache_at_10_percent_trains_like_the_whole_table(data, tmp_path, store, opt, prefetch):
    files, offsets = data
    reference = build(VOCAB, OPTIMIZERS[opt]())
    cached = build(CAPACITY, OPTIMIZERS[opt]())
    for name in ("hidden", "out"):
        cached.get_layer(name).set_weights(reference.get_layer(name).get_weights())
    ps = HostMemoryPS() if store == "host" else DiskPS(tmp_path / "ps")
    cache = EmbeddingTrainingCache(cached, ps, device_capacity_rows=CAPACITY)
    ref_losses, cache_losses = [], []
    order = files + files  # two epochs, one pass per file, the cache's unit of work
    for i, f in enumerate(order):
        for features, labels in loader([f], AddOffsets(offsets)):
            ref_losses.append(float(reference.train_on_batch(features, labels)))
        keys = read_keyset(keyset_path(f))
        assert len(keys) <= CAPACITY
        cache.update(keyset_path(f))
        if prefetch and i + 1 < len(order):
            cache.prefetch(keyset_path(order[i + 1]))  # pulled while this pass trains
        for features, labels in loader([f], cache.transform(offsets)):
            cache_losses.append(float(cached.train_on_batch(features, labels)))
        cache.write_back()
    np.testing.assert_allclose(cache_losses, ref_losses, rtol=2e-5, atol=1e-6)
    for layer in ("deep", "wide"):
        keys = ps.keys(layer)
        assert len(keys) == len(np.unique(np.concatenate([read_keyset(keyset_path(f)) for f in files])))
        rows, found = ps.pull(layer, keys)
        assert found.all()
        dim = reference.get_layer(layer).embedding_vec_size
        np.testing.assert_allclose(rows[:, :dim], reference.get_layer(layer).embedding_variable.numpy()[keys],
                                   rtol=1e-5, atol=1e-6)
        slots = cache.slots[layer]
        ref_slot = [v for v in reference.optimizer.variables if v.name.startswith(f"{layer}_")
                    and v.shape[0] == VOCAB]
        assert len(slots) == len(ref_slot) == 1
        np.testing.assert_allclose(rows[:, dim:], ref_slot[0].numpy()[keys].reshape(len(keys), -1),
                                   rtol=1e-5, atol=1e-6)
    ps.close()


def _server_rows(cache, layer, keys):
    """What `update` must load: the server's rows, initial vectors and zero state for keys it lacks."""
    rows, found = cache.ps.pull(layer.name, keys)
    rows[~found, :layer.dim] = layer.initial_values(keys[~found])
    return rows


@pytest.mark.parametrize("store", ["host", "disk"])
def test_update_loads_the_server_rows_whatever_was_prefetched(tmp_path, store):
    """Passes, evaluation passes, prefetches of the right and of the wrong keyset, and a load that
    rewinds the server, in random order: every update loads exactly the server's rows."""
    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    ps = HostMemoryPS() if store == "host" else DiskPS(tmp_path / "ps")
    cache = EmbeddingTrainingCache(model, ps, device_capacity_rows=CAPACITY)
    rng = np.random.default_rng(0)
    keysets = [np.unique(rng.integers(-500, 3000, 700)) for _ in range(4)]  # overlapping
    following = keysets[0]
    for step in range(16):
        keys = following
        cache.update(keys)
        for layer in cache.tables:
            np.testing.assert_array_equal(cache._read(layer, len(keys)), _server_rows(cache, layer, keys))
        following = keysets[rng.integers(len(keysets))]
        action = step % 4 if step < 8 else rng.integers(4)
        if action in (1, 2):
            cache.prefetch(following if action == 1 else keysets[rng.integers(len(keysets))])  # maybe wrong
        for _ in range(2):
            batch = {"categorical": tf.constant(cache.remap(rng.choice(keys, (8, 26))))}
            model.train_on_batch(batch, tf.ones([8, 1]))
        if action == 3:
            cache.discard()  # an evaluation pass: the server keeps its rows
        else:
            cache.write_back()
        if step == 3:
            cache.save_params_to_files(tmp_path / "params")
        if step == 9:
            cache.prefetch(following)
            cache.load_params_from_files(tmp_path / "params")  # the server's rows go back to step 3
    ps.close()


@pytest.mark.parametrize("store", ["host", "disk"])
def test_a_load_leaves_the_server_with_the_saved_rows_only(tmp_path, store):
    """Keys first trained after the save are deleted by the load, the others get their saved rows
    back; a store reopened afterwards holds the same."""
    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    ps = HostMemoryPS() if store == "host" else DiskPS(tmp_path / "ps")
    cache = EmbeddingTrainingCache(model, ps, device_capacity_rows=CAPACITY)
    rng = np.random.default_rng(3)
    before, after = np.arange(0, 600), np.arange(400, 1000)  # overlapping keysets
    for keys in (before, after):
        cache.update(keys)
        model.train_on_batch({"categorical": tf.constant(cache.remap(rng.choice(keys, (8, 26))))}, tf.ones([8, 1]))
        cache.write_back()
        if keys is before:
            cache.save_params_to_files(tmp_path / "params")
            saved = {name: (ps.keys(name), ps.pull(name, ps.keys(name))[0]) for name in ps.widths}
    assert all(len(ps.keys(name)) > len(saved[name][0]) for name in ps.widths)  # the later keys are there
    cache.load_params_from_files(tmp_path / "params")
    for name, (keys, rows) in saved.items():
        np.testing.assert_array_equal(ps.keys(name), keys)
        np.testing.assert_array_equal(ps.pull(name, keys)[0], rows)
        assert not ps.pull(name, np.arange(600, 1000))[1].any()
    if store == "disk":
        ps.close()
        reopened = DiskPS(tmp_path / "ps")
        for name, (keys, rows) in saved.items():
            np.testing.assert_array_equal(reopened.keys(name), keys)
            np.testing.assert_array_equal(reopened.pull(name, keys)[0], rows)
        reopened.close()


@pytest.mark.parametrize("store", ["host", "disk"])
def test_the_incremental_model_follows_a_load(tmp_path, store):
    """After a load, the incremental model holds the keys the load gave other vectors and, as
    deleted, those it took away: a server of the model that applied every increment (as a delta
    to a copy of the save) then holds exactly the cache's server's vectors."""
    from sok_tutorial.training.checkpoint import read_tables
    from sok_tutorial.training.delta import apply_delta

    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    ps = HostMemoryPS() if store == "host" else DiskPS(tmp_path / "ps")
    cache = EmbeddingTrainingCache(model, ps, device_capacity_rows=CAPACITY)
    rng = np.random.default_rng(5)

    def train(keys):
        cache.update(keys)
        model.train_on_batch({"categorical": tf.constant(cache.remap(rng.choice(keys, (16, 26))))}, tf.ones([16, 1]))
        cache.write_back()

    train(np.arange(0, 600))
    cache.get_incremental_model()
    served = shutil.copytree(cache.save_params_to_files(tmp_path / "params"), tmp_path / "served")
    train(np.arange(400, 1000))
    first = cache.get_incremental_model(path=tmp_path / "d1")
    assert all(len(first.deleted[name]) == 0 for name in first)
    apply_delta(served, tmp_path / "d1")
    cache.load_params_from_files(tmp_path / "params")
    second = cache.get_incremental_model(path=tmp_path / "d2")
    assert second.copy().deleted.keys() == second.deleted.keys() == set(second)  # a copy keeps the deletions
    for table in cache.tables:
        keys, vectors = second[table.name]
        np.testing.assert_array_equal(np.sort(second.deleted[table.name]), np.arange(600, 1000))
        assert 0 < len(keys) and set(keys.tolist()) <= set(range(400, 600))  # rolled back
        np.testing.assert_array_equal(vectors, ps.pull(table.name, keys)[0][:, :table.dim])
    apply_delta(served, tmp_path / "d2")
    for table, arrays in zip(cache.tables, read_tables(served)):
        order, held = np.argsort(arrays["keys"]), ps.keys(table.name)
        np.testing.assert_array_equal(arrays["keys"][order], held)
        np.testing.assert_array_equal(arrays["vectors"][order], ps.pull(table.name, held)[0][:, :table.dim])
    again = cache.get_incremental_model()  # nothing changed since
    assert all(len(keys) == 0 and len(again.deleted[name]) == 0 for name, (keys, _) in again.items())
    ps.close()
    resumed = EmbeddingTrainingCache(build(CAPACITY, sok.optimizers.Adam(0.01)), HostMemoryPS(),
                                     device_capacity_rows=CAPACITY, train_from_scratch=False,
                                     dest_sparse_models=tmp_path / "params")
    start = resumed.get_incremental_model()  # a cache that starts from a save: the save is where serving starts
    assert all(len(keys) == 0 and len(start.deleted[name]) == 0 for name, (keys, _) in start.items())
    assert all(resumed.ps.size(name) == 600 for name in resumed.widths)


def test_a_load_during_a_pass_is_refused_and_changes_nothing(tmp_path):
    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    ps = HostMemoryPS()
    cache = EmbeddingTrainingCache(model, ps, device_capacity_rows=CAPACITY)
    cache.update(np.arange(0, 300))
    cache.write_back()
    cache.save_params_to_files(tmp_path / "params")
    cache.update(np.arange(200, 500))
    model.train_on_batch({"categorical": tf.constant(cache.remap(np.full((4, 26), 250)))}, tf.ones([4, 1]))
    cache.write_back()
    cache.update(np.arange(100, 400))
    before = {name: ps.pull(name, ps.keys(name))[0] for name in ps.widths}
    with pytest.raises(RuntimeError, match="write_back"):
        cache.load_params_from_files(tmp_path / "params")
    for name, rows in before.items():
        np.testing.assert_array_equal(ps.pull(name, ps.keys(name))[0], rows)
    cache.discard()
    cache.load_params_from_files(tmp_path / "params")  # once the pass ended
    assert all(len(ps.keys(name)) == 300 for name in ps.widths)


def test_a_replace_is_all_or_nothing_across_tables():
    ps = HostMemoryPS()
    ps.ensure_tables({"a": 1, "b": 2})
    ps.push_tables({"a": ([1, 2], [[1.0], [2.0]]), "b": ([5], [[5.0, 5.0]])})
    with pytest.raises(ValueError, match="rows have shape"):
        ps.replace_tables({"a": ([3], [[3.0]]), "b": ([6], [[6.0]])})  # b's rows are too narrow
    assert ps.keys("a").tolist() == [1, 2] and ps.keys("b").tolist() == [5]


@pytest.mark.parametrize("store", ["host", "disk"])
def test_rows_that_are_not_finite_are_refused_and_a_write_back_of_them_keeps_its_pass(tmp_path, store):
    """A push or replace holding NaN or inf names the keys and writes nothing, in either table; a
    write-back of a diverged pass raises, the server and the incremental model keep what they had,
    and the pass can be discarded."""
    ps = HostMemoryPS() if store == "host" else DiskPS(tmp_path / "ps")
    ps.ensure_tables({"a": 1, "b": 2})
    ps.push_tables({"a": ([1, 2], [[1.0], [2.0]]), "b": ([5], [[5.0, 5.0]])})
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match=r"rows of 1 keys hold NaN or inf \(keys \[7\]\)"):
            ps.push_tables({"a": ([3], [[3.0]]), "b": ([6, 7], [[6.0, 6.0], [1.0, bad]])})
        with pytest.raises(ValueError, match="NaN or inf"):
            ps.replace_tables({"a": ([7], [[bad]])})
    assert ps.keys("a").tolist() == [1, 2] and ps.keys("b").tolist() == [5]
    assert ps.pull("a", [1, 2])[0].ravel().tolist() == [1.0, 2.0]
    ps.close()

    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    server = HostMemoryPS() if store == "host" else DiskPS(tmp_path / "ps2")
    cache = EmbeddingTrainingCache(model, server, device_capacity_rows=CAPACITY)
    keys = np.arange(0, 200)
    cache.update(keys)
    cache.write_back()
    cache.get_incremental_model()
    before = {name: server.pull(name, keys)[0] for name in server.widths}
    cache.update(keys)
    table = cache.tables[0]
    rows = cache._read(table, len(keys))
    rows[3, 0] = np.nan  # as a diverged step leaves a row
    cache._write(table, rows)
    with pytest.raises(ValueError, match=rf"push to {table.name!r}: the rows of 1 keys hold NaN or inf \(keys \[3\]\)"):
        cache.write_back()
    assert cache.active
    for name, rows in before.items():
        np.testing.assert_array_equal(server.pull(name, keys)[0], rows)
    cache.discard()
    assert all(len(k) == 0 for k, _ in cache.get_incremental_model().values())
    server.close()


@pytest.mark.parametrize("store", ["host", "disk"])
def test_servers_keep_their_keys_in_step(tmp_path, store):
    """Unsorted and negative keys, pushed over each other; DiskPS reopens with its keys."""
    rng = np.random.default_rng(2)
    first, second = rng.permutation(np.arange(-300, 300)), np.array([10**15, -7, 1000, 2**63 - 1, -2**63])
    written = np.unique(np.concatenate([first, second]))
    wanted = np.array([5, 12345, -7, -300, 300, 2**63 - 1])

    def check(ps):
        rows, found = ps.pull("t", wanted)
        assert found.tolist() == [True, False, True, True, False, True]
        assert rows[:2].tolist() == [[5, -5], [0, 0]] and rows[3].tolist() == [-300, 300]
        assert rows[2].tolist() == [-7, -7] and rows[5].tolist() == [np.float32(2**63 - 1)] * 2
        np.testing.assert_array_equal(ps.keys("t"), written)
        assert ps.size("t") == len(written)

    ps = HostMemoryPS(initial_rows=8) if store == "host" else DiskPS(tmp_path / "ps")  # host: grows twice
    ps.ensure_table("t", 2)
    ps.push("t", first, np.stack([first, -first], 1).astype(np.float32))
    ps.push("t", second, np.stack([second, second], 1).astype(np.float32))
    check(ps)
    ps.close()
    if store == "disk":
        with DiskPS(tmp_path / "ps") as ps:  # a scan of the store reads the keys on first use
            check(ps)


def test_incremental_model_and_save_load(data, tmp_path):
    files, offsets = data
    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    cache = EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=CAPACITY)
    records = cache.fit([([files[0]], None), ([files[1]], None)], batch_size=100, label_names=["label"],
                        cat_names=CAT_NAMES, key_offsets=offsets, concat_categorical=True,
                        eval_pass=([files[2]], None))
    assert len(records) == 2 and all(r["pull_s"] >= 0 and r["write_back_s"] > 0 for r in records)
    assert all(0.3 < r["eval_loss"] < 0.8 for r in records)
    twin = EmbeddingTrainingCache(build(CAPACITY, sok.optimizers.Adam(0.01)), HostMemoryPS(),
                                  device_capacity_rows=CAPACITY)  # without eval_pass, fit prefetches
    twin_records = twin.fit([([files[0]], None), ([files[1]], None)], batch_size=100, label_names=["label"],
                            cat_names=CAT_NAMES, key_offsets=offsets, concat_categorical=True)
    assert [r["loss"] for r in twin_records] == [r["loss"] for r in records]
    for layer in ("deep", "wide"):
        np.testing.assert_array_equal(twin.ps.pull(layer, cache.ps.keys(layer))[0],
                                      cache.ps.pull(layer, cache.ps.keys(layer))[0])
    increment = cache.get_incremental_model()
    seen = np.unique(np.concatenate([read_keyset(keyset_path(f)) for f in files[:2]]))
    for layer, (keys, vectors) in increment.items():
        assert set(keys) <= set(seen) and len(keys) > 0.9 * len(seen)  # a vector untouched by any gradient is rare
        rows, found = cache.ps.pull(layer, keys)
        assert found.all()
        np.testing.assert_array_equal(vectors, rows[:, :vectors.shape[1]])
    assert all(len(k) == 0 for k, _ in cache.get_incremental_model().values())  # nothing new since
    assert len(cache.ps.keys("deep")) == len(seen)  # the evaluation pass wrote nothing back

    saved = cache.save_params_to_files(tmp_path / "params")
    assert latest_checkpoint(tmp_path / "params") == saved and saved.name.startswith("step-")
    fresh_model = build(CAPACITY, sok.optimizers.Adam(0.01))
    fresh = EmbeddingTrainingCache(fresh_model, HostMemoryPS(), device_capacity_rows=CAPACITY,
                                   train_from_scratch=False, dest_sparse_models=tmp_path / "params")
    for layer in ("deep", "wide"):
        np.testing.assert_array_equal(fresh.ps.keys(layer), cache.ps.keys(layer))
        np.testing.assert_array_equal(fresh.ps.pull(layer, seen)[0], cache.ps.pull(layer, seen)[0])
    for a, b in zip(fresh_model.get_layer("hidden").get_weights(), model.get_layer("hidden").get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(fresh_model.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())


def test_bad_input_is_named(data, tmp_path):
    files, offsets = data
    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    with pytest.raises(ValueError, match="device_capacity_rows"):
        EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=CAPACITY + 1)
    cache = EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=100)
    with pytest.raises(ValueError, match=r"keyset holds [\d,]+ keys but device_capacity_rows=100"):
        cache.update(keyset_path(files[0]))
    with pytest.raises(FileNotFoundError, match="keyset="):
        cache.update(tmp_path / "nope.keyset")
    cache = EmbeddingTrainingCache(build(CAPACITY, sok.optimizers.Adam(0.01)), HostMemoryPS(),
                                   device_capacity_rows=CAPACITY)
    cache.update(np.arange(10))  # a keyset of another dataset
    with pytest.raises(KeyError, match="not in the active keyset"):
        next(iter(loader([files[0]], cache.transform(offsets))))
    with pytest.raises(RuntimeError, match="write_back"):
        cache.update(np.arange(5))
    with pytest.raises(FileNotFoundError, match="holds no save"):
        cache.load_params_from_files(tmp_path)
    first = DiskPS(tmp_path / "locked")
    with pytest.raises(PSLocked, match="locked"):
        DiskPS(tmp_path / "locked")
    first.close()


def _named_functions(message: str) -> list[str]:
    """The dotted names of data_gen / sok_tutorial functions that `message` tells users to call."""
    names = re.findall(r"\b(?:data_gen|sok_tutorial)(?:\.\w+)+", message)
    for name in names:
        module, _, attr = name.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr)), f"{name} in {message!r}"
    return names


def test_missing_keysets_point_to_functions_that_exist(data, tmp_path):
    files, offsets = data
    cache = EmbeddingTrainingCache(build(CAPACITY, sok.optimizers.Adam(0.01)), HostMemoryPS(),
                                   device_capacity_rows=CAPACITY)
    with pytest.raises(FileNotFoundError, match="keyset=") as info:
        cache.update(tmp_path / "nope.keyset")
    assert "sok_tutorial.data.keyset.write_keyset" in _named_functions(str(info.value))
    shutil.copy(files[0], tmp_path / files[0].name)  # a data file without its keyset
    with pytest.raises(FileNotFoundError, match="no keyset beside") as info:
        cache.evaluate([tmp_path / files[0].name], batch_size=100, label_names=["label"], cat_names=CAT_NAMES,
                       key_offsets=offsets, concat_categorical=True)
    assert "data_gen.criteo.write_criteo_parquet" in _named_functions(str(info.value))
    assert "keysets=True" in str(info.value) and not cache.active


def test_history_holds_the_passes_that_trained(data):
    files, offsets = data
    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    cache = EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=CAPACITY)
    cache.update(np.arange(50))
    model.train_on_batch({"categorical": tf.constant(np.arange(26)[None])}, tf.ones([1, 1]))
    cache.write_back()
    trained = dict(cache.history[-1])
    cache.update(np.arange(100, 200))  # an evaluation pass of a low-level loop
    cache.discard()
    cache.discard()  # no active pass: nothing to drop
    cache.evaluate([files[0]], batch_size=100, label_names=["label"], cat_names=CAT_NAMES, key_offsets=offsets,
                   concat_categorical=True)
    assert cache.history == [trained]
    cache.update(np.arange(60))
    model.train_on_batch({"categorical": tf.constant(np.arange(26, 52)[None])}, tf.ones([1, 1]))
    assert len(cache.get_incremental_model()["deep"][0]) > 0  # pushes the pass's rows so far
    cache.discard()  # what was pushed stays on the server, and so does the record
    assert len(cache.history) == 2 and cache.history[-1]["keys"] == 60 and cache.history[-1]["write_back_s"] > 0


def test_disk_full_during_write_back_commits_nothing(tmp_path):
    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    ps = DiskPS(tmp_path / "ps")
    cache = EmbeddingTrainingCache(model, ps, device_capacity_rows=CAPACITY)
    cache.update(np.arange(50))
    model.train_on_batch({"categorical": tf.constant(np.arange(26)[None])}, tf.ones([1, 1]))
    cache.write_back()
    before = {layer: ps.pull(layer, np.arange(60))[0] for layer in ("deep", "wide")}
    cache.update(np.arange(60))
    model.train_on_batch({"categorical": tf.constant(np.arange(30, 56)[None])}, tf.ones([1, 1]))

    class Full:
        def __init__(self, db):
            self.db = db

        def write(self, *args):
            raise Exception("IO error: No space left on device")

        def __getattr__(self, name):
            return getattr(self.db, name)

    real, ps._db = ps._db, Full(ps._db)
    with pytest.raises(OSError, match="disk full") as info:
        cache.write_back()
    assert info.value.errno == errno.ENOSPC
    ps._db = real
    for layer, rows in before.items():
        np.testing.assert_array_equal(ps.pull(layer, np.arange(60))[0], rows)  # nothing half-written
    cache.write_back()  # the pass is still active: retry once there is room
    assert len(ps.keys("deep")) == 60
    ps.close()


def _child(code: str, tmp_path: Path) -> subprocess.Popen:
    """Run `code` in a new Python process; its stdout lines arrive through `_read_until`, its stdin is a pipe
    (closed by the parent, or by the parent's death: a child blocked on it then sees EOF)."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, cwd=str(tmp_path))
    proc.lines = queue.Queue()  # None once the child closed its stdout

    def pump():
        for line in proc.stdout:
            if line.endswith("\n"):  # a line the kill cut short ("saved" without its number) is not a report
                proc.lines.put(line.strip())
        proc.lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return proc


def _read_until(proc: subprocess.Popen, marker: str | None, timeout: float = 120) -> list[str]:
    """The child's lines up to the first that starts with `marker` (None: up to its exit), within `timeout` s."""
    lines, deadline = [], time.monotonic() + timeout
    while True:
        try:
            line = proc.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"no line starting with {marker!r} from the child in {timeout} s: {lines[-5:]}")
        if line is None:
            assert marker is None, f"the child exited (rc {proc.wait(30)}) before {marker!r}: {lines[-5:]}"
            return lines
        lines.append(line)
        if marker is not None and line.startswith(marker):
            return lines


def _kill_after(proc: subprocess.Popen, marker: str, delay: float) -> list[str]:
    lines = _read_until(proc, marker)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    lines += _read_until(proc, None, timeout=30)
    proc.wait(30)
    return lines


@pytest.mark.slow
def test_a_disk_store_open_in_another_process_is_locked_until_that_process_exits(tmp_path):
    proc = _child(f"""
        import sys
        import numpy as np
        from sok_tutorial.cache import DiskPS
        ps = DiskPS({str(tmp_path / 'ps')!r})
        ps.ensure_table("t", 2)
        ps.push("t", np.array([3, 5]), np.array([[1, 2], [3, 4]], np.float32))
        print("holding", flush=True)
        sys.stdin.readline()  # until the parent closes the pipe; exits without closing the store
    """, tmp_path)
    try:
        _read_until(proc, "holding")
        with pytest.raises(PSLocked, match="is locked: another process") as info:
            DiskPS(tmp_path / "ps")
        assert repr(str(tmp_path / "ps")) in str(info.value)  # names the store's path
        assert proc.poll() is None  # the child still holds it
    finally:
        proc.stdin.close()
        assert proc.wait(60) == 0
    with DiskPS(tmp_path / "ps") as ps:  # the lock went with the process, the child's rows stayed
        rows, found = ps.pull("t", np.array([5, 3, 4]))
        assert found.tolist() == [True, True, False]
        assert rows.tolist() == [[3, 4], [1, 2], [0, 0]]


@pytest.mark.slow
def test_sigkill_during_disk_write_back_keeps_every_completed_pass(tmp_path):
    proc = _child(f"""
        import numpy as np
        from sok_tutorial.cache import DiskPS
        ps = DiskPS({str(tmp_path / 'ps')!r})
        ps.ensure_table("deep", 17); ps.ensure_table("wide", 3)
        keys = np.arange(200_000, dtype=np.int64)
        for step in range(1, 10_000):
            ps.push_tables({{"deep": (keys, np.full((len(keys), 17), step, np.float32)),
                            "wide": (keys, np.full((len(keys), 3), step, np.float32))}})
            print("pushed", step, flush=True)
    """, tmp_path)
    lines = _kill_after(proc, "pushed 2", 0.3)
    done = max(int(line.split()[1]) for line in lines if line.startswith("pushed"))
    with DiskPS(tmp_path / "ps") as ps:  # reopens: the lock died with the process
        values = {layer: ps.pull(layer, np.arange(200_000))[0] for layer in ("deep", "wide")}
    seen = {float(v) for rows in values.values() for v in np.unique(rows)}
    assert len(seen) == 1, f"a push was applied in part: values {sorted(seen)[:5]}"
    assert seen.pop() in (done, done + 1)  # every completed push, and none or all of the next


def _digest(tables: dict[str, np.ndarray]) -> str:
    """One hash of every table's rows (vectors and optimizer state), tables by name."""
    digest = hashlib.sha256()
    for name in sorted(tables):
        digest.update(name.encode() + np.ascontiguousarray(tables[name], np.float32).tobytes())
    return digest.hexdigest()


@pytest.mark.slow
def test_sigkill_during_a_cache_write_back_keeps_the_last_complete_pass(tmp_path):
    """A real cache over a DiskPS, killed while RocksDB takes a pass's write-back: the store holds the
    rows of the last pass written back, or of the interrupted one, whole, never a mix."""
    rows = 26 * 8000  # every pass trains one batch touching every key: every row changes every pass
    proc = _child(f"""
        import time
        import numpy as np, tensorflow as tf
        import sok_tutorial as sok
        from sok_tutorial.cache import DiskPS, EmbeddingTrainingCache
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_cache import _digest, build

        class Timed:  # says when RocksDB starts and ends taking the write-back's batch
            def __init__(self, db):
                self.db = db

            def write(self, *args):
                print("db-write", step, flush=True)
                start = time.perf_counter()
                self.db.write(*args)
                print("db-done", step, time.perf_counter() - start, flush=True)

            def __getattr__(self, name):
                return getattr(self.db, name)

        model = build({rows}, sok.optimizers.Adam(0.01))
        ps = DiskPS({str(tmp_path / 'ps')!r})
        cache = EmbeddingTrainingCache(model, ps, device_capacity_rows={rows})
        ps._db = Timed(ps._db)
        keys = np.arange({rows}, dtype=np.int64)
        for step in range(1, 10_000):
            cache.update(keys)
            batch = cache.remap(np.random.default_rng(step).permutation(keys)).reshape(-1, 26)
            model.train_on_batch({{"categorical": tf.constant(batch)}}, tf.ones([len(batch), 1]))
            print("pass", step, _digest({{t.name: cache._read(t, len(keys)) for t in cache.tables}}), flush=True)
            cache.write_back()
            print("written", step, flush=True)
    """, tmp_path)
    lines = _read_until(proc, "db-done 2")
    took = float(lines[-1].split()[2])
    lines += _kill_after(proc, "db-write 3", took / 2)  # aimed at the middle of RocksDB taking pass 3
    done = max(int(line.split()[1]) for line in lines if line.startswith("written"))
    digests = {int(line.split()[1]): line.split()[2] for line in lines if line.startswith("pass")}
    assert done >= 2 and len(set(digests.values())) == len(digests)  # every pass changed the rows
    with DiskPS(tmp_path / "ps") as ps:
        assert sorted(ps.widths) == ["deep", "wide"]
        np.testing.assert_array_equal(ps.keys("deep"), np.arange(rows))
        np.testing.assert_array_equal(ps.keys("wide"), np.arange(rows))
        held = _digest({name: ps.pull(name, np.arange(rows))[0] for name in ("deep", "wide")})
    passes = [p for p, d in digests.items() if d == held]
    assert passes, f"the store holds no pass whole (a write-back applied in part?); {done} were written back"
    assert passes[0] in (done, done + 1)  # every completed write-back, and none or all of the next


@pytest.mark.slow
def test_sigkill_during_save_leaves_the_last_save_loadable(tmp_path):
    proc = _child(f"""
        import numpy as np, keras
        import sok_tutorial as sok
        from sok_tutorial.cache import EmbeddingTrainingCache, HostMemoryPS
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_cache import build, CAPACITY
        model = build(CAPACITY, sok.optimizers.Adam(0.01))
        cache = EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=CAPACITY)
        cache.update(np.arange(CAPACITY)); cache.write_back()
        for i in range(10_000):
            model.get_layer("out").kernel.assign(np.full((8, 1), i, np.float32))
            cache.save_params_to_files({str(tmp_path / 'params')!r})
            print("saved", i, flush=True)
    """, tmp_path)
    lines = _kill_after(proc, "saved 1", 0.2)
    done = max(int(line.split()[1]) for line in lines if line.startswith("saved"))
    model = build(CAPACITY, sok.optimizers.Adam(0.01))
    cache = EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=CAPACITY, train_from_scratch=False,
                                   dest_sparse_models=tmp_path / "params")
    assert float(model.get_layer("out").kernel.numpy()[0, 0]) in (done, done + 1)
    assert len(cache.ps.keys("deep")) == CAPACITY


def test_the_incremental_model_is_a_delta_that_brings_a_save_up_to_date(data, tmp_path):
    from sok_tutorial.training.checkpoint import read_tables
    from sok_tutorial.training.delta import apply_delta

    files, offsets = data
    cache = EmbeddingTrainingCache(build(CAPACITY, sok.optimizers.Adam(0.01)), HostMemoryPS(),
                                   device_capacity_rows=CAPACITY)
    fit = {"batch_size": 100, "label_names": ["label"], "cat_names": CAT_NAMES, "key_offsets": offsets,
           "concat_categorical": True}
    cache.fit([([files[0]], None)], **fit)
    cache.get_incremental_model()  # what the first pass changed is in the save below
    saved = cache.save_params_to_files(tmp_path / "params")
    cache.fit([([files[1]], None)], **fit)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("")
    with pytest.raises(FileExistsError):  # a delta that cannot be written loses no change
        cache.get_incremental_model(path=tmp_path / "taken")
    cache.get_incremental_model(path=tmp_path / "delta")
    summary = apply_delta(saved, tmp_path / "delta")
    for table, arrays in zip(cache.tables, read_tables(saved)):
        assert summary[table.path]["changed"] > 0
        np.testing.assert_array_equal(np.sort(arrays["keys"]), cache.ps.keys(table.name))
        rows, _ = cache.ps.pull(table.name, arrays["keys"])
        np.testing.assert_array_equal(arrays["vectors"], rows[:, :table.dim])


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs at tmp_path / "disk" (mounting needs root: skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()[:100]})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_store_that_filled_the_disk_takes_pushes_again_once_there_is_room_and_closes_cleanly(small_disk):
    """RocksDB refuses every write after one fails for lack of space, even once there is room, and
    its close repeats the error: DiskPS reopens the store and keeps every push that returned."""
    ps = DiskPS(small_disk / "ps")
    ps.ensure_table("t", 64)
    (small_disk / "filler").write_bytes(bytes(5 << 20))
    pushed = 0
    with pytest.raises(OSError, match="disk full; the push was not applied") as info:
        for i in range(100):
            ps.push("t", np.arange(pushed, pushed + 2000), np.full((2000, 64), i, np.float32))
            pushed += 2000
    assert info.value.errno == errno.ENOSPC and pushed > 0 and ps.size("t") == pushed
    (small_disk / "filler").unlink()
    ps.push("t", np.arange(pushed, pushed + 10), np.full((10, 64), -1, np.float32))
    ps.close()
    ps.close()  # a second close does nothing
    with pytest.raises(RuntimeError, match=r"DiskPS\(path=.*\) is closed; open a new DiskPS"):
        ps.pull("t", np.arange(3))
    with DiskPS(small_disk / "ps") as again:
        rows, found = again.pull("t", np.array([0, pushed - 1, pushed + 9]))
        assert found.all() and again.size("t") == pushed + 10
        assert rows[:, 0].tolist() == [0.0, (pushed - 1) // 2000, -1.0]
