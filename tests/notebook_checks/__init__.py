"""The checks of each notebook's metrics.json, one module per notebook (``nbNN.py``).

Each module names its ``NOTEBOOK`` and gives ``SMOKE = (parameters, check)``, the fast tier's run,
and, where the notebook's point needs more data, ``LARGER = (parameters, margins)``. A check takes
the metrics the notebook wrote and the parameters it ran with, and asserts.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

Check = Callable[[dict, dict], None]
Run = tuple[dict[str, Any], Check]


def collect() -> tuple[dict[str, Run], dict[str, Run]]:
    """(SMOKE, LARGER): each notebook's runs by notebook name, from the ``nbNN`` modules."""
    smoke: dict[str, Run] = {}
    larger: dict[str, Run] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("nb"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        smoke[module.NOTEBOOK] = module.SMOKE
        if getattr(module, "LARGER", None) is not None:
            larger[module.NOTEBOOK] = module.LARGER
    return smoke, larger
