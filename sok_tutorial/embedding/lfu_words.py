"""An LFU row's word: the count and the mark (clock of its last training lookup) of one row of a
bucketed index (`sok_tutorial.embedding.buckets`) in one int64, so a touch or a score reads and
writes one value::

    word = count * 2**32 + mark + 1      (0: an empty row, count 0 and mark -1)

Counts decay lazily: a count halves once for each ``halflife`` epoch boundary since its mark,
computed when it is read (`decayed`); nothing ever sweeps the table. A row's score, the lowest
evicted first, is its decayed count in the high half and its mark in the low (`scores`), so the
older mark goes first on a tie. When every row read was marked in the epoch of the clock
(`this_epoch`), the count is the word's high half and the score the word less one, and no row's
epoch is computed.

Example:
    >>> import tensorflow as tf
    >>> w = word(tf.constant([3], tf.int64), tf.constant(7, tf.int64))
    >>> int(marks_of(w)[0]), int(counts_of_np(w.numpy())[0])
    (7, 3)
    >>> int(decayed(w, marks_of(w), tf.constant(2007, tf.int64), halflife=1000)[0])  # two boundaries later
    0
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

COUNT_MAX = 2**31 - 1  # counts are capped to int32's range, so a word stays below 2**63


def marks_of(words: tf.Tensor) -> tf.Tensor:
    """The marks in `words` (their low halves, less one: -1 for an empty row), int64."""
    return tf.bitwise.bitwise_and(words, tf.constant(0xFFFFFFFF, tf.int64)) - 1


def marks_of_np(words: np.ndarray) -> np.ndarray:
    """NumPy twin of `marks_of`."""
    return (np.asarray(words, np.int64) & 0xFFFFFFFF) - 1


def counts_of_np(words: np.ndarray) -> np.ndarray:
    """The counts in `words` as stored (decayed as of their marks)."""
    return np.asarray(words, np.int64) >> 32


def word(counts: tf.Tensor, now: tf.Tensor) -> tf.Tensor:
    """The words of rows seen at clock `now` with int64 `counts` (capped at `COUNT_MAX`)."""
    return tf.minimum(counts, COUNT_MAX) * (1 << 32) + (now + 1)


def words_np(counts: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """NumPy: the words of rows with `counts` (capped at `COUNT_MAX`) and `marks` (-1: empty, 0)."""
    marks = np.asarray(marks, np.int64)
    return np.where(marks >= 0, np.minimum(np.asarray(counts, np.int64), COUNT_MAX) * (1 << 32) + marks + 1, 0)


def this_epoch(marks: tf.Tensor, now: tf.Tensor, halflife: int) -> tf.Tensor:
    """Whether every one of `marks` is of an empty row (-1) or in the halflife epoch of `now`:
    as unsigned, -1 is above every clock, so one minimum tells."""
    start = now // halflife * halflife
    return tf.reduce_min(tf.bitcast(marks, tf.uint64)) >= tf.bitcast(start, tf.uint64)


def halved(words: tf.Tensor, marks: tf.Tensor, now: tf.Tensor, halflife: int) -> tf.Tensor:
    """The counts in `words` (their `marks` decoded) as of `now`, each row's epoch computed: halved
    once per halflife epoch boundary since the mark (an empty row has count 0: any shift leaves it
    0)."""
    since = now // halflife - marks // halflife
    return tf.bitwise.right_shift(tf.bitwise.right_shift(words, 32), tf.minimum(since, 62))


def decayed(words: tf.Tensor, marks: tf.Tensor, now: tf.Tensor, halflife: int) -> tf.Tensor:
    """`halved`, or, when every row was marked in the epoch of `now` (`this_epoch`), the words'
    high halves, with no row's epoch computed."""
    return tf.cond(this_epoch(marks, now, halflife), lambda: tf.bitwise.right_shift(words, 32),
                   lambda: halved(words, marks, now, halflife))


def scores(words: tf.Tensor, marks: tf.Tensor, now: tf.Tensor, halflife: int) -> tf.Tensor:
    """Each row's score: its decayed count in the high half and its mark in the low, so the lowest
    count goes first and the older mark on a tie (an empty row's is -1, below any row's). When every
    row was marked in the epoch of `now`, the score is the word less one: one pass over the rows
    instead of the epochs' arithmetic."""
    return tf.cond(this_epoch(marks, now, halflife), lambda: words - 1,
                   lambda: halved(words, marks, now, halflife) * (1 << 32) + marks)
