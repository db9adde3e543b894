"""Tables that forget: eviction, admission and change tracking for a dynamic `EmbeddingTable`.

A table built with an eviction policy never runs out of rows. Its key index is bucketed
(`sok_tutorial.embedding.buckets`): a key lives in one bucket of ``bucket_capacity`` rows, and a
new key takes the row of its bucket that matters least, evicting the key there, inside the same
training step and with work in proportion to the step's keys:

* `"lru"`: the row seen longest ago goes first (the table's clock counts its training lookups).
* `"lfu"`: the row seen least often goes first; counts halve every ``lfu_halflife`` steps
  (computed when read, so nothing sweeps the table), so what was popular long ago fades.
* `"ttl"`: a key not seen for ``ttl`` steps (or ``ttl_seconds``) has expired: lookups and
  exports skip it, and its row is the first its bucket gives away; otherwise as `"lru"`.

Rows a step is using are never evicted in that step; a new key whose whole bucket is in use
embeds to zeros for that step (counted: `EmbeddingTable.unplaced`). A row given to a new key
starts from the key's initial vector, and its optimizer slots afresh at their next update
(`EmbeddingTable.fresh_rows`). The capacity is rounded up to whole buckets (at least one).

Admission (``min_count``, ``admit_probability``): a new key gets a row only once it has been seen
`min_count` times, counted in a count-min sketch of ``sketch_depth x sketch_width`` int32
counters (bounded; it never holds keys; halved every ten counts per row of capacity); until then
it embeds to zeros, gets no row, and no optimizer state. ``admit_probability`` admits each new
key in a step with that probability (decided by a hash of the key and the step, so runs repeat).

Change tracking (on whenever a policy is set, or with ``track_changes=True``): each row keeps
the clock of its last training lookup, and evicted keys go to a ring buffer (``eviction_log``
entries) with the clock of their eviction: `changed_since` and `evicted_since` are what a delta
export (`sok_tutorial.training.delta`) writes. Tables without a policy keep the open-addressing
index of `sok_tutorial.embedding.index` and never drop a key.

Example:
    >>> import tensorflow as tf
    >>> from sok_tutorial.embedding import EmbeddingTable
    >>> table = EmbeddingTable(4, 2, eviction_policy="lru", bucket_capacity=4)  # one bucket
    >>> for batch in ([1, 2], [3, 4], [1, 5]):   # key 5 finds the table full: 2 (oldest) goes
    ...     _ = table(tf.constant(batch, tf.int64), training=True)
    >>> sorted(table.export()["keys"].tolist()), table.size
    ([1, 3, 4, 5], 4)
    >>> evicted_since(table, 0).tolist()
    [2]
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from kernels import checks
from sok_tutorial.embedding.buckets import BucketedIndex
from sok_tutorial.embedding.lifecycle_ops import SALTS

POLICIES = ("lru", "lfu", "ttl")
OPTIONS = ("eviction_policy", "ttl", "ttl_seconds", "lfu_halflife", "bucket_capacity", "min_count",
           "admit_probability", "sketch_depth", "sketch_width", "track_changes", "eviction_log")  # EmbeddingTable's
REMOVED = {"evict_fraction": "a table with an eviction_policy evicts inside each insert, one row per new key",
           "lfu_decay": "LFU counts halve every lfu_halflife steps"}


_CLOCK_LIMIT = 2**62  # a ttl, in the clock's units, leaves room to add it to any clock reading in int64
_STEP_LIMIT = 2**31 - 2  # step marks of a table with a policy are int32


@dataclass(frozen=True)
class Lifecycle:
    """A table's validated eviction, admission and tracking options (see the module docstring)."""

    eviction_policy: str | None
    ttl: int | None
    ttl_seconds: float | None
    lfu_halflife: int
    bucket_capacity: int
    min_count: int
    admit_probability: float
    sketch_depth: int
    sketch_width: int
    track_changes: bool
    eviction_log: int

    @classmethod
    def create(cls, name: str, capacity: int, dynamic: bool, *, eviction_policy: str | None = None,
               ttl: int | None = None, ttl_seconds: float | None = None, lfu_halflife: int = 1000,
               bucket_capacity: int = 8, min_count: int = 1, admit_probability: float = 1.0,
               sketch_depth: int = 4, sketch_width: int | None = None, track_changes: bool = False,
               eviction_log: int | None = None) -> Lifecycle:
        if eviction_policy is not None:
            checks.one_of("eviction_policy", eviction_policy, POLICIES)
        if (ttl is not None or ttl_seconds is not None) and eviction_policy != "ttl":
            raise ValueError(f"{name}: ttl={ttl}, ttl_seconds={ttl_seconds} need eviction_policy='ttl', got "
                             f"{eviction_policy!r}")
        if eviction_policy == "ttl" and (ttl is None) == (ttl_seconds is None):
            raise ValueError(f"{name}: eviction_policy='ttl' needs exactly one of ttl (steps) or ttl_seconds, "
                             f"got ttl={ttl}, ttl_seconds={ttl_seconds}")
        if ttl is not None and checks.positive_int("ttl", ttl) >= _STEP_LIMIT:
            raise ValueError(f"ttl={ttl} is invalid: expected fewer than {_STEP_LIMIT} steps")
        if ttl_seconds is not None and (isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float))
                                        or not 1 <= ttl_seconds * 1000 < _CLOCK_LIMIT):
            raise ValueError(f"ttl_seconds={ttl_seconds!r} is invalid: expected a number of seconds from 0.001 "
                             f"(the table's clock counts milliseconds in int64) to less than {_CLOCK_LIMIT // 1000}")
        if not isinstance(track_changes, (bool, np.bool_)):
            raise ValueError(f"track_changes={track_changes!r} is invalid: expected True or False")
        if isinstance(admit_probability, bool) or not isinstance(admit_probability, (int, float)) \
                or not 0 < admit_probability <= 1:
            raise ValueError(f"admit_probability={admit_probability!r} is invalid: expected a number in (0, 1]")
        if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 1:
            raise ValueError(f"min_count={min_count!r} is invalid: expected an integer >= 1 (1: every key "
                             "gets a row at once)")
        width = checks.positive_int("bucket_capacity", bucket_capacity)
        if width & (width - 1):
            raise ValueError(f"bucket_capacity={bucket_capacity!r} is invalid: expected a power of two (8: one "
                             "64-byte cache line of int64 keys)")
        checks.positive_int("lfu_halflife", lfu_halflife)
        if eviction_policy is not None and capacity >= 2**31 - width:
            raise ValueError(f"{name}: capacity={capacity} is invalid with eviction_policy={eviction_policy!r}: "
                             "expected fewer than 2**31 rows per table (shard the table)")
        if eviction_policy is not None and capacity < width:
            raise ValueError(f"{name}: capacity={capacity} is invalid with eviction_policy={eviction_policy!r}: "
                             f"expected at least one bucket (bucket_capacity={width} rows)")
        admits = min_count > 1 or admit_probability < 1
        if not dynamic and (eviction_policy is not None or admits):
            raise ValueError(f"{name}: eviction_policy={eviction_policy!r}, min_count={min_count}, "
                             f"admit_probability={admit_probability} need a dynamic table (use_hashtable=True); "
                             "a table of row ids has a row for every key")
        checks.positive_int("sketch_depth", sketch_depth)
        if sketch_depth > len(SALTS):
            raise ValueError(f"sketch_depth={sketch_depth} is invalid: expected at most {len(SALTS)}")
        width_sketch = 1 << max(4, int(np.ceil(np.log2(checks.positive_int("sketch_width", sketch_width)
                                                        if sketch_width is not None else capacity))))
        log = capacity if eviction_log is None else checks.positive_int("eviction_log", eviction_log)
        return cls(eviction_policy, ttl, None if ttl_seconds is None else float(ttl_seconds), int(lfu_halflife),
                   width, int(min_count), float(admit_probability), int(sketch_depth), width_sketch,
                   bool(track_changes) or eviction_policy is not None, log)

    def bucketed_index(self, capacity: int) -> BucketedIndex | None:
        """The bucketed index (its variables not made yet) of a table of `capacity` rows with a
        policy; None without one."""
        if not self.evicts:
            return None
        return BucketedIndex(capacity, self.bucket_capacity, self.eviction_policy,
                             ttl=self.ttl_units if self.eviction_policy == "ttl" else None,
                             halflife=self.lfu_halflife, mark_dtype="int64" if self.wall_clock else "int32")

    def rows(self, capacity: int) -> int:
        """The capacity a table of `capacity` rows really has: whole buckets, with a policy."""
        if not self.evicts:
            return capacity
        return -(-capacity // self.bucket_capacity) * self.bucket_capacity

    @property
    def active(self) -> bool:
        """Whether the table has lifecycle state at all (else its lookups are exactly as before)."""
        return self.evicts or self.admits or self.track_changes

    @property
    def evicts(self) -> bool:
        return self.eviction_policy is not None

    @property
    def admits(self) -> bool:
        return self.min_count > 1 or self.admit_probability < 1

    @property
    def counts(self) -> bool:
        """Whether lookups count each key's occurrences (LFU scores, admission)."""
        return self.eviction_policy == "lfu" or self.min_count > 1

    @property
    def wall_clock(self) -> bool:
        return self.ttl_seconds is not None

    @property
    def ttl_units(self) -> int:
        """The ttl in units of the table's clock (steps, or ms with ``ttl_seconds``)."""
        return int(self.ttl_seconds * 1000) if self.wall_clock else int(self.ttl)

    def config(self) -> dict[str, Any]:
        return {"eviction_policy": self.eviction_policy, "ttl": self.ttl, "ttl_seconds": self.ttl_seconds,
                "lfu_halflife": self.lfu_halflife, "bucket_capacity": self.bucket_capacity,
                "min_count": self.min_count, "admit_probability": self.admit_probability,
                "sketch_depth": self.sketch_depth, "sketch_width": self.sketch_width,
                "track_changes": self.track_changes, "eviction_log": self.eviction_log}


def refuse_removed(name: str, options: dict[str, Any]) -> None:
    """A clear error for the options batch eviction had (before the bucketed index)."""
    for option, why in REMOVED.items():
        if option in options:
            raise ValueError(f"{name}: {option}={options[option]!r} is no longer an option: {why}")


def build(table: Any) -> None:
    """Create the table's lifecycle variables (Keras weights, not trainable)."""
    life, capacity = table.lifecycle, table.capacity

    def weight(name: str, shape: tuple, dtype: str, value: Any = 0) -> Any:
        return table.add_weight(name=name, shape=shape, dtype=dtype, trainable=False,
                                initializer=keras.initializers.Constant(value))

    table._clock = weight("clock", (), "int64")
    if life.evicts:
        table.buckets.create(weight)
        table._row_fresh = weight("row_fresh", (capacity,), "bool", False)
        table._unplaced = weight("unplaced", (), "int64")
        table._log_keys = weight("log_keys", (life.eviction_log,), "int64")
        table._log_marks = weight("log_marks", (life.eviction_log,), "int64")
        table._log_total = weight("log_total", (), "int64")
        table._log_floor = weight("log_floor", (), "int64", -1)
    elif life.track_changes:
        table._row_seen = weight("row_seen", (capacity,), "int64", -1)
    if life.min_count > 1:
        table._sketch = weight("sketch", (life.sketch_depth * life.sketch_width,), "int32")
        table._sketch_added = weight("sketch_added", (), "int64")


# ---------------------------------------------------------------------- on the host
def live_rows(table: Any, component: int = 0) -> np.ndarray:
    """Rows holding a key (not expired), in row order."""
    if table.lifecycle.evicts:
        return table.buckets.live(expiry_clock(table))[0]
    return np.arange(int(table.index_variables(component).size.numpy()), dtype=np.int64)


def row_marks(table: Any, rows: np.ndarray) -> np.ndarray:
    """The clock of each row's last training lookup (or write)."""
    marks = table.buckets.marks if table.lifecycle.evicts else table._row_seen
    return marks.numpy()[rows].astype(np.int64)


def row_counts(table: Any, rows: np.ndarray) -> np.ndarray:
    """``"lfu"``: each row's count, as stored (decayed as of its last touch)."""
    return table.buckets.counts.numpy()[rows]


def expiry_clock(table: Any) -> int:
    """What ``"ttl"`` compares a row's mark with on the host: the table's clock, or for a wall clock
    the time now (a table that stopped training still sees its keys expire)."""
    clock = mark(table)
    return max(clock, int(time.time() * 1000)) if table.lifecycle.wall_clock else clock


def mark(table: Any) -> int:
    """The table's clock now: what `changed_since` and `evicted_since` compare with."""
    return int(table._clock.numpy()) if table.lifecycle.active else 0


def _tracked(table: Any) -> None:
    if not table.lifecycle.track_changes:
        raise ValueError(f"{table.name}: the table does not track changes; build it with track_changes=True "
                         "(or an eviction_policy) to export deltas")


def changed_since(table: Any, since: int) -> np.ndarray:
    """Rows whose vectors a training lookup (or `write`) touched after clock `since` (found from
    the rows' marks when asked: nothing is recorded per step)."""
    _tracked(table)
    if table.lifecycle.evicts:
        rows, _, marks = table.buckets.live(expiry_clock(table))
        return rows[marks > since]
    seen = table._row_seen.numpy()
    if table.indexed:
        seen = seen[:int(table._size.numpy())]
    return np.flatnonzero(seen > since).astype(np.int64)


def evicted_since(table: Any, since: int) -> np.ndarray:
    """Keys evicted after clock `since`, oldest first (a key may appear again if it came back),
    then, under ``"ttl"``, the keys that have expired since then and still sit in their rows."""
    _tracked(table)
    if not table.lifecycle.evicts:
        return np.zeros(0, np.int64)
    floor = int(table._log_floor.numpy())
    if since < floor:
        raise ValueError(f"{table.name}: the eviction log (eviction_log={table.lifecycle.eviction_log:,} entries) "
                         f"no longer holds evictions after mark {since} (it starts after {floor}); export the "
                         "table in full, or raise eviction_log")
    total, size = int(table._log_total.numpy()), table.lifecycle.eviction_log
    order = np.arange(max(0, total - size), total) % size
    keys, marks = table._log_keys.numpy()[order], table._log_marks.numpy()[order]
    return np.concatenate([keys[marks > since], table.buckets.expired(since, expiry_clock(table))])


_STATE = ("clock", "sketch", "sketch_added", "log_keys", "log_marks", "log_total", "log_floor")


def saved_state(table: Any) -> dict[str, np.ndarray]:
    """What a checkpoint keeps of the table's lifecycle beside its rows: the clock, the admission
    sketch and the eviction log (so that a restored trainer admits as it would have and can
    continue its chain of deltas). Empty for a table without lifecycle state."""
    if not table.lifecycle.active or table.num_shards > 1:
        return {}
    state = {name: np.asarray(getattr(table, f"_{name}").numpy()) for name in _STATE if hasattr(table, f"_{name}")}
    if "sketch" in state:  # saved as depth x width: a sketch of another shape is told apart on restore
        state["sketch"] = state["sketch"].reshape(table.lifecycle.sketch_depth, table.lifecycle.sketch_width)
    return state


def load_state(table: Any, state: dict[str, np.ndarray]) -> list[str]:
    """Put back what `saved_state` kept (after `reset`); returns what did not fit this table's options
    (another sketch size or eviction log length), which stays as `reset` left it."""
    skipped = []
    for name in _STATE:
        variable = getattr(table, f"_{name}", None)
        if name not in state or variable is None:
            continue
        value = state[name]
        shape = (table.lifecycle.sketch_depth, table.lifecycle.sketch_width) if name == "sketch" \
            else tuple(variable.shape)
        if value.shape != shape:
            skipped.append(f"{name} (saved {value.shape}, this table {shape})")
            continue
        if name == "clock":  # never back: `reset` may have moved it to the latest saved mark
            value = max(int(variable.numpy()), int(value))
        variable.assign(np.reshape(value, variable.shape))
    if any(s.startswith("log_") for s in skipped):  # a log of another length: start it afresh, now
        table._log_total.assign(0)
        table._log_floor.assign(int(table._clock.numpy()))
    return skipped


def reset(table: Any, keys: np.ndarray, marks: np.ndarray | None, counts: np.ndarray | None) -> np.ndarray | None:
    """Before a restore writes the rows of `keys`: marks as saved (else now) and the clock at least at
    the latest, LFU counts as saved (else 0), an empty eviction log. Returns the row of each key in a
    bucketed table (-1: its bucket was full; those keys are left out, with a warning), None for
    another table, whose keys take rows ``0 .. n-1``. A checkpoint then puts back the clock, the
    admission sketch and the log (`load_state`)."""
    life, n = table.lifecycle, len(keys)
    now = expiry_clock(table)  # (a wall clock: now, not the last training lookup, which may be none yet)
    if life.track_changes and marks is not None and len(marks):
        now = max(now, int(np.max(marks)))
    if life.track_changes:
        table._clock.assign(now)
    marks = np.full(n, now, np.int64) if marks is None else np.asarray(marks, np.int64)
    if not life.evicts:
        if life.track_changes:
            seen = np.full(table.capacity, -1, np.int64)
            seen[:n] = marks
            table._row_seen.assign(seen)
        return None
    counts = None if counts is None else np.asarray(counts, np.int64)
    priority = marks if counts is None else counts * (1 << 32) + marks
    slots = table.buckets.arrange(keys, priority)
    left = int(np.count_nonzero(slots < 0))
    if left:
        warnings.warn(f"{table.name}: {left:,} of {n:,} keys restored did not fit their buckets "
                      f"(bucket_capacity={life.bucket_capacity}, capacity={table.capacity:,}) and were left out, "
                      "the least recently used (LFU: least used) of each bucket", RuntimeWarning, stacklevel=3)
    table.buckets.load(keys, slots, marks, counts)
    table._row_fresh.assign(np.zeros(table.capacity, bool))
    table._log_total.assign(0)
    table._log_floor.assign(now)
    return slots
