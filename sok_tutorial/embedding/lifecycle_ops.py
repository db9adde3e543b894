"""The TensorFlow half of a table's lifecycle state (`sok_tutorial.embedding.lifecycle_state`): a
training lookup's clock tick, row marks, admission and the eviction log, all inside the step's graph.

Two entry points give the rows of a training lookup's distinct keys: `LifecycleOps.place_bucketed`
for a table with an eviction policy (its `sok_tutorial.embedding.buckets.BucketedIndex` evicts
inside the insert), `LifecycleOps.place_open` for one that only admits or tracks changes (the
open-addressing index of `sok_tutorial.embedding.index`, which never drops a key).

Every variable is read through ``.value``: under a strategy that is the replica's own copy, so
each replica runs these ops on its shard's state.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from sok_tutorial.embedding import index as key_index
from sok_tutorial.embedding.ops import masked, read_elements, read_rows, take, tf_variable, updated

SALTS = (0x2545F4914F6CDD1D, 0x5851F42D4C957F2D, 0x14057B7EF767814F, 0x9E3779B97F4A7C15 - (1 << 64),
          0x6C8E9CF570932BD5, 0x1B03738712FAD5C9, 0x0E9C8D5F3B3A6F27, 0x7F4A7C159E3779B9)
SKETCH_SAMPLE = 10  # the sketch halves after this many counts per row of capacity (TinyLFU's reset),
SKETCH_FILL = 1.0  # or once this many keys per counter of a row have entered it since its last halving
SKETCH_MAX = 2048  # a sketch counter's largest value: float16 holds every integer up to it
_STEP_CLOCK_LIMIT = 2**31 - 2  # a step clock is kept in int32 marks


def _cells(keys: tf.Tensor, depth: int, width: int) -> tf.Tensor:
    """Sketch counter of each key in each row of the sketch: ``[depth, n]`` flat indices."""
    bits = width.bit_length() - 1
    return tf.stack([key_index.home_slots(tf.bitwise.bitwise_xor(keys, tf.constant(SALTS[d], tf.int64)), bits)
                     + d * width for d in range(depth)])


class LifecycleOps:
    """The graph methods of `sok_tutorial.embedding.lifecycle_state.LifecycleState`, which holds the
    variables they use (``clock``, ``row_seen``, ``row_fresh``, ``unplaced``, the eviction log, the
    sketch) and ``options``, ``capacity``, ``name`` and ``buckets``."""

    options: Any
    capacity: int
    name: str
    buckets: Any

    def tick(self) -> tf.Tensor:
        """Advance the clock (one training lookup, or the wall clock in ms) and return it.

        A wall clock moves at least 1 ms a lookup, so that no two lookups share a mark (a step tells
        its own rows from the last step's by the mark)."""
        if self.options.wall_clock:
            clock = tf_variable(self.clock)
            return clock.assign(tf.maximum(tf.cast(tf.timestamp() * 1000.0, tf.int64), clock + 1))
        now = tf_variable(self.clock).assign_add(1)
        if self.options.evicts:  # the bucketed index keeps step marks in int32
            check = tf.debugging.Assert(now <= _STEP_CLOCK_LIMIT, [f"{self.name}: the table's step clock passed "
                                                                     f"{_STEP_CLOCK_LIMIT} training lookups"])
            with tf.control_dependencies([check]):
                now = tf.identity(now)
        return now

    def now(self) -> tf.Tensor:
        """The clock an inference lookup judges expiry by: the last training lookup's, or for a wall
        clock the time now, whichever is later."""
        now = tf_variable(self.clock).read_value()
        if self.options.wall_clock:
            now = tf.maximum(now, tf.cast(tf.timestamp() * 1000.0, tf.int64))
        return now

    def touch(self, rows: tf.Tensor, now: tf.Tensor) -> list[Any]:
        """Mark `rows` (distinct) seen at `now` (a table without a policy that tracks changes)."""
        return [tf_variable(self.row_seen).scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), now), rows))]

    def fresh_rows(self, rows: tf.Tensor) -> tf.Tensor | None:
        """Which of `rows` (distinct) went to a new key since an optimizer last updated them, clearing
        the mark; None for a table that never gives a row a second key."""
        if self.row_fresh is None:
            return None
        fresh = tf_variable(self.row_fresh)
        marked = read_elements(fresh, rows)
        with tf.control_dependencies([marked]):
            cleared = fresh.scatter_update(tf.IndexedSlices(tf.zeros_like(marked), rows))
        with tf.control_dependencies([cleared]):
            return tf.identity(marked)

    def admit(self, keys: tf.Tensor, counts: tf.Tensor | None, now: tf.Tensor,
              gate: Callable[[tf.Tensor], list[Any]] | None = None) -> tf.Tensor:
        """Which of the new distinct `keys` get a row now (counting them first). `gate`, given that
        decision (made from reads alone), returns ops that the sketch's writes wait for (a check
        that the admitted keys fit, so that a batch refused counts nothing); the decision then
        comes back without waiting for the writes.

        Keys are counted in a count-min sketch with conservative update: a key's estimate is the
        least of its cells plus its occurrences in this step, and only its cells below that rise to
        it (one scatter of about one cell per key instead of ``sketch_depth``; the estimate still
        never falls below the key's true count, up to the counters' `SKETCH_MAX`). The sketch halves
        every ``SKETCH_SAMPLE * capacity`` counts, so what was seen long ago fades, and sooner once
        ``SKETCH_FILL * sketch_width`` keys it had no count for have come in since the last halving:
        each sets about one counter of every row, so that by then about two thirds of a row's
        counters hold a count, and a key seen once finds all its counters taken by others, and
        passes as seen before, with a chance of about (2/3) ** depth; it would only grow from there
        (a halving is one pass over the sketch, amortized over that many counts or keys)."""
        life = self.options
        ok = tf.ones(tf.shape(keys), tf.bool)
        if life.admit_probability < 1:
            salt = tf.bitwise.bitwise_xor(keys, now * tf.constant(0x9E3779B97F4A7C15 - (1 << 64), tf.int64))
            draw = tf.cast(key_index.home_slots(salt, 24), tf.float64) / float(1 << 24)
            ok &= draw < life.admit_probability
        if life.min_count <= 1:
            return ok
        cells = _cells(keys, life.sketch_depth, life.sketch_width)  # (depth, n)
        sketch = tf_variable(self.sketch)
        values = tf.cast(read_rows(sketch, cells), tf.int32)
        before = tf.reduce_min(values, axis=0)
        seen = before + tf.cast(counts, tf.int32)  # this step's sightings included
        ok &= seen >= life.min_count
        with tf.control_dependencies([] if gate is None else gate(ok)):
            # conservative update: only the cells below a key's new estimate rise, to it (a cell at the
            # minimum, usually one of the depth), so a key's estimate never falls below its count
            # (flat, depth-major), the cells raised to 1 apart: the counters of keys new to the sketch
            low, one = values < seen[None], tf.equal(seen, 1)[None]
            to_one = tf.where(tf.reshape(low & one, [-1]))[:, 0]
            higher = tf.where(tf.reshape(low & ~one, [-1]))[:, 0]
            flat_cells, stored = tf.reshape(cells, [-1]), tf.cast(tf.minimum(seen, SKETCH_MAX), sketch.dtype)
            counted = self._raise(sketch, take(flat_cells, to_one), take(flat_cells, higher),
                                  take(stored, higher % tf.size(seen, tf.int64)))
            added = tf_variable(self.sketch_added).assign_add(tf.reduce_sum(tf.cast(counts, tf.int64)))
            entered = tf_variable(self.sketch_keys).assign_add(tf.math.count_nonzero(before == 0, dtype=tf.int64))
        with tf.control_dependencies([counted]):
            halve = (added >= SKETCH_SAMPLE * self.capacity) | (entered >= int(SKETCH_FILL * life.sketch_width))
            halved = tf.cond(halve, self._halve, lambda: tf.constant(False))
        if gate is not None:
            return ok
        with tf.control_dependencies([halved]):
            return tf.identity(ok)

    @staticmethod
    def _raise(sketch: Any, ones: tf.Tensor, cells: tf.Tensor, values: tf.Tensor) -> tf.Operation:
        """``sketch[ones] = 1``, then ``sketch[cells] = max(sketch[cells], values)`` for `values` (above
        1) above what the cells hold, as a scatter_max would, at the cost of an assignment: each cell
        takes one of its values, a read back finds the cells where a larger value of another key lost
        (two keys of one cell, a few), and only those take the max. (TensorFlow's CPU scatter_max
        costs several times an assignment.) The cells raised to 1 (the counters of keys new to the
        sketch, most of them) need no read back: any value written there after them is larger."""
        with tf.control_dependencies([sketch.scatter_update(tf.IndexedSlices(tf.ones_like(ones, values.dtype), ones))]):
            written = sketch.scatter_update(tf.IndexedSlices(values, cells))
        with tf.control_dependencies([written]):
            lost = tf.where(read_rows(sketch, cells) < values)[:, 0]
        return sketch.scatter_max(tf.IndexedSlices(take(values, lost), take(cells, lost)))

    def _halve(self) -> tf.Tensor:
        sketch = tf_variable(self.sketch)
        halved = tf.cast(tf.bitwise.right_shift(tf.cast(sketch, tf.int32), 1), sketch.dtype)  # (exact integers)
        with tf.control_dependencies([sketch.assign(halved),
                                      tf_variable(self.sketch_added).assign(0),
                                      tf_variable(self.sketch_keys).assign(0)]):
            return tf.constant(True)

    def _log(self, keys: tf.Tensor, now: tf.Tensor) -> None:
        """Append evicted `keys` to the ring buffer; remember the newest mark the buffer lets go."""
        size = self.options.eviction_log
        total, n = tf_variable(self.log_total), tf.size(keys, tf.int64)
        keys, n_kept = keys[-size:], tf.minimum(n, size)
        at = (total + n - n_kept) % size + tf.range(n_kept)  # (one division: at most one wrap past the end)
        at = tf.where(at >= size, at - size, at)
        overwritten = tf.maximum(total + n - size, 0)  # entries [0, overwritten) are gone afterwards
        newest_lost = tf.where(n > size, now, read_rows(self.log_marks, (overwritten - 1) % size))
        floor = tf_variable(self.log_floor)
        lost = tf.where(overwritten > 0, tf.maximum(newest_lost, floor), floor)
        with tf.control_dependencies([lost]):
            floor.assign(lost)
            tf_variable(self.log_keys).scatter_update(tf.IndexedSlices(keys, at))
            tf_variable(self.log_marks).scatter_update(tf.IndexedSlices(tf.fill([n_kept], now), at))
            total.assign_add(n)

    def place_bucketed(self, keys: tf.Tensor, counts: tf.Tensor | None, *,
                       admission: bool = True) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """(row of each distinct key or -1, mask of keys with a row, keys to write initial values for,
        their rows): a training lookup of a table with an eviction policy."""
        now = self.tick()
        screen = (lambda new, c: self.admit(new, c, now)) if admission and self.options.admits else None
        placed = self.buckets.place(keys, counts, now, screen)
        # the log, the count and the fresh marks are written beside the step, not before its lookups
        # (`BucketedIndex.place`)
        self._log(placed.evicted, now)
        tf_variable(self.unplaced).assign_add(placed.unplaced)
        tf_variable(self.row_fresh).scatter_update(tf.IndexedSlices(tf.ones(tf.shape(placed.new_rows), tf.bool),
                                                                    placed.new_rows))
        return placed.rows, placed.rows >= 0, placed.new_keys, placed.new_rows

    def place_open(self, index: key_index.IndexVariables, keys: tf.Tensor, counts: tf.Tensor | None, *,
                   admission: bool = True) -> tuple[tf.Tensor, tf.Tensor | None, tf.Tensor, tf.Tensor]:
        """(row of each distinct key or -1 when not admitted, mask of keys with a row or None when all
        have one, keys given rows now, their rows): a training lookup of a table without an eviction
        policy that admits or tracks changes, in the open-addressing `index`. A key never loses its
        row; a full table raises `sok_tutorial.embedding.index.VocabularyExhausted` as a plain one does."""
        life, capacity = self.options, self.capacity
        clock = tf_variable(self.clock)
        now = clock.read_value() + 1  # this lookup's tick, written once the batch is known to fit
        rows, slots = key_index.lookup(index, keys)
        found = rows >= 0
        missing = ~found
        new_keys, new_slots = masked(keys, missing), masked(slots, missing)
        placing = missing
        held = index.size.read_value()

        def exhausted(name: str, count: Any, free: Any) -> str:
            return (f"{name}: vocabulary exhausted: {count} new keys in this batch, {free} rows free of "
                    f"max_vocabulary_size_per_gpu={capacity}; raise it, set an eviction_policy, or hash keys into "
                    "fewer buckets")

        checks = []

        def fits(admitted: tf.Tensor | None = None) -> list[Any]:
            """The check that the batch's admitted new keys fit, made before anything is written."""
            count = tf.size(new_keys if admitted is None else masked(new_keys, admitted), tf.int64)
            if tf.executing_eagerly() and int(count) > capacity - int(held):
                raise key_index.VocabularyExhausted(exhausted(self.name, int(count), capacity - int(held)))
            template = exhausted(self.name.replace("{", "{{").replace("}", "}}"), "{}", "{}")
            checks.append(tf.debugging.Assert(count <= capacity - held,
                                              [tf.strings.format(template, (count, capacity - held))]))
            return checks

        if admission and life.admits:
            ok = self.admit(new_keys, None if counts is None else masked(counts, missing), now, gate=fits)
            new_keys, new_slots = masked(new_keys, ok), masked(new_slots, ok)
            placing = updated(missing, tf.where(missing)[:, 0], ok)
        if not checks:  # (no sketch to count in: the check of the keys admitted, `new_keys` by now)
            fits()
        count = tf.size(new_keys, tf.int64)
        with tf.control_dependencies(checks):
            written = [clock.assign(now), *(self.touch(masked(rows, found), now) if life.track_changes else [])]
            new_rows = held + tf.range(count)
        with tf.control_dependencies(written):
            placed = key_index.insert(index, new_keys, new_rows, new_slots)
        with tf.control_dependencies([placed]):
            index.size.assign_add(count)
            if life.track_changes:
                self.touch(new_rows, now)
        # (the rows do not wait for the insert: `sok_tutorial.embedding.index.lookup_or_insert`)
        rows = updated(rows, tf.where(placing)[:, 0], new_rows)
        return rows, (rows >= 0 if admission and life.admits else None), new_keys, new_rows
