"""`Replicated`: a full copy of the table on every replica, gradients all-reduced."""
from __future__ import annotations

from sok_tutorial.embedding.layouts.base import FLOAT_BYTES, ID_BYTES, Layout


class Replicated(Layout):
    """Every replica holds every row; a step all-reduces the gradients of every replica's rows
    (``tf.IndexedSlices``, which the all-reduce gathers: rows and ids)."""

    name = "replicated"

    def exchange_bytes(self, keys_per_replica: int, dim: int, exchange: str = "all_gather") -> int:
        return (self.num_replicas - 1) * keys_per_replica * (dim * FLOAT_BYTES + ID_BYTES)


SHARDINGS = {"replicated": lambda n, dim, column_shards, slot_sizes: Replicated(n)}
