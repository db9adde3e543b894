"""Key-seeded initial values: a key's first vector is a pure function of the key.

A key starts from the same vector whichever row it lands in, whichever replica or shard meets
it first, however the table is split, and whether its row is written by a Keras initializer,
by a dynamic table inside the graph or by the training cache: that is why 1, 2 or 4 replicas,
and a table trained through the cache, train identically.

`keyed_initial_values` (NumPy) is the specification; `keyed_initial_values_tf` computes the same
values with TensorFlow ops, inside the graph, for the keys a dynamic table meets for the first
time. The recipe, all integers in uint64 arithmetic::

    base    = mix64(key ^ mix64(64 * seed + stream))             one 64-bit mix per key
    bits    = (base * multiplier[column]) >> 41                  23 random bits per value
    uniform = float32(bits) * ((b - a) / 2**23) + (a + (b - a) / 2**24)      in (a, b)

with one odd multiplier per column. The mix runs once per key, and each value costs only a
multiply, a shift and two float32 operations, where a full mix per value would take about 15
elementwise passes over the new rows (two to three times the time, side by side, for the tens
of thousands of new keys a dynamic table meets in a step). Uniform values are identical, bit for bit, in both
implementations. Normal draws (Box-Muller in float64 from two such uniforms; truncated normal
redraws values beyond two standard deviations from further streams, then clips) go through
``log`` and ``cos``, whose last bit can differ between NumPy and TensorFlow. After rounding to
float32 the two agree to within one unit in the last place.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels.hashing import mix64

_SUPPORTED = "RandomUniform, RandomNormal, TruncatedNormal, Zeros, Ones, Constant (or their names)"
_GOLDEN = 0x9E3779B97F4A7C15
_BITS = 23  # random bits per value: (bits + 0.5) / 2**23 is exact in float32
_REDRAWS = 8  # truncated normal: streams tried before clipping
_INIT_CHUNK = 1 << 20  # rows a Keras initializer computes per pass (bounds temporary memory)


@dataclass(frozen=True)
class InitSpec:
    """An initializer reduced to what `keyed_initial_values` needs."""

    kind: str  # "uniform" | "normal" | "truncated_normal" | "constant"
    a: float = 0.0  # minval | mean | value
    b: float = 0.0  # maxval | stddev
    seed: int = 0


def init_spec(initializer: Any) -> InitSpec:
    """Read a Keras initializer (object, class name or ``{"class_name", "config"}``) as an `InitSpec`.

    Example:
        >>> init_spec("random_uniform")
        InitSpec(kind='uniform', a=-0.05, b=0.05, seed=0)
    """
    if initializer is None:
        initializer = "random_uniform"
    if isinstance(initializer, InitSpec):
        return initializer
    if isinstance(initializer, dict):
        name, config = initializer.get("class_name", ""), dict(initializer.get("config", {}))
    elif isinstance(initializer, str):
        name, config = initializer, {}
    else:
        name, config = type(initializer).__name__, dict(initializer.get_config())
    key = name.replace("_", "").lower()
    seed = config.get("seed")
    seed = 0 if not isinstance(seed, int) else seed
    if key in ("randomuniform", "uniform"):
        return InitSpec("uniform", float(config.get("minval", -0.05)), float(config.get("maxval", 0.05)), seed)
    if key in ("randomnormal", "normal"):
        return InitSpec("normal", float(config.get("mean", 0.0)), float(config.get("stddev", 0.05)), seed)
    if key == "truncatednormal":
        return InitSpec("truncated_normal", float(config.get("mean", 0.0)), float(config.get("stddev", 0.05)), seed)
    if key == "zeros":
        return InitSpec("constant", 0.0)
    if key == "ones":
        return InitSpec("constant", 1.0)
    if key == "constant":
        return InitSpec("constant", float(config.get("value", 0.0)))
    if key == "keyedinitializer":
        return InitSpec(config["kind"], config["a"], config["b"], config["seed"])
    raise ValueError(f"embedding_initializer={initializer!r} is not supported: embedding tables draw initial "
                     f"values from each key, for these initializers: {_SUPPORTED}")


def _salt(seed: int, stream: int) -> np.uint64:
    return mix64(np.array([(seed * 64 + stream) % 2**64], np.uint64))[0]


def _multipliers(dim: int) -> np.ndarray:
    """One odd uint64 multiplier per column."""
    with np.errstate(over="ignore"):
        return mix64(np.arange(1, dim + 1, dtype=np.uint64) * np.uint64(_GOLDEN)) | np.uint64(1)


def _scale(a: float, b: float) -> tuple[np.float32, np.float32]:
    """(scale, offset) mapping ``bits`` to ``a + (b - a) * (bits + 0.5) / 2**23`` in float32."""
    return np.float32((b - a) * 2.0**-_BITS), np.float32(a + (b - a) * 2.0**-(_BITS + 1))


def _bits(keys: np.ndarray, dim: int, seed: int, stream: int) -> np.ndarray:
    base = mix64(keys.view(np.uint64) ^ _salt(seed, stream))
    with np.errstate(over="ignore"):
        return (base[:, None] * _multipliers(dim)[None, :]) >> np.uint64(64 - _BITS)


def _normal(keys: np.ndarray, dim: int, seed: int, stream: int) -> np.ndarray:
    u1 = (_bits(keys, dim, seed, 2 * stream + 1).astype(np.float64) + 0.5) * 2.0**-_BITS
    u2 = (_bits(keys, dim, seed, 2 * stream + 2).astype(np.float64) + 0.5) * 2.0**-_BITS
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


def keyed_initial_values(keys: Any, dim: int, spec: InitSpec) -> np.ndarray:
    """Initial vectors ``[len(keys), dim]`` (float32), each a pure function of its key.

    Example:
        >>> v = keyed_initial_values(np.array([7, 7, 8]), 4, init_spec("random_uniform"))
        >>> bool((v[0] == v[1]).all()), bool((v[0] != v[2]).any()), bool((abs(v) < 0.05).all())
        (True, True, True)
    """
    keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
    if spec.kind == "constant":
        return np.full((len(keys), dim), spec.a, np.float32)
    if spec.kind == "uniform":
        scale, offset = _scale(spec.a, spec.b)
        return _bits(keys, dim, spec.seed, 0).astype(np.float32) * scale + offset
    z = _normal(keys, dim, spec.seed, 0)
    if spec.kind == "truncated_normal":  # redraw values beyond two standard deviations
        for stream in range(1, _REDRAWS + 1):
            far = np.abs(z) > 2
            if not far.any():
                break
            z = np.where(far, _normal(keys, dim, spec.seed, stream), z)
        z = np.clip(z, -2, 2)
    return (spec.a + spec.b * z).astype(np.float32)


# ----------------------------------------------------------------------------- in the graph
_C1, _C2, _C3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # (tensors made at use: imports start no TF)


def _mix64_tf(z: tf.Tensor) -> tf.Tensor:
    """``kernels.hashing.mix64`` on a uint64 tensor."""
    z = z + tf.constant(_C1, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(30, tf.uint64))) * tf.constant(_C2, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(27, tf.uint64))) * tf.constant(_C3, tf.uint64)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(31, tf.uint64)))


def _bits_tf(keys: tf.Tensor, dim: int, seed: int, stream: int) -> tf.Tensor:
    """`_bits` as int64 (each below 2**23, so the same values): a CPU converts int64 to floats
    faster than uint64 (x86 before AVX-512 has one instruction for the signed conversion only)."""
    base = _mix64_tf(tf.bitwise.bitwise_xor(tf.bitcast(keys, tf.uint64), tf.constant(_salt(seed, stream))))
    return tf.bitcast(tf.bitwise.right_shift(base[:, None] * tf.constant(_multipliers(dim))[None, :],
                                             tf.constant(64 - _BITS, tf.uint64)), tf.int64)


def _normal_tf(keys: tf.Tensor, dim: int, seed: int, stream: int) -> tf.Tensor:
    u1 = (tf.cast(_bits_tf(keys, dim, seed, 2 * stream + 1), tf.float64) + 0.5) * 2.0**-_BITS
    u2 = (tf.cast(_bits_tf(keys, dim, seed, 2 * stream + 2), tf.float64) + 0.5) * 2.0**-_BITS
    return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * math.pi * u2)


def keyed_initial_values_tf(keys: tf.Tensor, dim: int, spec: InitSpec) -> tf.Tensor:
    """`keyed_initial_values` with TensorFlow ops: ``[n, dim]`` float32 for int64 `keys` ``[n]``.

    Example:
        >>> keys = np.array([-2**63, 0, 5, 2**63 - 1])
        >>> spec = init_spec("random_uniform")
        >>> bool((keyed_initial_values_tf(tf.constant(keys), 3, spec).numpy()
        ...       == keyed_initial_values(keys, 3, spec)).all())
        True
    """
    keys = tf.reshape(tf.cast(keys, tf.int64), [-1])
    if spec.kind == "constant":
        return tf.fill(tf.stack([tf.size(keys), dim]), tf.constant(spec.a, tf.float32))
    if spec.kind == "uniform":
        scale, offset = _scale(spec.a, spec.b)
        return tf.cast(_bits_tf(keys, dim, spec.seed, 0), tf.float32) * scale + offset
    z = _normal_tf(keys, dim, spec.seed, 0)
    if spec.kind == "truncated_normal":
        for stream in range(1, _REDRAWS + 1):  # a fixed number of redraws: the graph has no early exit
            z = tf.where(tf.abs(z) > 2, _normal_tf(keys, dim, spec.seed, stream), z)
        z = tf.clip_by_value(z, -2.0, 2.0)
    return tf.cast(spec.a + spec.b * z, tf.float32)


@keras.saving.register_keras_serializable(package="sok_tutorial")
class KeyedInitializer(keras.initializers.Initializer):
    """Row ``r`` of a ``[rows, dim]`` table gets ``keyed_initial_values([r])``: the initializer of
    a table whose keys are its row ids; ``dynamic=True`` gives zeros (a dynamic table writes a
    row when its key arrives)."""

    def __init__(self, kind: str = "uniform", a: float = -0.05, b: float = 0.05, seed: int = 0,
                 dynamic: bool = False):
        self.spec = InitSpec(kind, a, b, seed)
        self.dynamic = dynamic

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        rows, dim = int(shape[0]), int(shape[1])
        if self.dynamic:
            return tf.zeros([rows, dim], dtype or "float32")
        values = np.empty((rows, dim), np.float32)
        for lo in range(0, rows, _INIT_CHUNK):
            hi = min(rows, lo + _INIT_CHUNK)
            values[lo:hi] = keyed_initial_values(np.arange(lo, hi, dtype=np.int64), dim, self.spec)
        return tf.constant(values, dtype=dtype or "float32")

    def get_config(self) -> dict[str, Any]:
        return {"kind": self.spec.kind, "a": self.spec.a, "b": self.spec.b, "seed": self.spec.seed,
                "dynamic": self.dynamic}
