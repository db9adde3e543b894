"""The TensorFlow ops of a table's lifecycle (`sok_tutorial.embedding.lifecycle`): a training
lookup's clock tick, row marks, admission, eviction and index rebuild, all inside the step's graph.

`place` is the entry point: the rows of a training lookup's distinct keys, after admitting new
keys and evicting rows to make room for them.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from sok_tutorial.embedding import index as key_index

BINS = 4096  # score histogram of an eviction: rows older (or rarer) than this share the last bin
_TOMBSTONE = -2
SALTS = (0x2545F4914F6CDD1D, 0x5851F42D4C957F2D, 0x14057B7EF767814F, 0x9E3779B97F4A7C15 - (1 << 64),
          0x6C8E9CF570932BD5, 0x1B03738712FAD5C9, 0x0E9C8D5F3B3A6F27, 0x7F4A7C159E3779B9)


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
    return tf.stack([key_index.home_slots(tf.bitwise.bitwise_xor(keys, tf.constant(SALTS[d], tf.int64)), bits)
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
        return tf.minimum(age * 1024 // (life.ttl_units + 1), BINS - 1)
    return tf.minimum(age, BINS - 1)


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
            due = now - _v(table._last_expiry) >= max(1, life.ttl_units // 4)
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
