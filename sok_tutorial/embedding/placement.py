"""What a placement of a table over replicas costs, in numbers: the shardings and exchanges the
layers offer, rows per replica, bytes exchanged per step (`exchange_bytes`, the table in
`sok_tutorial.embedding.sharding`'s docstring) and the bytes a replica holds (`replica_bytes`).
The layouts themselves (`sok_tutorial.embedding.layouts`: column slices, the grid of
``"row_column"``, the table-wise placement of slots) are re-exported here. `ShardedTable`
builds what these count; `sok_tutorial.embedding.planner` prices placements with them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding.layouts import SHARDINGS, column_slices, grid_shape, layout_of, plan_table_wise

__all__ = ["EXCHANGES", "SHARDINGS", "column_slices", "exchange_bytes", "grid_shape", "plan_table_wise",
           "replica_bytes", "rows_per_replica"]

EXCHANGES = ("all_gather", "all_reduce")


def rows_per_replica(vocabulary_size: int, num_replicas: int) -> int:
    """``max_vocabulary_size_per_gpu`` for a table of `vocabulary_size` rows sharded row-wise.

    Example:
        >>> rows_per_replica(1000, 3)
        334
    """
    checks.positive_int("vocabulary_size", vocabulary_size)
    checks.positive_int("num_replicas", num_replicas)
    if vocabulary_size < num_replicas:
        raise ValueError(f"vocabulary_size={vocabulary_size} is smaller than num_replicas={num_replicas}: a "
                         "row-wise shard would be empty; mark the table sharding='replicated'")
    return math.ceil(vocabulary_size / num_replicas)


def exchange_bytes(sharding: str, num_replicas: int, keys_per_replica: int, dim: int,
                   exchange: str = "all_gather", column_shards: int | None = None) -> int:
    """Bytes one replica receives per training step for a table's lookup and gradient, counted
    from the shapes of the collectives the layers issue (ring algorithms, float32, int64 ids), by
    the table's layout (`sok_tutorial.embedding.layouts`). `column_shards`: the grid of
    ``"row_column"`` (`grid_shape`; only for that sharding).

    Example:
        >>> exchange_bytes("row", 2, 1000, 16), exchange_bytes("replicated", 2, 1000, 16)
        (136016, 72000)
        >>> exchange_bytes("column", 2, 1000, 16)
        136016
        >>> exchange_bytes("row_column", 4, 1000, 16), exchange_bytes("row_column", 4, 1000, 16, column_shards=4)
        (408048, 408048)
    """
    checks.one_of("exchange", exchange, EXCHANGES)
    layout = layout_of(sharding, num_replicas, dim=dim, column_shards=column_shards)
    return layout.exchange_bytes(keys_per_replica, dim, exchange)


def replica_bytes(tables: Sequence[Any], optimizer: Any = None) -> int:
    """Bytes one replica stores for `tables` (or the layers holding them): each table's variables
    (rows, and the key index of a dynamic table) and its optimizer slots; for a layer of several
    tables (`QREmbedding`, `MixedDimensionEmbedding`), all of them and its projections' kernels
    with their slots."""
    out = 0
    for item in tables:
        owned = getattr(item, "tables", None)
        for table in owned if owned is not None else [getattr(item, "table", item)]:
            for v in (*table.variables, *table.optimizer_slots(optimizer)):
                out += int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
        for kernel in (p.kernel for p in getattr(item, "projections", ())):
            prefix = kernel.path.replace("/", "_") + "_"  # Keras names slots "<variable path>_<slot>"
            slots = [v for v in getattr(optimizer, "variables", []) if v.name.startswith(prefix)] \
                if getattr(optimizer, "built", False) else []
            out += sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in (kernel, *slots))
    return out
