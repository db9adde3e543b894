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
    """Slots of sizes `slot_sizes` over `num_replicas` replicas (`plan_table_wise`): every replica
    is a row group of its own (``rows = N``), and a key's group is its slot's replica, so the
    lookup sends each key's slot id with it; each row also records its slot (8 bytes), so a
    checkpoint can place it again. A table with an eviction policy keeps each replica's slots in
    buckets of their own (`bucket_shards` is 1): it keeps the keys one device would while no bucket
    overflows."""

    name = "table"
    columns = 1
    needs_slots = True

    def __init__(self, num_replicas: int, slot_sizes: Sequence[int] | None = None):
        super().__init__(num_replicas)
        self.rows = self.num_replicas
        self.slot_sizes = None if slot_sizes is None else [int(s) for s in slot_sizes]

    def owners(self, rows: int) -> tuple[list[int], list[int]]:
        """(replica of each slot, rows each replica stores) for a layer of `rows` rows (used only
        when the layout was given no `slot_sizes`: one slot of `rows` rows)."""
        return plan_table_wise(self.slot_sizes or [rows], self.num_replicas)

    @property
    def bucket_shards(self) -> int:
        return 1

    def group_of(self, keys: Any, slots: Any = None, buckets: Any = None) -> Any:
        """The replica of each key's slot (`slots`, an int64 tensor)."""
        import tensorflow as tf

        return tf.gather(tf.constant(self.owners(0)[0], tf.int64), slots)

    def group_of_np(self, keys: np.ndarray, slots: np.ndarray | None = None, buckets: Any = None) -> np.ndarray:
        return np.asarray(self.owners(0)[0], np.int64)[slots]

    def rows_per_replica(self, rows: int) -> int:
        return max(self.owners(rows)[1])

    def overfills(self, capacity: int) -> str | None:
        load = max(self.owners(0)[1]) if self.slot_sizes else 0
        if load > capacity:
            return (f"table-wise placement puts {load:,} rows on one replica, more than "
                    f"max_vocabulary_size_per_gpu={capacity:,}")
        return None

    def always_indexed(self) -> bool:
        return True

    def touched_rows(self, keys_per_replica: int) -> int:
        return keys_per_replica

    def _forward_bytes(self, others: int, dim: int, exchange: str) -> int:
        return others * ID_BYTES + super()._forward_bytes(others, dim, exchange)  # slot ids with the keys


SHARDINGS = {"table": lambda n, dim, column_shards, slot_sizes: TableWise(n, slot_sizes)}
