"""Saving and loading the cache's parameters into another instance of the model."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.cache import EmbeddingTrainingCache, HostMemoryPS  # noqa: E402
from sok_tutorial.training.checkpoint import read_tables  # noqa: E402

ROWS, SLOTS = 64, 3


class Tower(keras.Model):
    """Layers Keras names itself: auto-numbered dense layers and Dropout seed generators."""

    def __init__(self, hidden: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.embedding = sok.DistributedEmbedding("sum", ROWS, 4, slot_num=SLOTS, max_nnz=1, use_hashtable=False,
                                                  name="table")
        self.flatten = keras.layers.Flatten()
        self.hidden = [keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(hidden, activation="relu")]
        self.dropout = [keras.layers.Dropout(0.3), keras.layers.Dropout(0.3)]
        self.out = keras.layers.Dense(1)

    def call(self, x, training=False):
        x = self.flatten(self.embedding(x))
        for dense, dropout in zip(self.hidden, self.dropout):
            x = dropout(dense(x), training=training)
        return self.out(x)


def build(hidden: int = 8) -> Tower:
    model = Tower(hidden)
    model.compile(sok.optimizers.Adam(0.01), keras.losses.BinaryCrossentropy(from_logits=True))
    model(tf.zeros([1, SLOTS], tf.int64))
    return model


def test_save_loads_into_a_second_instance_whatever_keras_numbered(tmp_path):
    keras.utils.set_random_seed(0)
    model = build()
    cache = EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=ROWS)
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 10**9, 40))
    cache.update(keys)
    batch = tf.constant(cache.remap(rng.choice(keys, (32, SLOTS))))
    for _ in range(3):
        model.train_on_batch(batch, tf.constant(rng.integers(0, 2, (32, 1)), tf.float32))
    cache.write_back()
    expected = model.predict(batch, verbose=0)
    saved = cache.save_params_to_files(tmp_path / "params")
    paths = [d["path"] for d in json.loads((saved / "manifest.json").read_text())["dense"]]
    assert any(re.fullmatch(r"dense(_\d+)?/kernel", p) for p in paths)  # relative to the model:
    assert not any(model.name in p for p in paths)  # without its own, auto-numbered name
    (rows,) = read_tables(saved)  # a checkpoint like any other, its table rows from the server
    np.testing.assert_array_equal(rows["keys"], cache.ps.keys("table"))
    packed = cache.ps.pull("table", rows["keys"])[0]
    np.testing.assert_array_equal(np.concatenate([rows["vectors"], rows["slot_0"].reshape(len(keys), -1)], 1), packed)

    keras.utils.set_random_seed(1)  # other initial weights, other auto-numbers
    twin = build()
    first = [v.path for v in model.variables]
    second = [v.path for v in twin.variables]
    assert any("seed_generator" in p for p in first) and set(first).isdisjoint(second)
    twin_cache = EmbeddingTrainingCache(twin, HostMemoryPS(), device_capacity_rows=ROWS, train_from_scratch=False,
                                        dest_sparse_models=tmp_path / "params")
    twin_cache.update(keys)
    np.testing.assert_array_equal(twin.predict(batch, verbose=0), expected)
    for a, b in zip(model.variables, twin.variables):
        if "table" not in a.path:
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{a.path} vs {b.path}")
    for a, b in zip(model.optimizer.variables, twin.optimizer.variables):
        if "table" not in a.name:
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{a.name} vs {b.name}")


def test_a_save_of_another_architecture_names_what_differs(tmp_path):
    cache = EmbeddingTrainingCache(build(hidden=8), HostMemoryPS(), device_capacity_rows=ROWS)
    cache.save_params_to_files(tmp_path / "params")
    other = build(hidden=16)
    before = [v.numpy() for v in other.variables]
    with pytest.raises(ValueError, match=r"only in the save: dense/kernel \[12, 8\], .*; "
                                         r"only in the model: dense/kernel \[12, 16\], "):
        EmbeddingTrainingCache(other, HostMemoryPS(), device_capacity_rows=ROWS, train_from_scratch=False,
                               dest_sparse_models=tmp_path / "params")
    for a, b in zip(before, other.variables):  # nothing was assigned
        np.testing.assert_array_equal(a, b.numpy())
