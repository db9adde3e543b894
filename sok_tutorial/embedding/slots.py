"""Which optimizer variables hold a table's per-row state (for sizing, checkpoints and the cache)."""
from __future__ import annotations

from typing import Any


def table_slots(optimizer: Any, table: Any) -> list[Any]:
    """The optimizer variables holding per-row state of `table` (first dimension = its rows)."""
    if optimizer is None or not getattr(optimizer, "built", False):
        return []
    prefix = table.path.replace("/", "_") + "_"  # Keras names slots "<variable path>_<slot>"
    rows = int(table.shape[0])
    return [v for v in optimizer.variables
            if v.name.startswith(prefix) and len(v.shape) and int(v.shape[0]) == rows]
