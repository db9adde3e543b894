"""Lazy attribute access for packages, so TensorFlow is imported only when a TF-facing name is
used: data preparation and `data_gen` stay importable (and fast) without it."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``names[attr]`` (a submodule path) on first use."""

    def __getattr__(attr: str) -> Any:
        if attr not in names:
            raise AttributeError(f"module {package!r} has no attribute {attr!r}")
        module = importlib.import_module(names[attr])
        return module if names[attr] == f"{package}.{attr}" else getattr(module, attr)

    return __getattr__
