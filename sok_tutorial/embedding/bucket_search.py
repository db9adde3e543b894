"""Searches within the rows of a bucketed index (`sok_tutorial.embedding.buckets`), as whole-batch
tensor ops with no Python per key: where the one matching slot of each row is
(`position_in_row`), where the n-th True of each row is (`nth_true`: a new key's empty row), which
element is the first of each element's group (`first_in_group`: the new keys of one bucket), how
many earlier elements share its group (`rank_in_group`: their order), and where the n-th lowest
element of each row is (`nth_lowest`: the row a later new key of a bucket takes).

Example:
    >>> import tensorflow as tf
    >>> position_in_row(tf.constant([[False, True, False, False, False, False, False, False]])).numpy().tolist()
    [1]
"""
from __future__ import annotations

import sys

import tensorflow as tf

from sok_tutorial.embedding.ops import masked, take, updated


def position_in_row(match: tf.Tensor) -> tf.Tensor:
    """Where the one True of each row of `match` ``[n, W]`` is, or -1 for none. Eight slots pack into
    the bytes of one uint64, whose only set byte (a 1 in byte ``k``) is the position: ``value - 1``
    then has ``8 k`` bits set. Slot ``k`` is byte ``k`` of the word on a little-endian host only; a
    big-endian one takes the maximum over the row's positions instead."""
    width = int(match.shape[1])
    if width % 8 or sys.byteorder != "little":
        return tf.reduce_max(tf.where(match, tf.range(width, dtype=tf.int64), -1), axis=1)
    words = tf.bitcast(tf.reshape(tf.cast(match, tf.uint8), [-1, width // 8, 8]), tf.uint64)  # (n, W / 8)
    word = tf.argmax(tf.cast(words != 0, tf.int32), axis=1, output_type=tf.int64) if width > 8 else \
        tf.zeros(tf.shape(words)[:1], tf.int64)
    value = words[:, 0] if width == 8 else tf.gather(words, word, batch_dims=1)
    byte = tf.bitwise.right_shift(tf.cast(tf.raw_ops.PopulationCount(x=value - 1), tf.int64), 3)  # (// 8)
    return tf.where(value != 0, word * 8 + byte, -1)


def nth_true(mask: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    """For every row of `mask` ``[k, W]``, the position of its ``n[row]``-th True counting from 0
    (int32), or -1 where there are not that many.

    Rows whose ``n`` is 0 (most) take their first True from the bytes of one word (`position_in_row`'s
    packing, on a little-endian host): ``v & -v`` keeps the lowest set bit; the others count their
    Trues in order."""
    width = int(mask.shape[1])
    enough = n < tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
    if width == 8 and sys.byteorder == "little":
        word = tf.bitcast(tf.cast(mask, tf.uint8), tf.uint64)  # (k,): slot i in byte i
        low = tf.bitwise.bitwise_and(word, tf.bitwise.invert(word) + 1)
        first = tf.bitwise.right_shift(tf.cast(tf.raw_ops.PopulationCount(x=low - 1), tf.int32), 3)  # (// 8)
        later = tf.where(enough & (n > 0))[:, 0]
        sub = take(mask, later)
        count = tf.cumsum(tf.cast(sub, tf.int32), axis=1)
        at = updated(first, later, tf.cast(position_in_row(sub & tf.equal(count, take(n, later)[:, None] + 1)),
                                           tf.int32))
    else:
        count = tf.cumsum(tf.cast(mask, tf.int32), axis=1)
        at = tf.cast(position_in_row(mask & tf.equal(count, n[:, None] + 1)), tf.int32)
    return tf.where(enough, at, -1)


#: `first_in_group` fills a dense array of its bound when that is at most this many times the elements:
#: filling one entry streams where ``tf.unique`` hashes each element into a map that, amid a training
#: step's other reads, misses the cache (``benchmarks/embedding.py --group eviction`` times the step)
DENSE_PER_ELEMENT = 32


def first_in_group(values: tf.Tensor, bound: int) -> tf.Tensor:
    """For each element of the 1-D int32 `values` (each in ``[0, bound)``), the index of the first
    element equal to it (int32): ``[4, 2, 4, 4] -> [0, 1, 0, 0]``; an element is the first of its
    group where the result equals its own index.

    One ``unsorted_segment_min`` of the element indices into a dense array of `bound` entries and a
    gather back, when `bound` is at most `DENSE_PER_ELEMENT` times the elements (a step's new keys
    and the buckets of its table); otherwise ``tf.unique``'s hash map first, so the work stays
    bounded by the elements, not by `bound`.

    Example:
        >>> first_in_group(tf.constant([4, 2, 4, 4]), 8).numpy().tolist()
        [0, 1, 0, 0]
    """
    n = tf.size(values)
    index = tf.range(n)

    def dense() -> tf.Tensor:
        return take(tf.math.unsorted_segment_min(index, values, bound), values)

    def hashed() -> tf.Tensor:
        _, group = tf.unique(values, out_idx=tf.int32)
        return take(tf.math.unsorted_segment_min(index, group, n), group)

    return tf.cond(bound <= DENSE_PER_ELEMENT * n, dense, hashed)


def rank_in_group(first: tf.Tensor, limit: int | None = None, later: tf.Tensor | None = None) -> tf.Tensor:
    """For each element, how many earlier elements share its group, at most `limit`, given the
    first element of each element's group (`first_in_group`): ``[1, 0, 1, 1]``'s ``first``, ``[0,
    1, 0, 0]`` -> ``[0, 0, 1, 2]``. `later`, if the caller has it: the elements that are not the
    first of their group, in order (those ranked 1 or more).

    In rounds, each settling the first pending element of every group: as many rounds as the
    largest group (or `limit`), and work in proportion to the elements still pending (no sort); an
    element's rank is the number of rounds it waited, counted once at the end."""
    n = tf.size(first)

    def body(pending: tf.Tensor, passed: tf.Tensor, rounds: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        group = take(first, pending)  # (groups named by their first element: segments in [0, n))
        later = masked(pending, tf.not_equal(take(tf.math.unsorted_segment_min(pending, group, n), group), pending))
        return later, tf.concat([passed, later], 0), rounds + 1

    start = tf.cast(tf.where(tf.not_equal(first, tf.range(n)))[:, 0] if later is None else later, tf.int32)
    last = tf.constant(n.dtype.max if limit is None else limit - 1, n.dtype)  # (the start counts one round)
    passed = tf.while_loop(lambda pending, _, rounds: (tf.size(pending) > 0) & (rounds < last), body,
                           [start, start, tf.constant(0, n.dtype)],
                           shape_invariants=[tf.TensorShape([None]), tf.TensorShape([None]), tf.TensorShape([])])[1]
    # an element's rank: the rounds it was still behind another of its group in
    return tf.math.bincount(passed, minlength=n, maxlength=n, dtype=tf.int32)


def nth_lowest(score: tf.Tensor, lowest: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    """The position of the `n`-th lowest element of each row of `score` ``[k, W]`` (integers;
    ``1 <= n < W``, counting from 0; equal elements in the order of their positions, as a stable
    sort has them), given the position of the lowest, `lowest` (int32; the first of equals, as
    ``tf.argmin`` gives it).

    Most rows want their second lowest (a bucket's second new key of the step): the lowest of the
    rest, once the lowest is set aside (the dtype's least value, in the negated scores), a
    ``top_k`` of one. Only the rows that want a later one sort the whole row.

    Example:
        >>> score = tf.constant([[5, 1, 1, 0], [3, 2, 9, 2]])
        >>> nth_lowest(score, tf.argmin(score, axis=1, output_type=tf.int32), tf.constant([2, 1])).numpy().tolist()
        [2, 3]
    """
    n = tf.cast(n, tf.int32)
    second, later = tf.where(tf.equal(n, 1))[:, 0], tf.where(n > 1)[:, 0]
    rows = -take(score, second)  # (top_k finds the largest: the lowest score, the first of equals)
    aside = tf.equal(tf.range(score.shape[1], dtype=tf.int32)[None], take(lowest, second)[:, None])
    found = tf.math.top_k(tf.where(aside, rows.dtype.min, rows), 1)[1][:, 0]
    order = tf.argsort(take(score, later), axis=1, stable=True)
    sorted_nth = tf.gather(order, take(n, later), batch_dims=1)
    return tf.dynamic_stitch([tf.cast(second, tf.int32), tf.cast(later, tf.int32)], [found, sorted_nth])
