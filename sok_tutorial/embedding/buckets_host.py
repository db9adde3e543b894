"""The host half of a bucketed index (`sok_tutorial.embedding.buckets.BucketedIndex`): what exports,
deltas and checkpoints read and write outside the graph, in NumPy. Each row's mark and count
(`marks_np`, `counts_np`), the rows that hold a key (`live`), the ``"ttl"`` keys that have expired
(`expired`), and where keys go when a checkpoint is restored into an empty index (`arrange`, then
`load`): the slots depend on the keys and their priorities only, so a checkpoint of any layout
restores alike.

Example:
    >>> import tensorflow as tf
    >>> from sok_tutorial.embedding.buckets import BucketedIndex
    >>> index = BucketedIndex(capacity=8, width=4, policy="lru")
    >>> index.create(lambda name, shape, dtype, value: tf.Variable(tf.cast(tf.broadcast_to(value, shape), dtype)))
    >>> keys = np.array([10, 11, 12])
    >>> index.load(keys, index.arrange(keys, np.array([3, 2, 1])), np.array([3, 2, 1]), None)
    >>> sorted(zip(index.live()[1].tolist(), index.live()[2].tolist()))
    [(10, 3), (11, 2), (12, 1)]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sok_tutorial.embedding import lfu_words

EMPTY = -1  # the mark of a row without a key, and the slot `arrange` gives a key left out


class BucketsOnHost:
    """The host methods of `sok_tutorial.embedding.buckets.BucketedIndex`, which holds what they use:
    the variables ``keys`` and ``marks``, ``capacity``, ``width``, ``num_buckets``, ``packed``,
    ``ttl`` and ``mark_dtype``, and ``bucket_np`` and ``empty_keys``."""

    keys: Any
    marks: Any
    capacity: int
    width: int
    num_buckets: int
    packed: bool
    ttl: int | None
    mark_dtype: Any

    def marks_np(self, values: np.ndarray | None = None) -> np.ndarray:
        """Each row's mark (-1: empty), int64: of `values` read from ``marks``, or of all rows."""
        values = (self.marks.numpy() if values is None else np.asarray(values)).astype(np.int64)
        return lfu_words.marks_of_np(values) if self.packed else values

    def counts_np(self, values: np.ndarray) -> np.ndarray:
        """``"lfu"``: the counts in `values` read from ``marks``, as stored (decayed as of their mark)."""
        return lfu_words.counts_of_np(values)

    def live(self, now: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, keys, marks) of the rows holding a key (not expired at clock `now`), row order."""
        marks = self.marks_np()
        held = marks >= 0
        if self.ttl is not None and now is not None:
            held &= now - marks.astype(np.int64) <= self.ttl
        rows = np.flatnonzero(held).astype(np.int64)
        return rows, self.keys.numpy().reshape(-1)[rows], marks[rows]

    def expired(self, since: int, now: int) -> np.ndarray:
        """``"ttl"``: keys alive at clock `since` that have expired by `now` (still in their slots)."""
        if self.ttl is None:
            return np.zeros(0, np.int64)
        marks = self.marks.numpy().astype(np.int64)
        gone = (marks >= 0) & (marks >= since - self.ttl) & (marks < now - self.ttl)
        return self.keys.numpy().reshape(-1)[gone]

    def arrange(self, keys: np.ndarray, priority: np.ndarray) -> np.ndarray:
        """Where `keys` (distinct) go when loaded into an empty index: the slot of each key, -1 for a
        key its bucket had no room for; the higher `priority` first within a bucket, then the smaller
        key (so the slots do not depend on the order given: a checkpoint of any layout restores alike)."""
        bucket = self.bucket_np(keys)
        order = np.lexsort((np.asarray(keys, np.int64), -np.asarray(priority, np.int64), bucket))
        ranked = bucket[order]
        starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]]) if len(keys) else np.zeros(0, np.int64)
        rank = np.arange(len(keys)) - np.repeat(starts, np.diff(np.r_[starts, len(keys)]))
        slots = np.full(len(keys), EMPTY, np.int64)
        slots[order] = np.where(rank < self.width, ranked * self.width + rank, EMPTY)
        return slots

    def load(self, keys: np.ndarray, slots: np.ndarray, marks: np.ndarray, counts: np.ndarray | None) -> None:
        """Replace the index with `keys` at `slots` (from `arrange`; -1: left out)."""
        kept = slots >= 0
        row_keys, row_marks = self.empty_keys(), np.full(self.capacity, EMPTY, np.int64)
        row_keys[slots[kept]], row_marks[slots[kept]] = keys[kept], marks[kept]
        shape = (self.num_buckets, self.width)
        self.keys.assign(row_keys.reshape(shape))
        if self.packed:
            row_counts = np.zeros(self.capacity, np.int64)
            row_counts[slots[kept]] = 0 if counts is None else counts[kept]
            self.marks.assign(lfu_words.words_np(row_counts, row_marks))
        else:
            self.marks.assign(row_marks.astype(self.mark_dtype.as_numpy_dtype))
