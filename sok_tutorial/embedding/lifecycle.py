"""Tables that forget: eviction, admission and change tracking for a dynamic `EmbeddingTable`.

A table built with an eviction policy never runs out of rows: when a training step brings more
new keys than it has rows left, it evicts a batch of the rows that matter least and gives them
to the new keys. Everything happens in the step's graph, with TensorFlow ops:

* `"lru"`: the rows seen longest ago go first (the table's clock counts its training lookups).
* `"lfu"`: the rows seen least often go first; counts halve (``lfu_decay``) at every eviction, so
  what was popular long ago fades.
* `"ttl"`: a row not seen for ``ttl`` steps (or ``ttl_seconds``) is evicted by a pass that runs
  every quarter of the ttl; a full table evicts the oldest rows, as `"lru"`.

One eviction frees ``max(needed, evict_fraction * capacity)`` rows (1/16 by default), so the
scan it costs (a histogram of the rows' scores and a threshold: no sort) is paid once per
thousands of new keys, not every step. Rows a step is using are never evicted in that step.
An evicted key leaves a tombstone in the key index (the index is rebuilt when tombstones and
capacity reach three quarters of its slots), its row goes to a free list, and the row's optimizer slots are
started afresh at their next update (`EmbeddingTable.fresh_rows`).

Admission (``min_count``, ``admit_probability``): a new key gets a row only once it has been seen
`min_count` times, counted in a count-min sketch of ``sketch_depth x sketch_width`` int32
counters (bounded; it never holds keys; halved at every eviction); until then it embeds to
zeros, gets no row, and no optimizer state. ``admit_probability`` admits each new key in a step
with that probability (decided by a hash of the key and the step, so runs repeat).

Change tracking (on whenever a policy is set, or with ``track_changes=True``): each row keeps
the clock of its last training lookup, and evicted keys go to a ring buffer (``eviction_log``
entries) with the clock of their eviction: `changed_since` and `evicted_since` are what a delta
export (`sok_tutorial.training.delta`) writes.

Example:
    >>> import tensorflow as tf
    >>> from sok_tutorial.embedding import EmbeddingTable
    >>> table = EmbeddingTable(4, 2, eviction_policy="lru", evict_fraction=0.25)
    >>> for batch in ([1, 2], [3, 4], [1, 5]):   # key 5 finds the table full: 2 (oldest) goes
    ...     _ = table(tf.constant(batch, tf.int64), training=True)
    >>> sorted(table.export()["keys"].tolist()), table.size
    ([1, 3, 4, 5], 4)
    >>> evicted_since(table, 0).tolist()
    [2]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import index as key_index

POLICIES = ("lru", "lfu", "ttl")
OPTIONS = ("eviction_policy", "ttl", "ttl_seconds", "lfu_decay", "evict_fraction", "min_count", "admit_probability",
           "sketch_depth", "sketch_width", "track_changes", "eviction_log")  # EmbeddingTable's keyword arguments
BINS = 4096  # score histogram of an eviction: rows older (or rarer) than this share the last bin
_TOMBSTONE = -2
_SALTS = (0x2545F4914F6CDD1D, 0x5851F42D4C957F2D, 0x14057B7EF767814F, 0x9E3779B97F4A7C15 - (1 << 64),
          0x6C8E9CF570932BD5, 0x1B03738712FAD5C9, 0x0E9C8D5F3B3A6F27, 0x7F4A7C159E3779B9)


@dataclass(frozen=True)
class Lifecycle:
    """A table's validated eviction, admission and tracking options (see the module docstring)."""

    eviction_policy: str | None
    ttl: int | None
    ttl_seconds: float | None
    lfu_decay: float
    evict_fraction: float
    min_count: int
    admit_probability: float
    sketch_depth: int
    sketch_width: int
    track_changes: bool
    eviction_log: int

    @classmethod
    def create(cls, name: str, capacity: int, dynamic: bool, *, eviction_policy: str | None = None,
               ttl: int | None = None, ttl_seconds: float | None = None, lfu_decay: float = 0.5,
               evict_fraction: float = 1 / 16, min_count: int = 1, admit_probability: float = 1.0,
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
        if ttl is not None:
            checks.positive_int("ttl", ttl)
        if ttl_seconds is not None and not (isinstance(ttl_seconds, (int, float)) and ttl_seconds > 0):
            raise ValueError(f"ttl_seconds={ttl_seconds!r} is invalid: expected a positive number of seconds")
        for arg, value, low_open in (("lfu_decay", lfu_decay, True), ("evict_fraction", evict_fraction, True),
                                     ("admit_probability", admit_probability, True)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"{arg}={value!r} is invalid: expected a number in (0, 1]")
        if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 1:
            raise ValueError(f"min_count={min_count!r} is invalid: expected an integer >= 1 (1: every key "
                             "gets a row at once)")
        admits = min_count > 1 or admit_probability < 1
        if not dynamic and (eviction_policy is not None or admits):
            raise ValueError(f"{name}: eviction_policy={eviction_policy!r}, min_count={min_count}, "
                             f"admit_probability={admit_probability} need a dynamic table (use_hashtable=True); "
                             "a table of row ids has a row for every key")
        checks.positive_int("sketch_depth", sketch_depth)
        if sketch_depth > len(_SALTS):
            raise ValueError(f"sketch_depth={sketch_depth} is invalid: expected at most {len(_SALTS)}")
        width = 1 << max(4, int(np.ceil(np.log2(checks.positive_int("sketch_width", sketch_width)
                                                 if sketch_width is not None else capacity))))
        log = capacity if eviction_log is None else checks.positive_int("eviction_log", eviction_log)
        return cls(eviction_policy, ttl, None if ttl_seconds is None else float(ttl_seconds), float(lfu_decay),
                   float(evict_fraction), int(min_count), float(admit_probability), int(sketch_depth), width,
                   bool(track_changes) or eviction_policy is not None, log)

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

    def config(self) -> dict[str, Any]:
        return {"eviction_policy": self.eviction_policy, "ttl": self.ttl, "ttl_seconds": self.ttl_seconds,
                "lfu_decay": self.lfu_decay, "evict_fraction": self.evict_fraction, "min_count": self.min_count,
                "admit_probability": self.admit_probability, "sketch_depth": self.sketch_depth,
                "sketch_width": self.sketch_width, "track_changes": self.track_changes,
                "eviction_log": self.eviction_log}


def build(table: Any) -> None:
    """Create the table's lifecycle variables (Keras weights, not trainable)."""
    life, capacity = table.lifecycle, table.capacity

    def weight(name: str, shape: tuple, dtype: str, value: Any = 0) -> Any:
        return table.add_weight(name=name, shape=shape, dtype=dtype, trainable=False,
                                initializer=keras.initializers.Constant(value))

    table._clock = weight("clock", (), "int64")
    if life.track_changes:
        table._row_seen = weight("row_seen", (capacity,), "int64", -1)
    if life.eviction_policy == "lfu":
        table._row_count = weight("row_count", (capacity,), "int32")
    if life.evicts:
        table._row_fresh = weight("row_fresh", (capacity,), "bool", False)
        table._free_rows = weight("free_rows", (capacity,), "int64")
        table._num_free = weight("num_free", (), "int64")
        table._tombstones = weight("tombstones", (), "int64")
        table._last_expiry = weight("last_expiry", (), "int64")
        table._log_keys = weight("log_keys", (life.eviction_log,), "int64")
        table._log_marks = weight("log_marks", (life.eviction_log,), "int64")
        table._log_total = weight("log_total", (), "int64")
        table._log_floor = weight("log_floor", (), "int64", -1)
    if life.min_count > 1:
        table._sketch = weight("sketch", (life.sketch_depth * life.sketch_width,), "int32")


# ---------------------------------------------------------------------- in the graph
def _v(variable: Any) -> Any:
    return variable.value


def tick(table: Any) -> tf.Tensor:
    """Advance the table's clock (one training lookup, or the wall clock in ms) and return it."""
    if table.lifecycle.wall_clock:
        return _v(table._clock).assign(tf.cast(tf.timestamp() * 1000.0, tf.int64))
    return _v(table._clock).assign_add(1)


def touch(table: Any, rows: tf.Tensor, now: tf.Tensor, counts: tf.Tensor | None = None) -> list[Any]:
    """Mark `rows` (distinct) seen at `now`; LFU also adds their `counts`."""
    ops = [_v(table._row_seen).scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), now), rows))]
    if counts is not None and table.lifecycle.eviction_policy == "lfu":
        ops.append(_v(table._row_count).scatter_add(tf.IndexedSlices(tf.cast(counts, tf.int32), rows)))
    return ops


def _buckets(keys: tf.Tensor, depth: int, width: int) -> tf.Tensor:
    """Sketch counter of each key in each row of the sketch: ``[depth, n]`` flat indices."""
    bits = width.bit_length() - 1
    return tf.stack([key_index.home_slots(tf.bitwise.bitwise_xor(keys, tf.constant(_SALTS[d], tf.int64)), bits)
                     + d * width for d in range(depth)])


def admit(table: Any, keys: tf.Tensor, counts: tf.Tensor | None, now: tf.Tensor) -> tf.Tensor:
    """Which of the new distinct `keys` get a row now (counting them first)."""
    life = table.lifecycle
    ok = tf.ones(tf.shape(keys), tf.bool)
    if life.min_count > 1:
        buckets = _buckets(keys, life.sketch_depth, life.sketch_width)  # (depth, n)
        add = tf.tile(tf.cast(counts, tf.int32)[None], [life.sketch_depth, 1])
        counted = _v(table._sketch).scatter_add(tf.IndexedSlices(tf.reshape(add, [-1]), tf.reshape(buckets, [-1])))
        with tf.control_dependencies([counted]):
            seen = tf.reduce_min(tf.gather(_v(table._sketch), buckets), axis=0)
        ok &= seen >= life.min_count
    if life.admit_probability < 1:
        salt = tf.bitwise.bitwise_xor(keys, now * tf.constant(0x9E3779B97F4A7C15 - (1 << 64), tf.int64))
        draw = tf.cast(key_index.home_slots(salt, 24), tf.float64) / float(1 << 24)
        ok &= draw < life.admit_probability
    return ok


def _badness(table: Any, rows_seen: tf.Tensor, now: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    """Eviction order of rows ``[0, size)``: a larger bin goes first; bins in ``[0, BINS)``."""
    life = table.lifecycle
    if life.eviction_policy == "lfu":
        count = tf.cast(_v(table._row_count)[:size], tf.int64)
        return (BINS - 1) - tf.minimum(count, BINS - 1)
    age = now - rows_seen
    if life.eviction_policy == "ttl":  # an expired row (age > ttl) lands in bin >= 1024, any other below
        return tf.minimum(age * 1024 // (_ttl_units(life) + 1), BINS - 1)
    return tf.minimum(age, BINS - 1)


def _ttl_units(life: Lifecycle) -> int:
    return int(life.ttl_seconds * 1000) if life.wall_clock else int(life.ttl)


def _choose(table: Any, want: tf.Tensor, now: tf.Tensor) -> tf.Tensor:
    """Rows to evict: the `want` worst by the policy, and every expired row under ``"ttl"``; never a
    free row or one seen at `now` (this step's)."""
    size = _v(table._size)
    seen = _v(table._row_seen)[:size]
    candidate = (seen >= 0) & (seen != now)
    bins = _badness(table, seen, now, size)
    if table.lifecycle.eviction_policy == "ttl":
        want = tf.maximum(want, tf.reduce_sum(tf.cast(candidate & (bins >= 1024), tf.int64)))
    hist = tf.math.bincount(tf.cast(tf.boolean_mask(bins, candidate), tf.int32), minlength=BINS, maxlength=BINS,
                            dtype=tf.int64)
    above = tf.cumsum(hist, reverse=True)  # candidates in this bin or a worse one
    enough = tf.where(above >= want)[:, 0]
    threshold = tf.cond(tf.size(enough) > 0, lambda: tf.reduce_max(enough), lambda: tf.constant(0, tf.int64))
    worse = tf.where(candidate & (bins > threshold))[:, 0]
    tied = tf.where(candidate & (bins == threshold))[:, 0]
    return tf.concat([worse, tied[:tf.maximum(want - tf.size(worse, tf.int64), 0)]], 0)


def _log(table: Any, keys: tf.Tensor, now: tf.Tensor) -> list[Any]:
    """Append evicted `keys` to the ring buffer; remember the newest mark the buffer lets go."""
    size = table.lifecycle.eviction_log
    total, n = _v(table._log_total), tf.size(keys, tf.int64)
    keys, n_kept = keys[-size:], tf.minimum(n, size)
    at = (total + n - n_kept + tf.range(n_kept)) % size
    overwritten = tf.maximum(total + n - size, 0)  # entries [0, overwritten) are gone afterwards
    newest_lost = tf.where(n > size, now, tf.gather(_v(table._log_marks), (overwritten - 1) % size))
    lost = tf.where(overwritten > 0, tf.maximum(newest_lost, _v(table._log_floor)), _v(table._log_floor))
    with tf.control_dependencies([lost]):
        return [_v(table._log_floor).assign(lost),
                _v(table._log_keys).scatter_update(tf.IndexedSlices(keys, at)),
                _v(table._log_marks).scatter_update(tf.IndexedSlices(tf.fill([n_kept], now), at)),
                _v(table._log_total).assign_add(n)]


def evict(table: Any, want: tf.Tensor, now: tf.Tensor) -> tf.Tensor:
    """Evict `want` rows (more under ``"ttl"`` when more expired); returns how many went."""
    life, index = table.lifecycle, table.index_variables()
    victims = _choose(table, want, now)
    n = tf.size(victims, tf.int64)
    keys = tf.gather(_v(table._row_keys), victims)
    _, slots = key_index.lookup(index, keys)
    ops = [index.slot_rows.scatter_update(tf.IndexedSlices(tf.fill([n], tf.constant(_TOMBSTONE, tf.int64)), slots)),
           _v(table._tombstones).assign_add(n),
           _v(table._row_seen).scatter_update(tf.IndexedSlices(tf.fill([n], tf.constant(-1, tf.int64)), victims)),
           _v(table._free_rows).scatter_update(tf.IndexedSlices(victims, _v(table._num_free) + tf.range(n))),
           *_log(table, keys, now)]
    if life.eviction_policy == "lfu":
        ops.append(_v(table._row_count).scatter_update(tf.IndexedSlices(tf.zeros([n], tf.int32), victims)))
    with tf.control_dependencies(ops):
        ops = [_v(table._num_free).assign_add(n), _v(table._last_expiry).assign(now)]
        if life.eviction_policy == "lfu":
            count = _v(table._row_count)
            ops.append(count.assign(tf.cast(tf.cast(count, tf.float32) * life.lfu_decay, tf.int32)))
        if life.min_count > 1:
            ops.append(_v(table._sketch).assign(tf.bitwise.right_shift(_v(table._sketch), 1)))
    with tf.control_dependencies(ops):
        # keys never outnumber capacity, so this keeps a quarter of the slots empty whatever comes next
        # (a probe ends only on an empty slot)
        crowded = _v(table._tombstones) + table.capacity > 3 * int(index.slot_rows.shape[0]) // 4
        rebuilt = tf.cond(crowded, lambda: rebuild(table), lambda: tf.constant(False))
    with tf.control_dependencies([rebuilt]):
        return tf.identity(n)


def rebuild(table: Any) -> tf.Tensor:
    """Re-place every live key in an empty index (drops the tombstones)."""
    index = table.index_variables()
    live = tf.where(_v(table._row_seen)[:_v(table._size)] >= 0)[:, 0]
    keys = tf.gather(_v(table._row_keys), live)
    cleared = index.slot_rows.assign(tf.fill(tf.shape(index.slot_rows), tf.constant(-1, tf.int64)))
    with tf.control_dependencies([cleared]):
        placed = key_index.insert(index, keys, live, key_index.home_slots(keys, index.bits))
    with tf.control_dependencies([placed]):
        done = _v(table._tombstones).assign(0)
    with tf.control_dependencies([done]):
        return tf.constant(True)


def place(table: Any, keys: tf.Tensor, counts: tf.Tensor | None, *,
          admission: bool = True) -> tuple[tf.Tensor, tf.Tensor | None, tf.Tensor, tf.Tensor]:
    """(row of each distinct key or -1 when not admitted, mask of keys with a row or None when all
    have one, keys given rows now, their rows): a training lookup of a table with a lifecycle."""
    life, index, capacity = table.lifecycle, table.index_variables(), table.capacity
    now = tick(table)
    rows, slots = key_index.lookup(index, keys)
    found = rows >= 0
    touched = touch(table, tf.boolean_mask(rows, found), now, None if counts is None else
                    tf.boolean_mask(counts, found)) if life.track_changes else []
    with tf.control_dependencies(touched):  # before an eviction looks for this step's rows
        missing = ~found
    new_keys, new_slots = tf.boolean_mask(keys, missing), tf.boolean_mask(slots, missing)
    new_counts = None if counts is None else tf.boolean_mask(counts, missing)
    placing = missing
    if admission and life.admits:
        ok = admit(table, new_keys, new_counts, now)
        new_keys, new_slots = tf.boolean_mask(new_keys, ok), tf.boolean_mask(new_slots, ok)
        new_counts = None if new_counts is None else tf.boolean_mask(new_counts, ok)
        placing = tf.tensor_scatter_nd_update(missing, tf.where(missing), ok)
    count = tf.size(new_keys, tf.int64)
    if life.evicts:
        need = count - (capacity - _v(table._size)) - _v(table._num_free)
        due = tf.constant(False)
        if life.eviction_policy == "ttl":
            due = now - _v(table._last_expiry) >= max(1, _ttl_units(life) // 4)
        want = tf.maximum(need, int(np.ceil(life.evict_fraction * capacity)))
        evicted = tf.cond((need > 0) | due, lambda: evict(table, tf.where(need > 0, want, 0), now),
                          lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([evicted]):  # tombstones or a rebuild may move the empty slots
            new_slots = tf.cond(evicted > 0, lambda: key_index.lookup(index, new_keys)[1], lambda: new_slots)
            free = _v(table._num_free)
    else:
        free = tf.constant(0, tf.int64)
    held = _v(table._size).read_value()
    check = tf.debugging.Assert(count <= capacity - held + free, [tf.strings.format(
        f"{table.name.replace('{', '{{').replace('}', '}}')}: vocabulary exhausted: {{}} new keys in this batch, "
        f"{{}} rows free of max_vocabulary_size_per_gpu={capacity}"
        + (" after eviction (one batch brings more distinct keys than the table holds)" if life.evicts else
           "; raise it, set an eviction_policy, or hash keys into fewer buckets"), (count, capacity - held + free))])
    with tf.control_dependencies([check]):
        reused = tf.minimum(count, free)
        from_free = _v(table._free_rows)[free - reused:free] if life.evicts else tf.zeros([0], tf.int64)
        new_rows = tf.concat([from_free, held + tf.range(count - reused)], 0)
        placed = key_index.insert(index, new_keys, new_rows, new_slots)
    with tf.control_dependencies([placed]):
        ops = [_v(table._size).assign_add(count - reused)]
        if life.evicts:
            ops += [_v(table._num_free).assign_sub(reused),
                    _v(table._row_fresh).scatter_update(tf.IndexedSlices(tf.ones([count], tf.bool), new_rows))]
        if life.track_changes:
            ops += touch(table, new_rows, now, new_counts)
    with tf.control_dependencies(ops):
        rows = tf.tensor_scatter_nd_update(rows, tf.where(placing), new_rows)
        return rows, (rows >= 0 if admission and life.admits else None), tf.identity(new_keys), new_rows


# ---------------------------------------------------------------------- on the host
def live_rows(table: Any, component: int = 0) -> np.ndarray:
    """Rows holding a key (a table that evicts has free rows among ``[0, size)``)."""
    size = int(table.index_variables(component).size.numpy())
    if table.lifecycle.evicts:
        return np.flatnonzero(table._row_seen.numpy()[:size] >= 0).astype(np.int64)
    return np.arange(size, dtype=np.int64)


def mark(table: Any) -> int:
    """The table's clock now: what `changed_since` and `evicted_since` compare with."""
    return int(table._clock.numpy()) if table.lifecycle.active else 0


def _tracked(table: Any) -> None:
    if not table.lifecycle.track_changes:
        raise ValueError(f"{table.name}: the table does not track changes; build it with track_changes=True "
                         "(or an eviction_policy) to export deltas")


def changed_since(table: Any, since: int) -> np.ndarray:
    """Rows whose vectors a training lookup (or `write`) touched after clock `since`."""
    _tracked(table)
    seen = table._row_seen.numpy()
    if table.indexed:
        seen = seen[:int(table._size.numpy())]
    return np.flatnonzero(seen > since).astype(np.int64)


def evicted_since(table: Any, since: int) -> np.ndarray:
    """Keys evicted after clock `since`, oldest first (a key may appear again if it came back)."""
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
    return keys[marks > since]


def reset(table: Any, marks: np.ndarray | None, counts: np.ndarray | None) -> None:
    """After a restore into rows ``0 .. n-1``: no free rows, no tombstones, an empty log; rows seen
    at their saved marks (else now), LFU counts as saved (else 0)."""
    life, n = table.lifecycle, int(table._size.numpy())
    if life.track_changes:
        now = int(table._clock.numpy())
        if marks is not None and len(marks):
            now = max(now, int(np.max(marks)))
            table._clock.assign(now)
        seen = np.full(table.capacity, -1, np.int64)
        seen[:n] = now if marks is None else marks
        table._row_seen.assign(seen)
    if life.eviction_policy == "lfu":
        count = np.zeros(table.capacity, np.int32)
        count[:n] = 0 if counts is None else counts
        table._row_count.assign(count)
    if life.evicts:
        table._row_fresh.assign(np.zeros(table.capacity, bool))
        for v in (table._num_free, table._tombstones, table._log_total):
            v.assign(0)
        table._log_floor.assign(int(table._clock.numpy()))
        table._last_expiry.assign(int(table._clock.numpy()))
