"""Nested structures of features and of their inputs: dicts, lists and tuples, nested at will,
walked in one order (a dict's entries by sorted key, as ``keras.tree`` does), with each leaf's
path (``"a.0.b"``) to name it in errors.

Example:
    >>> leaves = flatten({"b": [1, 2], "a": 3}, None)
    >>> [(path_name(p), v) for p, v in leaves]
    [('a', 3), ('b.0', 1), ('b.1', 2)]
    >>> pack({"b": [0, 0], "a": 0}, [30, 10, 20])
    {'b': [10, 20], 'a': 30}
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf


def path_name(path: tuple) -> str:
    """A leaf's path as text: ``("a", 0)`` -> ``"a.0"``."""
    return ".".join(str(p) for p in path) if path else "the top level"


def is_shape(value: Any) -> bool:
    """Whether `value` is one shape (a leaf of a structure of shapes), not a structure of them."""
    return value is None or isinstance(value, tf.TensorShape) or (
        isinstance(value, (tuple, list)) and all(d is None or isinstance(d, (int, np.integer)) for d in value))


def flatten(values: Any, is_leaf: Callable[[Any], bool] | None, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, leaf) pairs, dict entries in the order of their sorted keys (as keras.tree), stopping at `is_leaf`."""
    if is_leaf is not None and is_leaf(values):
        return [(prefix, values)]
    if isinstance(values, Mapping):
        return [pair for key in sorted(values) for pair in flatten(values[key], is_leaf, (*prefix, key))]
    if isinstance(values, (list, tuple)):
        return [pair for i, v in enumerate(values) for pair in flatten(v, is_leaf, (*prefix, i))]
    return [(prefix, values)]


def pack(structure: Any, leaves: list) -> Any:
    """`leaves` in the nested `structure` of features, in `flatten`'s order."""
    leaves = iter(leaves)

    def build(node: Any) -> Any:
        if isinstance(node, Mapping):
            built = {key: build(node[key]) for key in sorted(node)}
            return {key: built[key] for key in node}  # the caller's key order
        if isinstance(node, (list, tuple)):
            items = [build(v) for v in node]
            return type(node)(*items) if hasattr(node, "_fields") else type(node)(items)
        return next(leaves)

    return build(structure)
