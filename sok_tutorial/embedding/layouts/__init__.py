"""How a table is laid out over N replicas, as objects: which replica holds which keys and
columns, how many rows and columns one replica stores, and how many bytes a lookup moves.

Three layouts cover the five ``sharding=`` names the layers take:

    Replicated(N)        "replicated"   every replica holds the whole table
    TableWise(N, sizes)  "table"        each slot's table whole on one replica, balanced by size
    Grid(N, R, C)        "row"          Grid(N, N, 1): key ``k`` (or its bucket) on replica k mod N
                         "column"       Grid(N, 1, N): every row, a slice of the width per replica
                         "row_column"   R row groups x C column groups, R * C = N

`layout_of` maps a name to its layout. The planner (`sok_tutorial.embedding.planner`) prices
a placement from these objects, `sok_tutorial.embedding.placement.exchange_bytes` is theirs,
and `sok_tutorial.embedding.sharding.ShardedTable` composes one: its row groups, column slices
and each key's group (`Layout.group_of`) are all the table's lookup, export and restore need
(`sok_tutorial.embedding.routing`). A new layout is one new module here, whose ``SHARDINGS``
names it: the package finds it (`LAYOUTS`).

Example:
    >>> grid = layout_of("row_column", 4, dim=16)
    >>> (grid.rows, grid.columns), grid.rows_per_replica(1000), grid.width(16)
    ((2, 2), 500, 8)
    >>> [layout_of(name, 2, dim=16).exchange_bytes(1000, 16) for name in ("row", "replicated")]
    [136016, 72000]
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from typing import Any

from kernels import checks
from sok_tutorial.embedding.layouts.base import Layout
from sok_tutorial.embedding.layouts.grid import Grid, column_slices, grid_shape
from sok_tutorial.embedding.layouts.replicated import Replicated
from sok_tutorial.embedding.layouts.table_wise import TableWise, plan_table_wise


def _discover() -> dict[str, Any]:
    """The ``sharding=`` names of this package's modules (each module's ``SHARDINGS``: name -> the
    layout of ``(num_replicas, dim, column_shards, slot_sizes)``), the whole-table copy first."""
    found: dict[str, Any] = {}
    for info in pkgutil.iter_modules(__path__):
        found.update(getattr(importlib.import_module(f"{__name__}.{info.name}"), "SHARDINGS", {}))
    return dict(sorted(found.items(), key=lambda item: item[0] != "replicated"))


LAYOUTS: dict[str, Any] = _discover()
SHARDINGS = tuple(LAYOUTS)


def layout_of(sharding: str, num_replicas: int, *, dim: int = 1, column_shards: int | None = None,
              slot_sizes: Sequence[int] | None = None) -> Layout:
    """The layout a table of width `dim` takes with ``sharding=`` over `num_replicas` replicas
    (`column_shards`: the grid of ``"row_column"``; `slot_sizes`: the slots of a table-wise layer)."""
    checks.one_of("sharding", sharding, tuple(LAYOUTS))
    n = checks.positive_int("num_replicas", num_replicas)
    if column_shards is not None and sharding != "row_column":
        raise ValueError(f"column_shards={column_shards} is for sharding='row_column', not sharding={sharding!r}")
    return LAYOUTS[sharding](n, dim, column_shards, slot_sizes)


__all__ = ["LAYOUTS", "SHARDINGS", "Grid", "Layout", "Replicated", "TableWise", "column_slices", "grid_shape",
           "layout_of", "plan_table_wise"]
