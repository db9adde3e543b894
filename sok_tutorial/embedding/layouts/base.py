"""`Layout`: what every layout answers (`sok_tutorial.embedding.layouts`)."""
from __future__ import annotations

import math

ID_BYTES = 8  # int64 keys, positions and slot ids
FLOAT_BYTES = 4  # float32 vectors and gradients


class Layout:
    """A table over `num_replicas` replicas. Subclasses say where rows and columns live; the bytes
    a lookup moves are counted from the shapes of the collectives the layers issue (ring
    algorithms: a replica receives what the N - 1 others send)."""

    name = ""

    def __init__(self, num_replicas: int):
        self.num_replicas = int(num_replicas)

    # ------------------------------------------------------------------ memory
    def rows_per_replica(self, rows: int) -> int:
        """Rows one replica stores of a table of `rows` rows."""
        return rows

    def width(self, dim: int) -> int:
        """Columns one replica stores of a table `dim` wide (the widest slice)."""
        return dim

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

    # ------------------------------------------------------------------ exchange
    def exchange_bytes(self, keys_per_replica: int, dim: int, exchange: str = "all_gather") -> int:
        """Bytes one replica receives per training step for the lookup and the gradient."""
        if self.num_replicas == 1:
            return 0
        others = (self.num_replicas - 1) * keys_per_replica
        # counts, keys, gradients backward: every sharded layout gathers these
        total = (self.num_replicas - 1) * ID_BYTES + others * ID_BYTES + others * dim * FLOAT_BYTES
        return total + self._forward_bytes(others, dim, exchange)

    def _forward_bytes(self, others: int, dim: int, exchange: str) -> int:
        """The vectors forward (and what else this layout sends): all_gather of the owned vectors
        with their positions, or a ring all_reduce of ``[N*K, dim]``."""
        if exchange == "all_gather":
            return others * ID_BYTES + others * dim * FLOAT_BYTES
        return 2 * others * dim * FLOAT_BYTES

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_replicas})"


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)
