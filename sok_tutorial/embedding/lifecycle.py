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
`min_count` times, counted in a count-min sketch with conservative update, ``sketch_depth x
sketch_width`` float16 counters, exact up to 2048 (bounded; it never holds keys; by default
`SKETCH_WIDTH` counters a row per row of capacity, rounded up to a power of two: 16 to 32 bytes
per row with the default depth of 4); until then it embeds to zeros, gets no row, and no optimizer
state. The sketch halves every ten counts per row of capacity, and sooner when keys new to it
arrive faster than it can tell apart (once as many have come as a row has counters), so that a
key seen once is seldom taken for one seen twice, however many keys a stream brings. A key whose
sightings are further apart than that is forgotten between them: for a stream that brings that
many new keys, raise ``sketch_width``.
``admit_probability`` admits each new key in a step with that probability (decided by a hash of
the key and the step, so runs repeat).

Change tracking (on whenever a policy is set, or with ``track_changes=True``): each row keeps
the clock of its last training lookup, and evicted keys go to a ring buffer (``eviction_log``
entries) with the clock of their eviction: `changed_since` and `evicted_since` are what a delta
export (`sok_tutorial.training.delta`) writes. Tables without a policy keep the open-addressing
index of `sok_tutorial.embedding.index` and never drop a key.

The state lives in `sok_tutorial.embedding.lifecycle_state.LifecycleState` (``table.state``).
Under a strategy, a replicated table places the distinct keys of every replica's batch on every
replica, so its copies decide alike; a row-wise sharded table keeps one state per shard
(`sok_tutorial.embedding.sharding`).

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

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import checks
from sok_tutorial.embedding.buckets import BucketedIndex
from sok_tutorial.embedding.lifecycle_ops import SALTS, SKETCH_MAX
from sok_tutorial.embedding.lifecycle_state import ordered_log

POLICIES = ("lru", "lfu", "ttl")
SKETCH_WIDTH = 2  # counters in a row of the admission sketch per row of capacity, by default (rounded up to 2**k)
OPTIONS = ("eviction_policy", "ttl", "ttl_seconds", "lfu_halflife", "bucket_capacity", "min_count",
           "admit_probability", "sketch_depth", "sketch_width", "track_changes", "eviction_log")  # EmbeddingTable's
REMOVED = {"evict_fraction": "a table with an eviction_policy evicts inside each insert, one row per new key",
           "lfu_decay": "LFU counts halve every lfu_halflife steps"}


MAX_STATE = 2**31  # sketch_width, eviction_log: entries of a state array
MAX_BUCKET = 1024  # bucket_capacity: every lookup of a key reads its whole bucket
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
        if ttl_seconds is not None and (isinstance(ttl_seconds, (bool, np.bool_))
                                        or not isinstance(ttl_seconds, numbers.Real)
                                        or not 1 <= ttl_seconds * 1000 < _CLOCK_LIMIT):
            raise ValueError(f"ttl_seconds={ttl_seconds!r} is invalid: expected a number of seconds from 0.001 "
                             f"(the table's clock counts milliseconds in int64) to less than {_CLOCK_LIMIT // 1000}")
        checks.flag("track_changes", track_changes)
        if isinstance(admit_probability, (bool, np.bool_)) or not isinstance(admit_probability, numbers.Real) \
                or not 0 < admit_probability <= 1:
            raise ValueError(f"admit_probability={admit_probability!r} is invalid: expected a number in (0, 1]")
        if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) \
                or not 1 <= min_count <= SKETCH_MAX:
            raise ValueError(f"min_count={min_count!r} is invalid: expected an integer from 1 (every key gets a row "
                             f"at once) to {SKETCH_MAX} (the admission sketch's float16 counters stop there)")
        width = checks.positive_int("bucket_capacity", bucket_capacity)
        if width & (width - 1) or width > MAX_BUCKET:
            raise ValueError(f"bucket_capacity={bucket_capacity!r} is invalid: expected a power of two up to "
                             f"{MAX_BUCKET} (8: one 64-byte cache line of int64 keys; a lookup reads a key's whole "
                             "bucket)")
        if checks.positive_int("lfu_halflife", lfu_halflife) >= _CLOCK_LIMIT:
            raise ValueError(f"lfu_halflife={lfu_halflife} is invalid: expected fewer than {_CLOCK_LIMIT} clock units")
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
        for what, value in (("sketch_width", sketch_width), ("eviction_log", eviction_log)):
            if value is not None and checks.positive_int(what, value) > MAX_STATE:
                raise ValueError(f"{what}={value} is invalid: expected at most {MAX_STATE} (2**31: entries of an "
                                 "array the table keeps in memory)")

        def rounded(value: int | None) -> int:  # a sketch row's counters, as kept
            return 1 << max(4, int(np.ceil(np.log2(value if value is not None else SKETCH_WIDTH * capacity))))

        width_sketch = rounded(sketch_width)
        log = capacity if eviction_log is None else int(eviction_log)
        # An option whose feature is off is refused when set to anything but its default (what
        # `config` writes back for it, so a table's config always builds the table again).
        sketched, lfu, policy = min_count > 1, eviction_policy == "lfu", eviction_policy is not None
        for option, value, changed, applies, needs in (
                ("sketch_width", sketch_width, width_sketch != rounded(None), sketched, "min_count > 1 (admission)"),
                ("sketch_depth", sketch_depth, sketch_depth != 4, sketched, "min_count > 1 (admission)"),
                ("lfu_halflife", lfu_halflife, lfu_halflife != 1000, lfu, "eviction_policy='lfu'"),
                ("bucket_capacity", bucket_capacity, width != 8, policy, "an eviction_policy"),
                ("eviction_log", eviction_log, log != capacity, policy, "an eviction_policy")):
            if changed and not applies:
                raise ValueError(f"{name}: {option}={value!r} has no effect here: it needs {needs}, got "
                                 f"eviction_policy={eviction_policy!r}, min_count={min_count}")
        seconds = None if ttl_seconds is None else float(ttl_seconds)
        return cls(eviction_policy, None if ttl is None else int(ttl), seconds, int(lfu_halflife), width,
                   int(min_count), float(admit_probability), int(sketch_depth), width_sketch,
                   bool(track_changes) or eviction_policy is not None, log)

    def check_row_state(self, name: str, marks: Any, counts: Any) -> None:
        """Raise ValueError, naming the array, if saved per-key `marks` or `counts` (None: absent)
        cannot be this table's: both integers >= 0, and marks readings of this table's clock. A
        table with a policy keeps step marks in int32 (below 2**31 - 1); with ``ttl_seconds`` its
        clock counts milliseconds since 1970, so its marks are at least 2**31. Marks of one kind of
        clock restored into a table of the other would expire every key at once, or stop the step
        clock at its limit."""
        for array, what in ((marks, "marks"), (counts, "counts")):
            if array is None or not np.size(array):
                continue
            values = np.asarray(array)
            if values.dtype.kind not in "iu" or values.min() < 0:
                raise ValueError(f"{name}: {what} must be integers >= 0, got {values.dtype} from {values.min()}")
        if marks is None or not np.size(marks):
            return
        low, high = int(np.min(marks)), int(np.max(marks))
        if self.wall_clock and low < 2**31:
            raise ValueError(f"{name}: marks from {low} are invalid for a table with ttl_seconds, whose clock counts "
                             "milliseconds since 1970 (at least 2**31): they look like steps, from a table whose "
                             "clock counts training lookups")
        if self.evicts and not self.wall_clock and high > _STEP_LIMIT:
            raise ValueError(f"{name}: marks up to {high} are invalid for a table whose clock counts training lookups "
                             f"(int32, at most {_STEP_LIMIT}): they look like milliseconds, from a table with "
                             "ttl_seconds")

    def bucketed_index(self, capacity: int, shards: int = 1) -> BucketedIndex | None:
        """The bucketed index (its variables not made yet) of a table of `capacity` rows with a
        policy (per shard, of `shards` row-wise shards); None without one."""
        if not self.evicts:
            return None
        return BucketedIndex(capacity, self.bucket_capacity, self.eviction_policy,
                             ttl=self.ttl_units if self.eviction_policy == "ttl" else None,
                             halflife=self.lfu_halflife, mark_dtype="int64" if self.wall_clock else "int32",
                             shards=shards)

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

    def state_bytes(self, capacity: int) -> int:
        """Bytes of the lifecycle variables of one table (or shard) of `capacity` rows (`rows`, whole
        buckets with a policy), the bucketed index included; 0 for a table without lifecycle state.
        The planner prices a table with these (`sok_tutorial.embedding.planner`)."""
        if not self.active:
            return 0
        out = 8  # the clock
        if self.evicts:  # bucketed index, row_fresh; unplaced; the eviction log and its two counters
            out += capacity * (self.bucketed_index(capacity).bytes_per_row + 1) + 8 + 16 * self.eviction_log + 16
        elif self.track_changes:
            out += 8 * capacity  # row_seen
        if self.min_count > 1:
            out += 2 * self.sketch_depth * self.sketch_width + 16  # the sketch, its counts and keys since halving
        return out

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


# ---------------------------------------------------------------------- on the host
def mark(table: Any) -> int:
    """The table's clock now: what `changed_since` and `evicted_since` compare with."""
    return table.state.mark()


def changed_since(table: Any, since: int) -> np.ndarray:
    """Rows of `table` whose vectors a training lookup (or `write`) touched after clock `since`
    (`sok_tutorial.embedding.lifecycle_state.LifecycleState.changed_since`)."""
    return table.state.changed_since(since, table.size if table.indexed else table.capacity)


def evicted_since(table: Any, since: int) -> np.ndarray:
    """Keys of `table` evicted after clock `since`, oldest first, then (``"ttl"``) the keys expired
    since then (`sok_tutorial.embedding.lifecycle_state.LifecycleState.evicted_since`); a table
    sharded row-wise over this process's replicas: shard by shard."""
    return np.concatenate([state.evicted_since(since) for state in table.shard_states()])


def saved_state(table: Any) -> dict[str, np.ndarray]:
    """What a checkpoint keeps of the table's lifecycle beside its rows: the clock, the admission
    sketch and the eviction log (so that a restored trainer admits as it would have and can
    continue its chain of deltas). Empty for a table without lifecycle state.

    A sharded table keeps one state per shard: their clocks agree, their sketches sum into the
    one-device sketch and their eviction logs merge into one (`merged_state`), which the checkpoint
    holds (over worker processes, each worker's part is merged by the one writing the checkpoint)."""
    if not table.lifecycle.active:
        return {}
    states = table.shard_states()
    if table.num_shards == 1:
        return states[0].saved()
    return merged_state([state.saved() for state in states])  # (worker processes: this one's shards)


def merged_state(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The state of a table from its shards' (`saved_state`): the latest clock, the summed admission
    sketch (each key is counted in its own shard's only) and one eviction log, every shard's entries
    in order of their marks, complete after the latest of the shards' floors."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    merged = {"clock": np.max([p["clock"] for p in parts])}
    for name in ("sketch", "sketch_added", "sketch_keys"):
        if name in parts[0]:
            total = np.sum([np.asarray(p[name], np.int64) for p in parts], axis=0)
            merged[name] = (np.minimum(total, SKETCH_MAX) if name == "sketch" else total).astype(parts[0][name].dtype)
    if "log_keys" in parts[0]:
        logs = [ordered_log(p) for p in parts]
        floor = max(log[2] for log in logs)
        keys, marks = (np.concatenate([log[i] for log in logs]) for i in (0, 1))
        order = np.argsort(marks, kind="stable")
        keep = order[marks[order] > floor]  # (before the floor, some shard's log no longer holds them all)
        merged.update(log_keys=keys[keep], log_marks=marks[keep], log_total=np.int64(len(keep)),
                      log_floor=np.int64(floor))
    return merged


def load_state(table: Any, state: dict[str, np.ndarray]) -> list[str]:
    """Put back what `saved_state` kept (after a restore of the rows); returns what did not fit this
    table's options (another sketch size), which stays as the restore left it. Every shard of a
    sharded table takes the whole sketch (a count-min sketch may only overcount), and the evicted
    keys of its own row group (table-wise, where a key's replica follows from its slot, which the
    log does not keep: the first replica takes them all)."""
    if table.num_shards == 1:
        return table.state.load(state)
    shared = {name: value for name, value in state.items() if not name.startswith("log_")}
    skipped = [table.state.local(c).load(shared) for c in range(len(table.local_shards))]
    if "log_keys" in state and table.lifecycle.evicts:
        keys, marks, floor = ordered_log(state)
        groups = np.zeros(len(keys), np.int64) if table.needs_slots else table.group_of_np(keys)  # (group 0: replica 0)
        for c, shard in enumerate(table.local_shards):
            mine = groups == table.group(shard)
            table.state.local(c).load_log(keys[mine], marks[mine], floor)
    return skipped[0]
