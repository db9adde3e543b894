"""What a placement of a table over replicas costs, in numbers: the shardings and exchanges the
layers offer, rows and column slices per replica, bytes exchanged per step (`exchange_bytes`, the
table in `sok_tutorial.embedding.sharding`'s docstring), the table-wise placement of slots, and
the bytes a replica holds (`replica_bytes`). `ShardedTable` and `ColumnShardedTable` build what
these count; `sok_tutorial.embedding.planner` prices placements with them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kernels import checks

SHARDINGS = ("replicated", "row", "table", "column")
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


def column_slices(dim: int, num_replicas: int) -> list[int]:
    """Widths of the column slices of a ``dim``-wide table over `num_replicas` replicas (column-wise
    sharding): as equal as possible, the wider ones first; each replica stores ``max`` of them.

    Example:
        >>> column_slices(10, 4), column_slices(16, 2)
        ([3, 3, 2, 2], [8, 8])
    """
    checks.positive_int("dim", dim)
    checks.positive_int("num_replicas", num_replicas)
    if dim < num_replicas:
        raise ValueError(f"dim={dim} is smaller than num_replicas={num_replicas}: a column slice would be empty; "
                         "use sharding='row' or a wider table")
    base, wider = divmod(dim, num_replicas)
    return [base + 1] * wider + [base] * (num_replicas - wider)


def exchange_bytes(sharding: str, num_replicas: int, keys_per_replica: int, dim: int,
                   exchange: str = "all_gather") -> int:
    """Bytes one replica receives per training step for a table's lookup and gradient, counted
    from the shapes of the collectives the layers issue (ring algorithms, float32, int64 ids).

    Example:
        >>> exchange_bytes("row", 2, 1000, 16), exchange_bytes("replicated", 2, 1000, 16)
        (144008, 72000)
        >>> exchange_bytes("column", 2, 1000, 16)
        136008
    """
    checks.one_of("sharding", sharding, SHARDINGS)
    checks.one_of("exchange", exchange, EXCHANGES)
    others = (num_replicas - 1) * keys_per_replica
    if num_replicas == 1:
        return 0
    if sharding == "replicated":
        return others * (dim * 4 + 8)  # the all-reduce of IndexedSlices gathers rows and ids
    total = (num_replicas - 1) * 8 + others * 8 + others * dim * 4  # counts, keys, gradients backward
    if sharding == "table":
        total += others * 8  # slot ids
    if sharding == "column":  # no positions: every replica gets every replica's [N*K, ceil(d/N)] slice
        if exchange == "all_gather":
            return total + others * num_replicas * math.ceil(dim / num_replicas) * 4
        return total + 2 * others * dim * 4  # ring all-reduce of [N*K, dim] holding each replica's columns
    if exchange == "all_gather":
        return total + others * 8 + others * dim * 4  # positions, owned vectors
    return total + 2 * others * dim * 4  # ring all-reduce of the [N*K, dim] masked vectors


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
