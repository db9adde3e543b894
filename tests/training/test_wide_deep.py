"""WideAndDeep: the wide part adds to the deep logit, dropout only in training, saves of the
embedding training cache load into a new instance."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from sok_tutorial.cache import EmbeddingTrainingCache, HostMemoryPS  # noqa: E402
from sok_tutorial.models import WideAndDeep  # noqa: E402

ROWS, WIDE, DEEP = 64, 5, 3


def _batch(n: int = 8, seed: int = 0) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = {"categorical": tf.constant(rng.integers(0, ROWS, (n, WIDE))),
                "continuous": tf.constant(rng.normal(size=(n, 13)).astype("float32"))}
    return features, rng.integers(0, 2, (n, 1)).astype("float32")


def _model() -> WideAndDeep:
    keras.utils.set_random_seed(0)
    model = WideAndDeep(ROWS, WIDE, DEEP, embedding_dim=4, hidden=[16, 8], dropout=0.5, name="wdl")
    model.compile(sok.optimizers.Adam(0.01), keras.losses.BinaryCrossentropy(from_logits=True))
    model(_batch()[0])
    return model


def test_logit_is_deep_plus_summed_wide_and_dropout_only_trains():
    model = _model()
    features, _ = _batch()
    full = model(features).numpy()[:, 0]
    wide = model.wide.embedding_variable.numpy()[features["categorical"].numpy()].sum(axis=(1, 2))  # (B,)
    model.wide.embedding_variable.assign(np.zeros((ROWS, 1), np.float32))
    np.testing.assert_allclose(model(features).numpy()[:, 0] + wide, full, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model(features).numpy(), model(features, training=False).numpy())
    assert not np.allclose(model(features, training=True).numpy(), model(features).numpy())


def test_cache_save_loads_into_a_new_instance(tmp_path):
    model = _model()
    cache = EmbeddingTrainingCache(model, HostMemoryPS(), device_capacity_rows=ROWS)
    keys = np.arange(1000, 1000 + ROWS)
    features, labels = _batch()
    cache.update(keys)
    model.fit({**features, "categorical": tf.constant(cache.remap(keys[features["categorical"].numpy()]))},
              labels, verbose=0)
    cache.write_back()
    assert {name: len(k) > 0 for name, (k, _) in cache.get_incremental_model().items()} == {"wide": True, "deep": True}
    cache.save_params_to_files(tmp_path)

    other = _model()
    EmbeddingTrainingCache(other, HostMemoryPS(), device_capacity_rows=ROWS, train_from_scratch=False,
                           dest_sparse_models=tmp_path)
    for a, b in zip(other.get_layer("fc_0").get_weights(), model.get_layer("fc_0").get_weights()):
        np.testing.assert_array_equal(a, b)


def test_bad_slots_are_named():
    with pytest.raises(ValueError, match="deep_slots=4 is more than wide_slots=3"):
        WideAndDeep(10, wide_slots=3, deep_slots=4)
