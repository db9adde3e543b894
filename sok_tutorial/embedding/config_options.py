"""A table configuration's optimizer and initializer, as this library's tables take them.

Keras-RS's `TableConfig` and TensorFlow's ``tf.tpu.experimental.embedding.TableConfig`` name
each table's optimizer and initializer in their own terms; `sparse_optimizer` and
`initializer_of` give the same meaning here, or an error naming the table and what has none.

Optimizers (`sparse_optimizer`), each becoming the one of `sok_tutorial.optimizers` that updates
only the rows a step touched:

    "sgd", "adagrad", "adam", "ftrl"          SGD, Adagrad, Adam, Ftrl with Keras' defaults
    keras.optimizers.SGD / Adagrad / Adam / Ftrl
                                              the same class and arguments (learning-rate
                                              schedules, momentum, amsgrad included)
    tf.tpu.experimental.embedding.SGD         SGD(learning_rate)
    ... .Adagrad                              Adagrad(learning_rate, initial_accumulator_value)
    ... .Adam (lazy_adam=True, the default)   Adam(learning_rate, beta_1, beta_2, epsilon): the
                                              rows a step touched, bias-corrected by the step count
    ... .FTRL                                 Ftrl(learning_rate, learning_rate_power, l1, l2,
                                              beta, initial_accumulator_value)
    one of sok_tutorial.optimizers            itself
    None                                      None: the model's optimizer trains the table

Refused, with the reason: weight decay (ours would skip the table's rows), ``lazy_adam=False``
(it moves every row each step), a TPU optimizer's weight clipping, uneven gradient clipping,
``multiply_linear_by_learning_rate`` or a learning rate that is a plain callable, a
``loss_scale_factor`` on a table's optimizer (the model's scales the loss), and any other
optimizer class. TensorFlow's TPU Adam divides by ``sqrt(v + epsilon^2)`` (``sum_inside_sqrt``)
where Keras divides by ``sqrt(v) + epsilon``; the two differ only while ``v`` is near
``epsilon^2``, and the Keras form is used. Its Adagrad has no epsilon; Keras' default 1e-7 is
added under the square root (as Keras-RS maps one to the other).

Initializers (`initializer_of`): Keras' uniform, normal, truncated normal, zeros, ones and
constant initializers, TensorFlow's of the same names, and every variance-scaling one (Keras-RS's
default, Glorot, He, LeCun), which for a table of ``vocabulary_size x dim`` rows is one of the
first three with the spread its ``scale``, ``mode`` (fan in = vocabulary_size, fan out = dim) and
``distribution`` give it.

Example:
    >>> type(sparse_optimizer("adam", "items")).__name__
    'Adam'
    >>> ftrl = sparse_optimizer(tf.tpu.experimental.embedding.FTRL(0.05, l1_regularization_strength=0.01), "items")
    >>> type(ftrl).__name__, round(float(ftrl.learning_rate), 6), ftrl.l1_regularization_strength
    ('Ftrl', 0.05, 0.01)
    >>> initializer_of(keras.initializers.VarianceScaling(mode="fan_out", distribution="uniform"), 1000, 3, "items")
    InitSpec(kind='uniform', a=-1.0, b=1.0, seed=0)
"""
from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf

from sok_tutorial.embedding import optimizers as sparse
from sok_tutorial.embedding.initializers import InitSpec, init_spec
from sok_tutorial.embedding.optimizers.base import SparseOptimizer

NAMES = {"sgd": sparse.SGD, "adagrad": sparse.Adagrad, "adam": sparse.Adam, "ftrl": sparse.Ftrl}
KERAS = {keras.optimizers.SGD: sparse.SGD, keras.optimizers.Adagrad: sparse.Adagrad,
         keras.optimizers.Adam: sparse.Adam, keras.optimizers.Ftrl: sparse.Ftrl}
_TPU = tf.tpu.experimental.embedding
TPU_ARGUMENTS = {  # TensorFlow's TPU optimizer -> (ours, the arguments that carry over with the same name)
    _TPU.SGD: (sparse.SGD, ()),
    _TPU.Adagrad: (sparse.Adagrad, ("initial_accumulator_value",)),
    _TPU.Adam: (sparse.Adam, ("beta_1", "beta_2", "epsilon")),
    _TPU.FTRL: (sparse.Ftrl, ("learning_rate_power", "l1_regularization_strength", "l2_regularization_strength",
                              "beta", "initial_accumulator_value")),
}
SUPPORTED = ("'sgd', 'adagrad', 'adam', 'ftrl', keras.optimizers.SGD / Adagrad / Adam / Ftrl, their "
             "tf.tpu.experimental.embedding counterparts, or one of sok_tutorial.optimizers")


def sparse_optimizer(optimizer: Any, table: str) -> Any:
    """`optimizer` (a table configuration's) as one of `sok_tutorial.optimizers`, or None (module docstring)."""
    if optimizer is None:
        return None
    where = f"table {table!r}: optimizer={_describe(optimizer)}"
    if isinstance(optimizer, str):
        if optimizer.lower() not in NAMES:
            raise ValueError(f"{where} is not supported: expected {SUPPORTED}")
        return NAMES[optimizer.lower()]()
    if isinstance(optimizer, SparseOptimizer):
        _check_keras(optimizer, where)
        return optimizer
    if isinstance(optimizer, keras.optimizers.Optimizer):
        ours = KERAS.get(type(optimizer))
        if ours is None:
            raise ValueError(f"{where} is not supported: expected {SUPPORTED}")
        _check_keras(optimizer, where)
        return ours.from_config(optimizer.get_config())
    kind = next((k for k in TPU_ARGUMENTS if type(optimizer) is k), None)
    if kind is None:
        raise ValueError(f"{where} is not supported: expected {SUPPORTED}")
    return _from_tpu(optimizer, *TPU_ARGUMENTS[kind], where)


def _check_keras(optimizer: Any, where: str) -> None:
    if optimizer.weight_decay:
        raise ValueError(f"{where} has weight_decay={optimizer.weight_decay}: not supported for a table, whose "
                         "rows the sparse optimizers never decay (a decay of every row would touch them all each "
                         "step); leave weight_decay unset")
    if optimizer.loss_scale_factor is not None:
        raise ValueError(f"{where} has loss_scale_factor={optimizer.loss_scale_factor}: expected None for a table's "
                         "optimizer (the model's optimizer scales the loss and unscales every gradient)")


def _from_tpu(optimizer: Any, ours: type, names: tuple[str, ...], where: str) -> Any:
    rate = optimizer.learning_rate
    if callable(rate) and not isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(f"{where} has a callable learning_rate: expected a number or a "
                         "keras.optimizers.schedules.LearningRateSchedule")
    refused = {"clip_weight_min": optimizer.clip_weight_min, "clip_weight_max": optimizer.clip_weight_max,
               "weight_decay_factor": optimizer.weight_decay_factor or None,
               "multiply_linear_by_learning_rate": getattr(optimizer, "multiply_linear_by_learning_rate", None) or None,
               "lazy_adam=False (every row moves each step)": None if getattr(optimizer, "lazy_adam", True) else True}
    for name, value in refused.items():
        if value is not None:
            raise ValueError(f"{where} sets {name if '=' in name else f'{name}={value}'}, which these tables do "
                             "not support: leave it unset")
    low, high = optimizer.clip_gradient_min, optimizer.clip_gradient_max
    kwargs = {"learning_rate": rate, **{name: getattr(optimizer, name) for name in names}}
    if low is not None or high is not None:
        if low is None or high is None or low != -high:
            raise ValueError(f"{where} clips gradients to [{low}, {high}]: only an even clipvalue (-c, c) is supported")
        kwargs["clipvalue"] = high
    return ours(**kwargs)


def _describe(optimizer: Any) -> str:
    if isinstance(optimizer, str):
        return repr(optimizer)
    return f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"


def initializer_of(initializer: Any, rows: int, dim: int, table: str) -> InitSpec:
    """A table configuration's initializer (module docstring) as the `InitSpec` our tables draw
    each key's first vector from; ValueError naming the table for any other."""
    if initializer is None:
        initializer = "uniform"  # keras.layers.Embedding's, which Keras-RS falls back to
    if isinstance(initializer, (str, dict)):
        try:
            initializer = keras.initializers.get(initializer)
        except ValueError as exc:
            raise ValueError(f"table {table!r}: initializer={initializer!r} is unknown to Keras ({exc})") from None
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    if {"scale", "mode", "distribution"} <= set(config):
        fan = {"fan_in": rows, "fan_out": dim, "fan_avg": (rows + dim) / 2}[config["mode"]]
        variance = config["scale"] / max(1.0, fan)
        seed = config.get("seed") if isinstance(config.get("seed"), int) else 0
        kind = config["distribution"]
        if kind == "uniform":
            limit = math.sqrt(3.0 * variance)
            return InitSpec("uniform", -limit, limit, seed)
        if kind == "truncated_normal":  # the stddev of the normal before truncation at 2 of them
            return InitSpec("truncated_normal", 0.0, math.sqrt(variance) / 0.87962566103423978, seed)
        return InitSpec("normal", 0.0, math.sqrt(variance), seed)
    try:
        return init_spec(initializer)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"table {table!r}: {exc}") from None
