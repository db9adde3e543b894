"""`TableWise`: each slot of a layer is a table placed whole on one replica (SOK's "localized")."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kernels import checks
from sok_tutorial.embedding.layouts.base import ID_BYTES, Layout


def plan_table_wise(slot_sizes: Sequence[int], num_replicas: int) -> tuple[list[int], list[int]]:
    """(owner replica of each slot, rows each replica stores): largest tables first, each to the
    least loaded replica, so every replica holds about ``sum(slot_sizes) / num_replicas`` rows.

    Example:
        >>> plan_table_wise([100, 10, 60, 50], 2)
        ([0, 0, 1, 1], [110, 110])
    """
    checks.positive_int("num_replicas", num_replicas)
    sizes = [checks.positive_int(f"slot_sizes[{i}]", s) for i, s in enumerate(slot_sizes)]
    owners, load = [0] * len(sizes), [0] * num_replicas
    for slot in sorted(range(len(sizes)), key=lambda s: (-sizes[s], s)):
        target = min(range(num_replicas), key=lambda r: (load[r], r))
        owners[slot] = target
        load[target] += sizes[slot]
    return owners, load


class TableWise(Layout):
    """Slots of sizes `slot_sizes` over `num_replicas` replicas (`plan_table_wise`); each row also
    records its slot (8 bytes), so a checkpoint can place it again, and a lookup sends each key's
    slot id with it."""

    name = "table"

    def __init__(self, num_replicas: int, slot_sizes: Sequence[int] | None = None):
        super().__init__(num_replicas)
        self.slot_sizes = None if slot_sizes is None else [int(s) for s in slot_sizes]

    def owners(self, rows: int) -> tuple[list[int], list[int]]:
        """(replica of each slot, rows each replica stores) for a layer of `rows` rows (used only
        when the layout was given no `slot_sizes`: one slot of `rows` rows)."""
        return plan_table_wise(self.slot_sizes or [rows], self.num_replicas)

    def owner_of(self, slots: Any) -> Any:
        """The replica holding each key, from its slot (an int64 tensor; the layout's `slot_sizes`
        are known)."""
        import tensorflow as tf

        return tf.gather(tf.constant(self.owners(0)[0], tf.int64), slots)

    def owner_of_np(self, slots: np.ndarray) -> np.ndarray:
        """NumPy twin of `owner_of`."""
        return np.asarray(self.owners(0)[0], np.int64)[slots]

    def rows_per_replica(self, rows: int) -> int:
        return max(self.owners(rows)[1])

    def always_indexed(self) -> bool:
        return True

    def touched_rows(self, keys_per_replica: int) -> int:
        return keys_per_replica

    def _forward_bytes(self, others: int, dim: int, exchange: str) -> int:
        return others * ID_BYTES + super()._forward_bytes(others, dim, exchange)  # slot ids with the keys
