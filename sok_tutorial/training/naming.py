"""Matching saved variables to a model's when Keras numbered the names differently.

Layers and seed generators that Keras names itself are numbered per process, in the order they
are built (``dense``, ``dense_1``, ...), so a second instance of a model, or a process that builds
other layers first, names the same variables differently. `match` pairs them by name without
those numbers plus shape, in the model's order (which its architecture fixes).

Example:
    >>> import numpy as np
    >>> class V:
    ...     def __init__(self, shape): self.shape = shape
    >>> a, b = V((4, 2)), V((2,))
    >>> [(name, v is a) for name, v in match({"dense/kernel": (4, 2), "dense/bias": (2,)},
    ...                                      {"dense_3/kernel": a, "dense_3/bias": b}, "ckpt")]
    [('dense/kernel', True), ('dense/bias', False)]
"""
from __future__ import annotations

import re
from typing import Any

_AUTO_NUMBER = re.compile(r"_\d+(?=[/_]|$)")  # Keras' per-process suffix: dense_3/, seed_generator_6/


def same_name(saved: str, current: str) -> bool:
    """Whether two layer or variable paths name the same thing, Keras' auto-numbers aside.

    Example:
        >>> same_name("embedding_table_3", "embedding_table"), same_name("users", "items")
        (True, False)
    """
    return _group(saved, ())[0] == _group(current, ())[0]


def _group(name: str, shape: Any) -> tuple[str, tuple[int, ...]]:
    """A variable's name without Keras' auto-numbers (``dense_3`` -> ``dense``), and its shape."""
    return _AUTO_NUMBER.sub("", name.split("#")[0]), tuple(int(d) for d in shape)


def match(saved: dict[str, tuple[int, ...]], current: dict[str, Any], where: str) -> list[tuple[str, Any]]:
    """Pair saved arrays (``{name: shape}`` in save order) with the variables of `current`.

    Layers and seed generators that Keras names itself are numbered per process, in the order
    they are built, so a second instance of a model (or a new process that builds other layers
    first) names the same variables differently: ``dense_3/kernel`` for ``dense/kernel``. Names
    are therefore compared without those numbers, together with shapes, and variables of one
    such group pair up in order (the model's own order, which its architecture fixes).

    Raises:
        ValueError: the groups differ (a variable missing on one side, or another shape); the
            message names them.
    """
    groups: dict[tuple[str, tuple[int, ...]], tuple[list[str], list[Any]]] = {}
    for name, shape in saved.items():
        groups.setdefault(_group(name, shape), ([], []))[0].append(name)
    for name, variable in current.items():
        groups.setdefault(_group(name, variable.shape), ([], []))[1].append(variable)
    surplus = {"the save": [], "the model": []}
    for (name, shape), (a, b) in groups.items():
        if len(a) != len(b):
            n = abs(len(a) - len(b))
            surplus["the save" if len(a) > len(b) else "the model"].append(
                f"{name} {list(shape)}" + (f" (x{n})" if n > 1 else ""))
    if any(surplus.values()):
        raise ValueError(f"the save in {where!r} does not match this model's variables (compared by name without "
                         "Keras' auto-numbers, and shape): " + "; ".join(
                             f"only in {side}: {', '.join(items[:4])}" + (f" and {len(items) - 4} more"
                                                                          if len(items) > 4 else "")
                             for side, items in surplus.items() if items))
    return [pair for names, variables in groups.values() for pair in zip(names, variables)]


