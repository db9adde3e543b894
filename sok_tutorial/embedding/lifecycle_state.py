"""The lifecycle state of a table that forgets: the variables behind eviction, admission and change
tracking, owned by one object and read only through its methods.

A table with any lifecycle option (`sok_tutorial.embedding.lifecycle.Lifecycle`) holds a
`LifecycleState` (``table.state``); nothing else touches its variables. Its graph methods
(`sok_tutorial.embedding.lifecycle_ops.LifecycleOps`: the clock, admission, placing keys, the
eviction log) run inside a training step; the host methods below answer exports, deltas and
checkpoints. The variables are Keras weights of the table, so under a strategy they are mirrored
like the table's own: each replica's copy is the state of its shard. Host methods read this
process's first copy; `local` gives the state over any other (a shard of a row-wise table).

    clock               int64   training lookups so far (or the time in ms of the last, ttl_seconds)
    row_seen            int64   no policy, tracking changes: each row's last mark (-1: never)
    buckets                     a policy: the `sok_tutorial.embedding.buckets.BucketedIndex`
    row_fresh           bool    a policy: rows given to a new key since an optimizer last updated them
    unplaced            int64   a policy: new keys that found their bucket in use by their own step
    log_keys, log_marks int64   a policy: the eviction log, a ring of eviction_log entries, and
    log_total, log_floor        the count ever logged and the newest mark the ring let go
    sketch              float16 min_count > 1: the count-min sketch (``sketch_depth`` rows of
    sketch_added,       int64   ``sketch_width`` counters), and the counts and the keys new to it
    sketch_keys                 since its last halving
"""
from __future__ import annotations

import time
import warnings
from typing import Any

import keras
import numpy as np

from sok_tutorial.embedding.lifecycle_ops import SKETCH_MAX, LifecycleOps
from sok_tutorial.embedding.ops import local_view

_VARIABLES = ("clock", "row_seen", "row_fresh", "unplaced", "log_keys", "log_marks", "log_total", "log_floor",
              "sketch", "sketch_added", "sketch_keys")
_SAVED = ("clock", "sketch", "sketch_added", "sketch_keys", "log_keys", "log_marks", "log_total", "log_floor")


class LifecycleState(LifecycleOps):
    """The lifecycle variables of a table named `name` of `capacity` rows (per shard) with `options`
    (module docstring); `create` makes them, as weights of the table. `shards`: the row-wise shards
    of the table, each holding one copy of these variables (`local`)."""

    def __init__(self, name: str, options: Any, capacity: int, shards: int = 1):
        self.name, self.options, self.capacity, self.shards = name, options, capacity, shards
        self.buckets = options.bucketed_index(capacity, shards)  # its variables come with `create`
        self.clock = self.row_seen = self.row_fresh = self.unplaced = None
        self.log_keys = self.log_marks = self.log_total = self.log_floor = None
        self.sketch = self.sketch_added = self.sketch_keys = None

    def create(self, layer: Any) -> None:
        """Make the variables as non-trainable weights of `layer` (the table)."""
        life, capacity = self.options, self.capacity

        def weight(name: str, shape: tuple, dtype: str, value: Any = 0) -> Any:
            return layer.add_weight(name=name, shape=shape, dtype=dtype, trainable=False,
                                    initializer=keras.initializers.Constant(value))

        self.clock = weight("clock", (), "int64")
        if life.evicts:
            self.buckets.create(weight)
            self.row_fresh = weight("row_fresh", (capacity,), "bool", False)
            self.unplaced = weight("unplaced", (), "int64")
            self.log_keys = weight("log_keys", (life.eviction_log,), "int64")
            self.log_marks = weight("log_marks", (life.eviction_log,), "int64")
            self.log_total = weight("log_total", (), "int64")
            self.log_floor = weight("log_floor", (), "int64", -1)
        elif life.track_changes:
            self.row_seen = weight("row_seen", (capacity,), "int64", -1)
        if life.min_count > 1:
            self.sketch = weight("sketch", (life.sketch_depth * life.sketch_width,), "float16")
            self.sketch_added = weight("sketch_added", (), "int64")
            self.sketch_keys = weight("sketch_keys", (), "int64")

    @property
    def created(self) -> bool:
        return self.clock is not None

    def local(self, component: int) -> LifecycleState:
        """This state over one local copy of its variables (a shard of a table sharded over this
        process's replicas; 0 on one device), for the host and for lookups outside ``strategy.run``."""
        view = local_view(self, _VARIABLES, component)
        if self.buckets is not None:
            view.buckets = self.buckets.local(component)
        return view

    # ------------------------------------------------------------------ on the host
    @staticmethod
    def _read(variable: Any) -> np.ndarray:
        return np.asarray(variable.numpy())  # (a mirrored variable: this process's first copy; see `local`)

    def mark(self) -> int:
        """The clock now: what `changed_since` and `evicted_since` compare with."""
        return int(self._read(self.clock)) if self.created else 0

    def expiry_clock(self) -> int:
        """What ``"ttl"`` compares a row's mark with on the host: the clock, or for a wall clock the
        time now (a table that stopped training still sees its keys expire)."""
        clock = self.mark()
        return max(clock, int(time.time() * 1000)) if self.options.wall_clock else clock

    def evictions(self) -> int:
        """Keys evicted so far (0 without a policy)."""
        return int(self._read(self.log_total)) if self.options.evicts and self.created else 0

    def unplaced_keys(self) -> int:
        """New keys left without a row because their bucket was in use by their own step."""
        return int(self._read(self.unplaced)) if self.options.evicts and self.created else 0

    def live(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A table with a policy: (rows, keys, marks) of the rows holding a key not expired, row order."""
        return self.buckets.live(self.expiry_clock())

    def row_marks(self, rows: np.ndarray) -> np.ndarray:
        """The clock of each row's last training lookup (or write)."""
        if self.options.evicts:
            return self.buckets.marks_np(self._read(self.buckets.marks)[rows])
        return self._read(self.row_seen)[rows].astype(np.int64)

    def row_counts(self, rows: np.ndarray) -> np.ndarray:
        """``"lfu"``: each row's count, as stored (decayed as of its last touch)."""
        return self.buckets.counts_np(self._read(self.buckets.marks)[rows])

    def changed_since(self, since: int, rows_in_use: int) -> np.ndarray:
        """Rows whose vectors a training lookup (or `write`) touched after clock `since` (found from
        the rows' marks when asked: nothing is recorded per step); `rows_in_use`: how many rows of a
        table without a policy hold keys (its rows ``0 .. rows_in_use - 1``)."""
        self._tracked()
        if self.options.evicts:
            rows, _, marks = self.live()
            return rows[marks > since]
        seen = self._read(self.row_seen)[:rows_in_use]
        return np.flatnonzero(seen > since).astype(np.int64)

    def evicted_since(self, since: int) -> np.ndarray:
        """Keys evicted after clock `since`, oldest first (a key may appear again if it came back),
        then, under ``"ttl"``, the keys that have expired since then and still sit in their rows."""
        self._tracked()
        if not self.options.evicts:
            return np.zeros(0, np.int64)
        floor = int(self._read(self.log_floor))
        if since < floor:
            raise ValueError(f"{self.name}: the eviction log (eviction_log={self.options.eviction_log:,} entries) "
                             f"no longer holds evictions after mark {since} (it starts after {floor}); export the "
                             "table in full, or raise eviction_log")
        total, size = int(self._read(self.log_total)), self.options.eviction_log
        order = np.arange(max(0, total - size), total) % size
        keys, marks = self._read(self.log_keys)[order], self._read(self.log_marks)[order]
        return np.concatenate([keys[marks > since], self.buckets.expired(since, self.expiry_clock())])

    def _tracked(self) -> None:
        if not self.options.track_changes:
            raise ValueError(f"{self.name}: the table does not track changes; build it with track_changes=True "
                             "(or an eviction_policy) to export deltas")

    def saved(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps beside the rows: the clock, the admission sketch and the eviction log."""
        state = {name: self._read(getattr(self, name)) for name in _SAVED
                 if getattr(self, name) is not None}
        if "sketch" in state:  # saved as depth x width: a sketch of another shape is told apart on restore
            state["sketch"] = state["sketch"].reshape(self.options.sketch_depth, self.options.sketch_width)
        return state

    def load(self, state: dict[str, np.ndarray]) -> list[str]:
        """Put back what `saved` kept (after `reset`); returns what did not fit these options (another
        sketch size), which stays as `reset` left it. An eviction log of another length (or merged from
        shards, `ordered_log`) goes in through `load_log`."""
        skipped = []
        if "log_keys" in state and self.log_keys is not None:
            self.load_log(*ordered_log(state))
        for name in _SAVED:
            variable = getattr(self, name)
            if name not in state or variable is None or name.startswith("log_"):
                continue
            value = state[name]
            shape = (self.options.sketch_depth, self.options.sketch_width) if name == "sketch" \
                else tuple(variable.shape)
            if value.shape != shape:
                skipped.append(f"{name} (saved {value.shape}, this table {shape})")
                continue
            if name == "clock":  # never back: `reset` may have moved it to the latest saved mark
                value = max(int(variable.numpy()), int(value))
            if name == "sketch":  # (an int32 sketch of an earlier version: its counts, saturated)
                value = np.minimum(value, SKETCH_MAX).astype(np.float16)
            variable.assign(np.reshape(value, variable.shape))
        return skipped

    def load_log(self, keys: np.ndarray, marks: np.ndarray, floor: int) -> None:
        """Set the eviction log to `keys` evicted at `marks` (oldest first), complete after mark
        `floor`. A ring too short for them keeps the newest, and is then complete only after the
        newest mark it let go."""
        size, keys, marks = self.options.eviction_log, np.asarray(keys, np.int64), np.asarray(marks, np.int64)
        if len(keys) > size:
            floor = max(int(floor), int(marks[len(keys) - size - 1]))
            keys, marks = keys[-size:], marks[-size:]
        ring_keys, ring_marks = np.zeros(size, np.int64), np.zeros(size, np.int64)
        ring_keys[:len(keys)], ring_marks[:len(marks)] = keys, marks
        self.log_keys.assign(ring_keys)
        self.log_marks.assign(ring_marks)
        self.log_total.assign(len(keys))
        self.log_floor.assign(int(floor))

    def reset(self, keys: np.ndarray, marks: np.ndarray | None, counts: np.ndarray | None,
              clock: int = 0) -> np.ndarray | None:
        """Before a restore writes the rows of `keys`: marks as saved (else now) and the clock at least
        at the latest, LFU counts as saved (else 0), an empty eviction log. Returns the row of each key
        in a bucketed table (-1: its bucket was full; those keys are left out, with a warning), None
        for another table, whose keys take rows ``0 .. n-1``. A checkpoint then puts back the clock,
        the admission sketch and the log (`load`). `clock`: the clock starts at least there (the
        shards of a table restore to one clock, the latest mark of all of them)."""
        life, n = self.options, len(keys)
        now = max(self.expiry_clock(), clock)  # (a wall clock: now, not the last training lookup, maybe none yet)
        if life.track_changes and marks is not None and len(marks):
            now = max(now, int(np.max(marks)))
        if life.track_changes:
            self.clock.assign(now)
        marks = np.full(n, now, np.int64) if marks is None else np.asarray(marks, np.int64)
        if not life.evicts:
            if life.track_changes:
                seen = np.full(self.capacity, -1, np.int64)
                seen[:n] = marks
                self.row_seen.assign(seen)
            return None
        counts = None if counts is None else np.asarray(counts, np.int64)
        priority = marks if counts is None else counts * (1 << 32) + marks
        slots = self.buckets.arrange(keys, priority)
        left = int(np.count_nonzero(slots < 0))
        if left:
            warnings.warn(f"{self.name}: {left:,} of {n:,} keys restored did not fit their buckets "
                          f"(bucket_capacity={life.bucket_capacity}, capacity={self.capacity:,}) and were left out, "
                          "the least recently used (LFU: least used) of each bucket", RuntimeWarning, stacklevel=3)
        self.buckets.load(keys, slots, marks, counts)
        self.row_fresh.assign(np.zeros(self.capacity, bool))
        self.log_total.assign(0)
        self.log_floor.assign(now)
        return slots


def ordered_log(state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """(keys, marks, floor) of a saved eviction log, oldest first: `LifecycleState.saved` keeps the
    ring as it is (``log_total`` entries ever, the last ``len(log_keys)`` of them held); a log merged
    from shards is already in order (``log_total == len(log_keys)``), which reads the same way."""
    keys, marks, total = np.asarray(state["log_keys"]), np.asarray(state["log_marks"]), int(state["log_total"])
    order = np.arange(max(0, total - len(keys)), total) % max(len(keys), 1)
    return keys[order], marks[order], int(state["log_floor"])
