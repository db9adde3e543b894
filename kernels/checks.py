"""Argument checks shared by every layer: each error names the argument, the value and what
was expected, so bad input fails early and says how to fix it."""
from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np


def positive_int(name: str, value: Any, *, allow_zero: bool = False) -> int:
    """`value` as an int if it is an integer >= 1 (>= 0 with `allow_zero`), else ValueError."""
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        what = "a non-negative integer" if allow_zero else "a positive integer"
        raise ValueError(f"{name}={value!r} is invalid: expected {what}")
    return int(value)


def int64_range(name: str, values: np.ndarray) -> None:
    """ValueError if integer `values` of an unsigned dtype hold one past int64's range (a key that
    would wrap to a negative one as int64)."""
    if values.dtype.kind == "u" and values.size and values.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit in int64, got {values.max()}")


def flag(name: str, value: Any) -> bool:
    """`value` as a bool if it is one (Python's or NumPy's), else ValueError: a string such as
    ``"False"`` would otherwise read as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r} is invalid: expected True or False")
    return bool(value)


def fraction(name: str, value: Any, *, low: float = 0.0, high: float = 1.0) -> float:
    """`value` as a float in [low, high], else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low <= value <= high:
        raise ValueError(f"{name}={value!r} is invalid: expected a number in [{low}, {high}]")
    return float(value)


def one_of(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """`value` if it is one of `choices`, else ValueError listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is invalid: expected one of {choices}")
    return value


def known_names(name: str, values: Iterable[str], known: Iterable[str]) -> list[str]:
    """`values` as a list if every entry is in `known`, else ValueError naming the unknown ones."""
    values, known = list(values), list(known)
    unknown = [v for v in values if v not in known]
    if unknown:
        raise ValueError(f"{name}: unknown column(s) {unknown}; available columns are {known}")
    return values


def names(name: str, value: Any) -> list[str]:
    """Column names as a list: one string is one name (never split into characters), else a
    sequence of strings; anything else is a TypeError naming the argument.

    Example:
        >>> names("label_names", "label"), names("cat_names", ("a", "b"))
        (['label'], ['a', 'b'])
    """
    if isinstance(value, str):
        return [value]
    try:
        values = list(value)
    except TypeError:
        raise TypeError(f"{name}={value!r} is invalid: expected a column name or a sequence of names") from None
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise TypeError(f"{name}={value!r} is invalid: expected names (str), got {bad[:3]}")
    return values
