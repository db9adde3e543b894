from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from sok_tutorial.embedding.initializers import (  # noqa: E402
    KeyedInitializer,
    init_spec,
    keyed_initial_values,
    keyed_initial_values_tf,
)

EXTREMES = np.array([-(2**63), -(2**63) + 1, -1, 0, 1, 2**40, 2**63 - 2, 2**63 - 1], np.int64)
SPECS = {"uniform": keras.initializers.RandomUniform(-0.2, 0.1, seed=3), "normal": "random_normal",
         "truncated": keras.initializers.TruncatedNormal(0.5, 0.01, seed=9), "ones": "ones"}


def _keys(n: int = 5000) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([EXTREMES, rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)])


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("dim", [1, 3, 16])
def test_graph_values_equal_the_numpy_specification(name, dim):
    spec, keys = init_spec(SPECS[name]), _keys()
    want = keyed_initial_values(keys, dim, spec)
    got = tf.function(lambda k: keyed_initial_values_tf(k, dim, spec))(tf.constant(keys)).numpy()
    assert got.dtype == np.float32 and got.shape == (len(keys), dim)
    if spec.kind in ("uniform", "constant"):
        np.testing.assert_array_equal(got, want)  # integer arithmetic and two float32 operations
    else:  # log and cos may round their last bit differently
        assert np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64)).max() <= 1


def test_values_follow_the_distribution_and_differ_per_key_and_seed():
    keys = _keys(20_000)
    uniform = keyed_initial_values(keys, 8, init_spec(SPECS["uniform"]))
    assert uniform.min() > -0.2 and uniform.max() < 0.1 and abs(uniform.mean() + 0.05) < 1e-3
    assert len(np.unique(uniform, axis=0)) == len(keys)  # no two keys share a vector
    assert np.abs(np.corrcoef(uniform.T) - np.eye(8)).max() < 0.05  # columns independent
    normal = keyed_initial_values(keys, 8, init_spec("random_normal"))
    assert abs(normal.std() - 0.05) < 1e-3 and abs(normal.mean()) < 1e-3
    truncated = keyed_initial_values(keys, 8, init_spec(SPECS["truncated"]))
    assert truncated.min() >= 0.48 - 1e-6 and truncated.max() <= 0.52 + 1e-6
    again = keyed_initial_values(keys[::-1], 8, init_spec(SPECS["uniform"]))[::-1]
    np.testing.assert_array_equal(again, uniform)  # a pure function of each key, whatever the batch
    other_seed = keyed_initial_values(keys, 8, init_spec(keras.initializers.RandomUniform(-0.2, 0.1, seed=4)))
    assert (other_seed != uniform).mean() > 0.99


def test_keyed_initializer_writes_row_r_as_key_r():
    table = KeyedInitializer("normal", 0.0, 0.1, seed=5)((300, 4)).numpy()
    np.testing.assert_array_equal(table, keyed_initial_values(np.arange(300), 4, init_spec(
        keras.initializers.RandomNormal(stddev=0.1, seed=5))))
    assert not KeyedInitializer(dynamic=True)((3, 2)).numpy().any()
    saved = {"class_name": "KeyedInitializer", "config": KeyedInitializer("normal", 1.0, 2.0, 7).get_config()}
    assert init_spec(saved) == init_spec(keras.initializers.RandomNormal(1.0, 2.0, seed=7))


def test_unsupported_initializers_are_named():
    with pytest.raises(ValueError, match="embedding_initializer='orthogonal' is not supported"):
        init_spec("orthogonal")
