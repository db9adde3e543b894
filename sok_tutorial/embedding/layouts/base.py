"""`Layout`: what every layout answers (`sok_tutorial.embedding.layouts`)."""
from __future__ import annotations

from typing import Any

import numpy as np

ID_BYTES = 8  # int64 keys, positions and slot ids
FLOAT_BYTES = 4  # float32 vectors and gradients


class Layout:
    """A table over `num_replicas` replicas. Subclasses say where rows and columns live; the bytes
    a lookup moves are counted from the shapes of the collectives the tables issue (ring
    algorithms: a replica receives what the N - 1 others send).

    A sharded layout routes keys (`sok_tutorial.embedding.routing`): the replicas form `rows` row
    groups of `columns` replicas each; every key belongs to one row group (`group_of`), and each
    replica of that group holds its row, one slice of the width (`widths`) per replica.
    """

    name = ""
    rows = 1  # row groups: sets of replicas holding different keys
    columns = 1  # column groups: the replicas of a row group, each holding a slice of the width
    needs_slots = False  # whether a key's row group follows from its layer slot (passed with the keys)

    def __init__(self, num_replicas: int):
        self.num_replicas = int(num_replicas)

    # ------------------------------------------------------------------ memory
    def rows_per_replica(self, rows: int) -> int:
        """Rows one replica stores of a table of `rows` rows."""
        return rows

    def width(self, dim: int) -> int:
        """Columns one replica stores of a table `dim` wide (the widest slice)."""
        return max(self.widths(dim))

    def widths(self, dim: int) -> list[int]:
        """The width of each column group's slice."""
        return [dim]

    def always_indexed(self) -> bool:
        """Whether rows are placed by a key index even for row-id keys (table-wise)."""
        return False

    def touched_rows(self, keys_per_replica: int) -> int:
        """Rows one replica reads and updates a step, at most (before capping at its rows)."""
        return self.num_replicas * keys_per_replica

    def refuses(self, rows: int, dim: int, splits_by_column: bool = True) -> str | None:
        """Why a table of `rows` x `dim` cannot take this layout (None: it can); `splits_by_column`:
        whether its optimizer's state may be split by columns."""
        return None

    def overfills(self, capacity: int) -> str | None:
        """Why a table of `capacity` rows per replica cannot hold this layout's rows (None: it can)."""
        return None

    # ------------------------------------------------------------------ keys
    @property
    def bucket_shards(self) -> int:
        """Row groups that share one bucketed index (a table with an eviction policy): a key's bucket
        then picks its row group, so N groups keep the keys one table would."""
        return self.rows

    def group_of(self, keys: Any, slots: Any = None, buckets: Any = None) -> Any:
        """The row group holding each int64 key (a tensor; `slots`: each key's layer slot; `buckets`:
        the bucketed index of a table with an eviction policy)."""
        raise NotImplementedError(f"{type(self).__name__} does not route keys")

    def group_of_np(self, keys: np.ndarray, slots: np.ndarray | None = None, buckets: Any = None) -> np.ndarray:
        """NumPy twin of `group_of`."""
        raise NotImplementedError(f"{type(self).__name__} does not route keys")

    # ------------------------------------------------------------------ exchange
    def exchange_bytes(self, keys_per_replica: int, dim: int, exchange: str = "all_gather") -> int:
        """Bytes one replica receives per training step for the lookup and the gradient."""
        if self.num_replicas == 1:
            return 0
        others = (self.num_replicas - 1) * keys_per_replica
        # counts (a ring all-reduce of one per replica: twice what a gather of them moves), keys,
        # gradients backward: every sharded layout exchanges these
        total = 2 * (self.num_replicas - 1) * ID_BYTES + others * ID_BYTES + others * dim * FLOAT_BYTES
        return total + self._forward_bytes(others, dim, exchange)

    def _forward_bytes(self, others: int, dim: int, exchange: str) -> int:
        """The vectors forward: each replica sends its slice of its row group's keys, in batch order,
        so every replica knows where each vector goes and no positions travel (``columns`` of them
        per key, each the widest slice); or a ring all_reduce of ``[N*K, dim]``."""
        if exchange == "all_gather":
            return others * self.columns * self.width(dim) * FLOAT_BYTES
        return 2 * others * dim * FLOAT_BYTES

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_replicas})"
