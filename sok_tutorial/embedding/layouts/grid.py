"""`Grid`: rows split over R row groups, columns over C column groups, ``R * C = N`` replicas.

Row-wise is ``Grid(N, N, 1)`` (key ``k``, or with an eviction policy its bucket, on replica
``k mod N``; SOK's "distributed"), column-wise ``Grid(N, 1, N)`` (every row, a slice of the width
on each replica; TorchRec's CW) and ``"row_column"`` any grid between (TorchRec's RW x CW;
`grid_shape`). Replica ``r`` is in row group ``i = r // C`` and column group ``j = r % C``: it
holds the keys ``k`` with ``k mod R == i`` (a static table: row ``k // R``) and of them the
columns ``column_slices(dim, C)[j]``, padded to the widest slice (the padding is never read out
and gets no gradient). 4 replicas as 2 x 2, a table of width 6::

    replica    0          1          2          3
    keys       k mod 2=0  k mod 2=0  k mod 2=1  k mod 2=1
    columns    0 1 2      3 4 5      0 1 2      3 4 5

The C replicas of a row group insert the same keys in the same order, so their key indexes are
equal (column-wise, every replica keeps the whole index, as one device would); the R groups'
indexes are disjoint. Optimizer slots follow the slice, as each optimizer's `SlotLayout`
declares; a per-row slot that mixes columns (`RowWiseAdagrad`'s accumulator) is refused when
``C > 1`` (each replica would keep its own, so training would not match one device).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from kernels import checks
from sok_tutorial.embedding.layouts.base import Layout


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


class Grid(Layout):
    """`num_replicas` replicas as `rows` row groups x `columns` column groups (module docstring);
    `name`: the ``sharding=`` it stands for."""

    def __init__(self, num_replicas: int, rows: int, columns: int, *, name: str = "row_column"):
        super().__init__(num_replicas)
        if rows * columns != num_replicas:
            raise ValueError(f"a grid of {rows} x {columns} is not num_replicas={num_replicas}")
        self.rows, self.columns, self.name = int(rows), int(columns), name

    def rows_per_replica(self, rows: int) -> int:
        return math.ceil(rows / self.rows)

    def widths(self, dim: int) -> list[int]:
        return column_slices(dim, self.columns)

    def touched_rows(self, keys_per_replica: int) -> int:
        return self.columns * keys_per_replica  # each replica of a row group updates its keys' rows

    def refuses(self, rows: int, dim: int, splits_by_column: bool = True) -> str | None:
        if dim < self.columns:
            return f"dim={dim} is narrower than {self.columns} column groups"
        if rows < self.rows:
            return f"{rows} rows are fewer than {self.rows} row groups"
        if self.columns > 1 and not splits_by_column:
            return "its optimizer keeps state per row that mixes the columns"
        return None

    def group_of(self, keys: Any, slots: Any = None, buckets: Any = None) -> Any:
        """``key mod R``, or with a bucketed index spread over the row groups (a table with an
        eviction policy) the group of the key's bucket (`BucketedIndex.owner_of`)."""
        import tensorflow as tf

        return buckets.owner_of(keys) if buckets is not None else tf.math.floormod(keys, self.rows)

    def group_of_np(self, keys: np.ndarray, slots: np.ndarray | None = None, buckets: Any = None) -> np.ndarray:
        return buckets.owner_of_np(keys) if buckets is not None else np.mod(keys, self.rows)

    def __repr__(self) -> str:
        return f"Grid({self.num_replicas}, {self.rows}, {self.columns})"


SHARDINGS = {  # the sharding= names that are grids
    "row": lambda n, dim, column_shards, slot_sizes: Grid(n, n, 1, name="row"),
    "column": lambda n, dim, column_shards, slot_sizes: Grid(n, 1, n, name="column"),
    "row_column": lambda n, dim, column_shards, slot_sizes: Grid(n, *grid_shape(n, dim, column_shards),
                                                                  name="row_column"),
}
