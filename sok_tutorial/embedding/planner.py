"""`plan`: a placement for every embedding table that fits a per-replica memory budget at the
lowest estimated step cost, from a written cost model (TorchRec's ``EmbeddingShardingPlanner``,
for this library's layers).

A table is described by a `TableSpec` (rows, width, ids a sample looks up, optimizer, dynamic or
not). For each table the planner prices every placement it may take:

* ``sharding``: ``"replicated"`` (a copy per replica), ``"row"`` (key ``k`` on replica
  ``k mod N``), ``"table"`` (the layer's slots placed whole, `plan_table_wise`), ``"column"``
  (every row on every replica, ``ceil(dim / N)`` of the width, `column_slices`), ``"row_column"``
  (a grid of R x C, `grid_shape`'s default: ``ceil(rows / R)`` rows of ``ceil(dim / C)``; priced
  where it is neither of the last two, ``1 < C < N``);
* ``storage_dtype``: ``"float32"`` and, when allowed, ``"bfloat16"`` / ``"float16"``
  (`sok_tutorial.embedding.precision`; optimizer slots stay float32).

The cost model, per replica and training step, with N replicas and K = ids per replica per step
(global batch / N x ids per sample):

* **bytes held**: exactly the variables the layer creates (`replica_bytes` measures the same):
  rows x width x the storage type, the optimizer's slots (Adam 2 floats per element, Adagrad and
  FTRL 1 or 2, row-wise Adagrad 1 per row), and for an indexed table its key index
  (`index.index_bytes`: two int64s a slot, one a row; plus a slot id per row table-wise); a table that
  forgets (`TableSpec.lifecycle`) adds its lifecycle state, whose bucketed index replaces that
  key index (`sok_tutorial.embedding.lifecycle.Lifecycle.state_bytes`);
* **bytes exchanged**: `placement.exchange_bytes`, counted from the collectives the layers issue;
* **bytes touched**: the rows a replica gathers and updates (read and write of the row and its
  slots): K rows for row- and table-wise shards, N x K for a replicated table (it applies the
  all-reduced gradient of the whole batch) and for column slices, C x K for a grid's slices
  (its row group's keys), at most the rows it holds;
* **step cost** = exchanged / ``link_gbps`` + touched / ``memory_gbps``.

Placement: every table starts from its placements in order of preference (float32 before a
16-bit type, then lowest cost); the largest tables are placed first, each taking the first
placement that leaves room for the others' smallest. If even the smallest placements of all
tables exceed the budget, `PlanError` says by how much, table by table.

Example:
    >>> tables = [TableSpec("items", rows=2_000_000, dim=64), TableSpec("users", rows=100_000, dim=64),
    ...           TableSpec("genres", rows=20, dim=16, ids_per_sample=3)]
    >>> p = plan(tables, num_replicas=4, memory_per_replica=512 << 20, global_batch=8192)
    >>> [(t.name, t.sharding, t.storage_dtype) for t in p]
    [('items', 'row', 'float32'), ('users', 'row', 'float32'), ('genres', 'replicated', 'float32')]
    >>> print(str(p).splitlines()[2])
    items            row        float32        500,000       366.21     3120.0    0.159
    >>> p["items"].layer_kwargs()
    {'max_vocabulary_size_per_gpu': 500000, 'sharding': 'row', 'storage_dtype': 'float32'}
    >>> plan(tables, 4, 512 << 20, global_batch=8192, shardings=("replicated", "column"))["items"].rows_per_replica
    2000000
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernels import checks
from sok_tutorial.embedding import lifecycle
from sok_tutorial.embedding.index import index_bytes
from sok_tutorial.embedding.layouts import SHARDINGS, layout_of

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def slot_layout(optimizer: str) -> Any:
    """The `SlotLayout` the optimizer named `optimizer` declares (with its defaults)."""
    from sok_tutorial.embedding.optimizers import slot_layout as declared  # (the optimizers import the tables)

    return declared(optimizer)


def slot_floats(optimizer: str) -> tuple[int, int]:
    """(slot values per element of a row, per row) of the optimizer named `optimizer` with its
    defaults, as it declares them (`sok_tutorial.embedding.optimizers.slot_layout`)."""
    layout = slot_layout(optimizer)
    return layout.per_element, layout.per_row


class PlanError(ValueError):
    """No placement of the tables fits the memory budget; the message says by how much, per table."""


@dataclass(frozen=True)
class TableSpec:
    """One embedding layer's table, as the planner sees it.

    Args:
        name: the layer's name.
        rows: rows of the whole table (its vocabulary).
        dim: vector width.
        ids_per_sample: ids a sample looks up in it (slots x ids per slot).
        optimizer: ``"sgd"``, ``"adam"``, ``"lazyadam"``, ``"adagrad"``, ``"rowwise_adagrad"``, ``"ftrl"``.
        dynamic: keys are any int64 (a key index per replica) rather than row ids.
        slot_sizes: rows of each slot, for table-wise placement (one slot of `rows` if None).
        lifecycle: the table's eviction, admission and tracking options, as the layer takes them
            (``{"eviction_policy": "lru"}``, ``{"min_count": 2}``...; `sok_tutorial.embedding.lifecycle`):
            priced with their state (a table with a policy has the bucketed index instead of the
            open-addressing one, and its capacity is whole buckets), and passed on by `layer_kwargs`.
    """

    name: str
    rows: int
    dim: int
    ids_per_sample: float = 1.0
    optimizer: str = "adam"
    dynamic: bool = False
    slot_sizes: tuple[int, ...] | None = None
    lifecycle: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        checks.positive_int(f"{self.name}: rows", self.rows)
        checks.positive_int(f"{self.name}: dim", self.dim)
        from sok_tutorial.embedding.optimizers import LAYOUTS

        checks.one_of(f"{self.name}: optimizer", self.optimizer, tuple(LAYOUTS))
        if not self.ids_per_sample > 0:
            raise ValueError(f"{self.name}: ids_per_sample={self.ids_per_sample!r}, expected a number > 0")
        if self.slot_sizes is not None:
            sizes = list(self.slot_sizes)
            if not sizes or any(isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 1 for r in sizes) \
                    or sum(sizes) != self.rows:
                raise ValueError(f"{self.name}: slot_sizes={self.slot_sizes!r} is invalid: expected positive row "
                                 f"counts adding up to rows={self.rows}")
        if self.lifecycle is not None:
            if not isinstance(self.lifecycle, Mapping) or set(self.lifecycle) - set(lifecycle.OPTIONS):
                raise ValueError(f"{self.name}: lifecycle={self.lifecycle!r} is invalid: expected a dict of the "
                                 f"table's options ({', '.join(lifecycle.OPTIONS)})")
            self.life(self.rows)  # the options' own checks, before any plan is made

    def life(self, capacity: int) -> lifecycle.Lifecycle | None:
        """The lifecycle of one replica's table of `capacity` rows (None without `lifecycle`)."""
        if not self.lifecycle:
            return None
        return lifecycle.Lifecycle.create(self.name, capacity, self.dynamic, **self.lifecycle)


@dataclass
class Placement:
    """Where one table goes, and what the cost model says it costs on each replica."""

    name: str
    sharding: str
    storage_dtype: str
    rows_per_replica: int  # the layer's max_vocabulary_size_per_gpu
    width_per_replica: int
    bytes_per_replica: int
    exchange_bytes: int  # received per replica and step
    touched_bytes: int  # read and written per replica and step
    seconds: float = field(default=0.0)  # estimated step cost
    column_shards: int | None = None  # the grid's column groups, for sharding="row_column"
    lifecycle: Mapping[str, Any] = field(default_factory=dict)  # the table's lifecycle options (`TableSpec`)

    def layer_kwargs(self) -> dict[str, Any]:
        """Arguments for the table's layer (`DistributedEmbedding` and the other SOK layers)."""
        grid = {"column_shards": self.column_shards} if self.sharding == "row_column" else {}
        return {"max_vocabulary_size_per_gpu": self.rows_per_replica, "sharding": self.sharding,
                "storage_dtype": self.storage_dtype, **grid, **self.lifecycle}


class Plan:
    """The placements of `plan`, by table name; ``str(plan)`` is the dry run's table."""

    def __init__(self, placements: list[Placement], num_replicas: int, budget: int):
        self.placements, self.num_replicas, self.budget = placements, num_replicas, budget

    def __iter__(self) -> Iterator[Placement]:
        return iter(self.placements)

    def __getitem__(self, name: str) -> Placement:
        for p in self.placements:
            if p.name == name:
                return p
        raise KeyError(f"no table named {name!r} in the plan: {[p.name for p in self.placements]}")

    @property
    def bytes_per_replica(self) -> int:
        return sum(p.bytes_per_replica for p in self.placements)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.placements)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per table (for a DataFrame or a report)."""
        return [{"table": p.name, "placement": p.sharding, "dtype": p.storage_dtype,
                 "rows/replica": p.rows_per_replica, "width/replica": p.width_per_replica,
                 "MiB/replica": p.bytes_per_replica / 2**20, "exchanged KiB/step": p.exchange_bytes / 2**10,
                 "est. ms/step": 1e3 * p.seconds} for p in self.placements]

    def __str__(self) -> str:
        head = f"{'table':16s} {'placement':10s} {'dtype':8s} {'rows/replica':>13s} {'MiB/replica':>12s} " \
               f"{'KiB/step':>10s} {'ms/step':>8s}"
        lines = [head, "-" * len(head)]
        for r in self.rows():
            lines.append(f"{r['table'][:16]:16s} {r['placement']:10s} {r['dtype']:8s} {r['rows/replica']:>13,} "
                         f"{r['MiB/replica']:>12.2f} {r['exchanged KiB/step']:>10.1f} {r['est. ms/step']:>8.3f}")
        lines.append(f"{'total':16s} {'':10s} {'':8s} {'':>13s} {self.bytes_per_replica / 2**20:>12.2f} "
                     f"{sum(p.exchange_bytes for p in self) / 2**10:>10.1f} {1e3 * self.seconds:>8.3f}"
                     f"   (budget {self.budget / 2**20:,.2f} MiB per replica, {self.num_replicas} replicas)")
        return "\n".join(lines)


def table_bytes(rows: int, width: int, dtype: str, optimizer: str, *, indexed: bool, table_wise: bool = False,
                life: lifecycle.Lifecycle | None = None) -> int:
    """Bytes of the variables a table of `rows` x `width` creates on one replica (with its slots and,
    with `life`, its lifecycle state; a table with a policy keeps its keys in that state's bucketed
    index, not in the open-addressing one)."""
    per_element, per_row = slot_floats(optimizer)
    out = rows * width * (DTYPE_BYTES[dtype] + 4 * per_element) + rows * 4 * per_row
    if life is not None:
        out += life.state_bytes(rows)
    if indexed and not (life is not None and life.evicts):  # slots (key, row), row_keys, size
        out += index_bytes(rows) + 8
    if table_wise:  # row_slots
        out += rows * 8
    return out


def price(spec: TableSpec, sharding: str, dtype: str, num_replicas: int, global_batch: int, *,
          link_gbps: float = 25.0, memory_gbps: float = 100.0, column_shards: int | None = None) -> Placement:
    """The cost model's figures for one table in one placement (`column_shards`: the grid of
    ``"row_column"``, `grid_shape`'s default if None)."""
    n = num_replicas
    keys = max(1, round(global_batch / n * spec.ids_per_sample))
    per_element, per_row = slot_floats(spec.optimizer)
    if n == 1:
        sharding = "replicated"
    layout = layout_of(sharding, n, dim=spec.dim, column_shards=column_shards if sharding == "row_column" else None,
                       slot_sizes=spec.slot_sizes)
    rows, width, touched_rows = layout.rows_per_replica(spec.rows), layout.width(spec.dim), layout.touched_rows(keys)
    life = spec.life(rows)
    if life is not None:  # whole buckets, with a policy: the layer is given those
        rows = life.rows(rows)
        life = spec.life(rows)
    indexed, table_wise = spec.dynamic or layout.always_indexed(), layout.always_indexed()
    grid = layout.columns if sharding == "row_column" else None
    touched_rows = min(touched_rows, rows)  # a step updates each distinct row once
    held = table_bytes(rows, width, dtype, spec.optimizer, indexed=indexed, table_wise=table_wise, life=life)
    moved = layout.exchange_bytes(keys, spec.dim)
    touched = touched_rows * 2 * (width * (DTYPE_BYTES[dtype] + 4 * per_element) + 4 * per_row)
    seconds = moved / (link_gbps * 1e9) + touched / (memory_gbps * 1e9)
    return Placement(spec.name, sharding, dtype, rows, width, held, moved, touched, seconds, grid,
                     dict(spec.lifecycle or {}))


def plan(tables: Sequence[TableSpec], num_replicas: int, memory_per_replica: int, *, global_batch: int,
         shardings: Sequence[str] | None = None, dtypes: Sequence[str] = ("float32",), link_gbps: float = 25.0,
         memory_gbps: float = 100.0) -> Plan:
    """Place every table so that each replica holds at most `memory_per_replica` bytes of tables
    and optimizer state, at the lowest estimated step cost (module docstring).

    Args:
        tables: `TableSpec` per embedding layer (names must differ).
        num_replicas: replicas of the strategy the layers will be built under.
        memory_per_replica: bytes each replica may give to embedding tables.
        global_batch: samples per step over all replicas.
        shardings: placements allowed (default: every one the layers offer, `SHARDINGS`).
        dtypes: storage types allowed, in order of preference (``("float32", "bfloat16")`` lets
            the planner halve a table that would not fit otherwise).
        link_gbps, memory_gbps: bandwidths of the cost model, GB/s.
    """
    n = checks.positive_int("num_replicas", num_replicas)
    budget = checks.positive_int("memory_per_replica", memory_per_replica)
    checks.positive_int("global_batch", global_batch)
    for arg, value in (("shardings", shardings), ("dtypes", dtypes)):
        if isinstance(value, str):
            raise ValueError(f"{arg}={value!r} is invalid: expected a list of names, e.g. [{value!r}]")
    allowed = list(SHARDINGS if shardings is None else shardings)
    for arg, names, known in (("shardings", allowed, SHARDINGS), ("dtypes", list(dtypes), tuple(DTYPE_BYTES))):
        if not names:
            raise ValueError(f"{arg}={names!r} is invalid: expected at least one of {', '.join(known)}")
        for name in names:
            checks.one_of(arg, name, known)
    for arg, value in (("link_gbps", link_gbps), ("memory_gbps", memory_gbps)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{arg}={value!r} is invalid: expected a positive, finite bandwidth in GB/s")
    names = [t.name for t in tables]
    if not tables or len(set(names)) != len(names):
        raise ValueError(f"tables: expected at least one table, with distinct names; got {names}")
    options = {}
    for spec in tables:
        found = []
        for sharding in allowed:
            layout = layout_of(sharding, n, dim=spec.dim, slot_sizes=spec.slot_sizes)
            if layout.refuses(spec.rows, spec.dim, slot_layout(spec.optimizer).splits_by_column):
                continue  # an empty slice or row group, or optimizer state a column split would break
            if sharding == "row_column" and not 1 < layout.columns < n:
                continue  # C = 1 or N is "row" or "column"

            for rank, dtype in enumerate(dtypes):
                p = price(spec, sharding, dtype, n, global_batch, link_gbps=link_gbps, memory_gbps=memory_gbps)
                found.append((rank, p.seconds, p.bytes_per_replica, p))
        options[spec.name] = [p for *_, p in sorted(found, key=lambda f: f[:3])]
    smallest = {name: min(opts, key=lambda p: p.bytes_per_replica) for name, opts in options.items()}
    need = sum(p.bytes_per_replica for p in smallest.values())
    if need > budget:
        worst = sorted(smallest.values(), key=lambda p: -p.bytes_per_replica)
        raise PlanError(
            f"memory_per_replica={budget:,} bytes ({budget / 2**20:,.1f} MiB) is too small for these tables on {n} "
            f"replica(s): their smallest placements need {need:,} bytes, {need - budget:,} more. Per table, at "
            "best: " + "; ".join(f"{p.name} {p.bytes_per_replica:,} bytes ({p.sharding}, {p.storage_dtype})"
                                 for p in worst)
            + ". Allow more replicas, a 16-bit dtype (dtypes=...) or other shardings, or shrink the tables.")
    chosen, used = {}, 0
    order = sorted(tables, key=lambda t: -smallest[t.name].bytes_per_replica)
    for i, spec in enumerate(order):
        rest = sum(smallest[t.name].bytes_per_replica for t in order[i + 1:])
        pick = next(p for p in options[spec.name] if used + p.bytes_per_replica + rest <= budget)
        chosen[spec.name], used = pick, used + pick.bytes_per_replica
    return Plan([chosen[t.name] for t in tables], n, budget)
