"""What a placement of a table over replicas costs, in numbers: the shardings and exchanges the
layers offer, rows and column slices per replica, the row x column grid of ``"row_column"``
(`grid_shape`), bytes exchanged per step (`exchange_bytes`, the table in
`sok_tutorial.embedding.sharding`'s docstring), the table-wise placement of slots, and the bytes
a replica holds (`replica_bytes`). `ShardedTable`, `ColumnShardedTable` and `GridShardedTable`
build what these count; `sok_tutorial.embedding.planner` prices placements with them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kernels import checks

SHARDINGS = ("replicated", "row", "table", "column", "row_column")
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


def grid_shape(num_replicas: int, dim: int, column_shards: int | None = None) -> tuple[int, int]:
    """(row groups R, column groups C) of a ``sharding="row_column"`` table: replica ``r`` holds
    the keys ``k`` with ``k mod R == r // C``, and column slice ``r % C`` of
    ``column_slices(dim, C)``.

    `column_shards` (C) must divide `num_replicas` and be at most `dim`. The default is the
    squarest grid with no more column groups than row groups: the largest such divisor with
    ``C * C <= N``. A row's lookups and updates are then shared by C replicas (a hot key weighs
    on one replica row-wise, on all of them column-wise), while a dynamic table's key index is
    kept by the C replicas of its row group only (column-wise, by all N). A prime N gives C = 1,
    the row-wise placement.

    Example:
        >>> grid_shape(4, 16), grid_shape(8, 16), grid_shape(8, 16, column_shards=4), grid_shape(4, 1)
        ((2, 2), (4, 2), (2, 4), (4, 1))
    """
    n, dim = checks.positive_int("num_replicas", num_replicas), checks.positive_int("dim", dim)
    divisors = [c for c in range(1, n + 1) if n % c == 0]
    if column_shards is None:
        column_shards = max(c for c in divisors if c * c <= n and c <= dim)
    c = checks.positive_int("column_shards", column_shards)
    if n % c:
        raise ValueError(f"column_shards={c} does not divide num_replicas={n}: the replicas form a grid of "
                         f"num_replicas / column_shards row groups x column_shards column groups; expected one of "
                         f"{divisors}")
    if c > dim:
        raise ValueError(f"column_shards={c} is larger than dim={dim}: a column slice would be empty; expected "
                         f"one of {[d for d in divisors if d <= dim]}")
    return n // c, c


def exchange_bytes(sharding: str, num_replicas: int, keys_per_replica: int, dim: int,
                   exchange: str = "all_gather", column_shards: int | None = None) -> int:
    """Bytes one replica receives per training step for a table's lookup and gradient, counted
    from the shapes of the collectives the layers issue (ring algorithms, float32, int64 ids).
    `column_shards`: the grid of ``"row_column"`` (`grid_shape`; only for that sharding).

    Example:
        >>> exchange_bytes("row", 2, 1000, 16), exchange_bytes("replicated", 2, 1000, 16)
        (144008, 72000)
        >>> exchange_bytes("column", 2, 1000, 16)
        136008
        >>> exchange_bytes("row_column", 4, 1000, 16), exchange_bytes("row_column", 4, 1000, 16, column_shards=4)
        (408024, 408024)
    """
    checks.one_of("sharding", sharding, SHARDINGS)
    checks.one_of("exchange", exchange, EXCHANGES)
    if column_shards is not None and sharding != "row_column":
        raise ValueError(f"column_shards={column_shards} is for sharding='row_column', not sharding={sharding!r}")
    others = (num_replicas - 1) * keys_per_replica
    if num_replicas == 1:
        return 0
    if sharding == "replicated":
        return others * (dim * 4 + 8)  # the all-reduce of IndexedSlices gathers rows and ids
    total = (num_replicas - 1) * 8 + others * 8 + others * dim * 4  # counts, keys, gradients backward
    if sharding == "table":
        total += others * 8  # slot ids
    if sharding in ("column", "row_column"):  # no positions: every replica knows every key's owners
        c = num_replicas if sharding == "column" else grid_shape(num_replicas, dim, column_shards)[1]
        if exchange == "all_gather":  # each replica sends the C*K keys of its row group, ceil(d/C) columns each
            return total + others * c * math.ceil(dim / c) * 4
        return total + 2 * others * dim * 4  # ring all-reduce of [N*K, dim] holding each replica's part
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
