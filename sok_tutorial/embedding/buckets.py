"""The bucketed key index of a table that forgets: a key's row is its slot, and eviction happens
inside the insert, within the key's own bucket.

A table with an ``eviction_policy`` splits its rows into buckets of ``bucket_capacity`` (W)
slots; a key may only live in the bucket its hash picks, and the slot it takes *is* its row of
the embedding variable. The index is::

    keys   [buckets, W] int64  the key held by each row, a bucket per row of the variable, so one
                               gather reads a key's whole bucket (W = 8: one 64-byte cache line)
    marks  [capacity] int32    clock of each row's last training lookup; -1: empty
           [capacity] int64    "lfu": the mark and the row's count in one word, ``count * 2**32 +
                               mark + 1`` (0: empty), so a touch or a new key's score reads and
                               writes one value; the count is halved each lfu_halflife steps (lazily;
                               `sok_tutorial.embedding.lfu_words`)

An empty row holds a key of another bucket, which no lookup of this bucket can match, so every
int64 is a key and a lookup needs no marks (a one-bucket table, which has no other bucket, checks
them). That is 12 bytes of index per row (16 with ``"lfu"``; marks in int64 with
``ttl_seconds``, whose clock counts milliseconds), against 24 for the open-addressing index of
tables without a policy (`sok_tutorial.embedding.index`). There is no row list, free list,
tombstone or rebuild.

A training step touches memory in proportion to its keys, never to the capacity:

1. *lookup*: one gather of each key's bucket of keys, a compare, and the mark of the row found;
2. *touch*: the hits' marks become the step's clock (``"lfu"`` adds their counts);
3. *insert*: each new key takes the lowest-scored row of its bucket that no key of this step
   holds; several new keys in one bucket take its rows in score order (the first new key in the
   step's order the lowest). Scores: ``"lru"`` and ``"ttl"`` the mark (an empty row scores -1,
   so it goes first); ``"lfu"`` the decayed count, ties to the older mark. A key that finds every
   row of its bucket taken by this step's keys gets no row this step: it embeds to zeros, as a
   key not yet admitted does, and is counted (`unplaced`). The previous holders of the rows taken
   come back from the same call, for the eviction log and deltas; the buckets that took keys are
   written back as whole rows of ``keys``. While the table fills (a sample of the step's new keys
   mostly finds empty rows), a key whose bucket has an empty row for it takes it from the keys the
   lookup read (an empty row holds its bucket's empty key), and only the others read marks. The
   marks of the new keys' buckets are read element by element, or, where the table holds at most
   `ops.COPY_PER_GATHERED` (32) times the marks that reads, as one copy of all of them viewed as rows
   (`read_spans`): whichever costs less, so the read stays bounded by the step's new keys.

``"ttl"`` expires lazily: a hit older than ``ttl`` counts as absent; a training lookup gives the
key its own slot back with a fresh initial value, and until then exports and inference skip it.
``"lfu"`` decays lazily: a count halves once for each ``lfu_halflife`` epoch boundary since it
was last touched, computed when it is read; nothing ever sweeps the table.

Bucket-local eviction is an approximation of global LRU (a bucket's oldest key goes, not the
table's); ``benchmarks/embedding.py --group eviction`` measures the hit rates side by side. The
design follows NVIDIA HierarchicalKV (buckets with a score per slot, eviction inside the upsert)
and TorchRec's MPZCH (eviction within a window of slots).

Example:
    >>> import tensorflow as tf
    >>> index = BucketedIndex(capacity=8, width=4, policy="lru")
    >>> index.create(lambda name, shape, dtype, value: tf.Variable(tf.cast(tf.broadcast_to(value, shape), dtype)))
    >>> placed = index.place(tf.constant([10, 11, 12], tf.int64), None, tf.constant(1, tf.int64))
    >>> sorted(index.live()[1].tolist())
    [10, 11, 12]
    >>> (index.lookup(tf.constant([11, 99], tf.int64), tf.constant(1, tf.int64)).numpy() >= 0).tolist()
    [True, False]
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from sok_tutorial.embedding import lfu_words
from sok_tutorial.embedding.bucket_search import first_in_group, nth_lowest, nth_true, position_in_row, rank_in_group
from sok_tutorial.embedding.buckets_host import EMPTY as _EMPTY
from sok_tutorial.embedding.buckets_host import BucketsOnHost
from sok_tutorial.embedding.dedup import mix_keys, mix_keys_np
from sok_tutorial.embedding.ops import kept, local_view, masked, read_rows, read_spans, take, tf_variable, updated

_INT64_MAX = np.iinfo(np.int64).max
_SAMPLE = 1024  # new keys whose buckets are checked for empty rows, to choose how a step places them


def bucket_of(keys: tf.Tensor, num_buckets: int) -> tf.Tensor:
    """Bucket of each int64 key in ``[0, num_buckets)``: the top 32 bits of a 64-bit mix, scaled
    to the bucket count by a multiply and shift (any count, not only powers of two); the mix is the
    key index's (`mix_keys`)."""
    top = tf.bitwise.right_shift(mix_keys(keys), tf.constant(32, tf.uint64))
    return tf.bitcast(tf.bitwise.right_shift(top * tf.constant(num_buckets, tf.uint64), tf.constant(32, tf.uint64)),
                      tf.int64)


def bucket_of_np(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    """NumPy twin of `bucket_of`."""
    s32 = np.uint64(32)
    with np.errstate(over="ignore"):
        return (((mix_keys_np(keys) >> s32) * np.uint64(num_buckets)) >> s32).astype(np.int64)


@dataclass
class Placed:
    """What a training lookup did: the row of each key (-1: none), the keys given a row with a fresh
    value (new, or a ``"ttl"`` key back after expiring) and their rows, the keys evicted to make
    room, and how many new keys found no slot."""

    rows: tf.Tensor
    new_keys: tf.Tensor
    new_rows: tf.Tensor
    evicted: tf.Tensor
    unplaced: tf.Tensor


class BucketedIndex(BucketsOnHost):
    """The index of the module docstring: `create` its variables, then `lookup` and `place` in the
    graph; `live`, `arrange` and `load` on the host (`sok_tutorial.embedding.buckets_host`).

    Args:
        capacity: rows, a whole number of buckets.
        width: slots of a bucket (``bucket_capacity``), a power of two (up to `lifecycle.MAX_BUCKET`).
        policy: ``"lru"``, ``"lfu"`` or ``"ttl"``.
        ttl: ``"ttl"``: the age (clock units) past which a key has expired.
        halflife: ``"lfu"``: steps per halving of the counts.
        mark_dtype: ``"int32"`` (step clock) or ``"int64"`` (millisecond clock).
        shards: the shards of one table that this index is one of (row-wise over replicas): a key's
            bucket of the whole table, ``g = bucket_of(key, shards * buckets)``, is bucket ``g //
            shards`` of shard ``g % shards`` (`owner_of`). The table of N shards then keeps every key
            in the bucket, and so decides every eviction, as one index of N times the capacity.
    """

    def __init__(self, capacity: int, width: int, policy: str, *, ttl: int | None = None, halflife: int = 1000,
                 mark_dtype: str = "int32", shards: int = 1):
        self.capacity, self.width, self.policy = int(capacity), int(width), policy
        self.num_buckets, self.shards = self.capacity // self.width, int(shards)
        self.ttl, self.halflife, self.mark_dtype = ttl, int(halflife), tf.as_dtype(mark_dtype)
        self.packed = policy == "lfu"  # marks hold the count too (module docstring)
        self.keys = self.marks = None

    def create(self, weight: Callable[[str, tuple, str, Any], Any]) -> None:
        """Make the variables with ``weight(name, shape, dtype, initial value)``: keys ``[buckets,
        W]`` (a bucket is read as one row), marks ``[capacity]`` (written per slot)."""
        self.keys = weight("row_keys", (self.num_buckets, self.width), "int64", self.empty_keys().reshape(
            self.num_buckets, self.width))
        if self.packed:
            self.marks = weight("row_seen_count", (self.capacity,), "int64", 0)
        else:
            self.marks = weight("row_seen", (self.capacity,), self.mark_dtype.name, _EMPTY)

    def local(self, component: int) -> BucketedIndex:
        """This index over one local copy of its (mirrored) variables: a replica's shard, on the host
        or outside ``strategy.run``."""
        return local_view(self, ("keys", "marks"), component)

    def bucket(self, keys: tf.Tensor) -> tf.Tensor:
        """The bucket of each key in its shard's index."""
        if self.shards == 1:
            return bucket_of(keys, self.num_buckets)
        return bucket_of(keys, self.num_buckets * self.shards) // self.shards

    def bucket_np(self, keys: np.ndarray) -> np.ndarray:
        """NumPy twin of `bucket`."""
        if self.shards == 1:
            return bucket_of_np(keys, self.num_buckets)
        return bucket_of_np(keys, self.num_buckets * self.shards) // self.shards

    def owner_of(self, keys: tf.Tensor) -> tf.Tensor:
        """The shard holding each key (int64): its bucket of the whole table, modulo the shards."""
        return bucket_of(keys, self.num_buckets * self.shards) % self.shards

    def owner_of_np(self, keys: np.ndarray) -> np.ndarray:
        """NumPy twin of `owner_of`."""
        return bucket_of_np(keys, self.num_buckets * self.shards) % self.shards

    def empty_keys(self) -> np.ndarray:
        """The key an empty slot holds: one whose bucket is another (so no lookup can match it), or
        with a single bucket 0 (its lookups also check the marks)."""
        keys = np.zeros(self.capacity, np.int64)
        if self.num_buckets == 1:
            return keys
        first, other = self._empty_pair
        keys[first * self.width:(first + 1) * self.width] = other
        return keys

    @functools.cached_property
    def _empty_pair(self) -> tuple[int, int]:
        """(the bucket of key 0, the key its empty slots hold): every other bucket's hold 0."""
        first = int(self.bucket_np(np.zeros(1, np.int64))[0])
        candidates = np.arange(1, 1 << 12, dtype=np.int64)  # one of these lands elsewhere (P(all in one) ~ 0)
        return first, int(candidates[np.argmax(self.bucket_np(candidates) != first)])

    def _empty_key(self, bucket: tf.Tensor) -> tf.Tensor:
        """The key the empty slots of each of the buckets `bucket` (int64) hold (`empty_keys`)."""
        first, other = self._empty_pair
        return tf.where(tf.equal(bucket, first), tf.constant(other, tf.int64), tf.constant(0, tf.int64))

    @property
    def bytes_per_row(self) -> int:
        """Index memory per row: key, mark and (``"lfu"``) count."""
        return 8 + (8 if self.packed else self.mark_dtype.size)

    # ------------------------------------------------------------------ in the graph
    def _find(self, keys: tf.Tensor, now: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """(bucket, the bucket's keys ``[n, W]``, row of each key or any, held, held and not expired)."""
        bucket = self.bucket(keys)
        held_keys = read_rows(self.keys, bucket)  # (n, W): one row per key
        match = tf.equal(held_keys, keys[:, None])
        if self.num_buckets == 1:  # no key of another bucket to mark empty slots with
            match &= self._marks_of(read_rows(self.marks, tf.range(self.width, dtype=tf.int64)))[None] >= 0
        position = position_in_row(match)
        held = position >= 0
        row = bucket * self.width + tf.maximum(position, 0)
        if self.ttl is None:  # (the mark of a hit matters to expiry only)
            return bucket, held_keys, row, held, held
        live = held & (now - tf.cast(read_rows(self.marks, row), tf.int64) <= self.ttl)
        return bucket, held_keys, row, held, live

    def lookup(self, keys: tf.Tensor, now: tf.Tensor) -> tf.Tensor:
        """Row of each of the 1-D int64 `keys`, or -1 (absent, or expired at clock `now`)."""
        _, _, row, _, live = self._find(keys, now)
        return tf.where(live, row, _EMPTY)

    def _marks_of(self, values: tf.Tensor) -> tf.Tensor:
        """The marks in `values` read from ``marks`` (``"lfu"``: their low word, less one), int64."""
        return lfu_words.marks_of(values) if self.packed else tf.cast(values, tf.int64)

    def place(self, keys: tf.Tensor, counts: tf.Tensor | None, now: tf.Tensor,
              admit: Callable[[tf.Tensor, tf.Tensor | None], tf.Tensor] | None = None) -> Placed:
        """A training lookup of the distinct `keys` (occurrences `counts`, needed by ``"lfu"``) at
        clock `now`: touch the held ones, give new ones a slot of their bucket. ``admit(keys,
        counts)`` of the absent keys says which may have one. Writes the index only; the caller
        writes the new rows' values."""
        if self.policy == "lfu" and counts is None:  # (a write, not a lookup: each key once)
            counts = tf.ones(tf.shape(keys), tf.int64)
        bucket, held_keys, row, held, live = self._find(keys, now)
        width, stamp = self.width, tf.cast(now, self.mark_dtype)
        hit = tf.where(held)[:, 0]
        hits = take(row, hit)  # expired "ttl" keys too: they take their own row back
        if self.packed:  # the count as of now plus this step's, and the mark, in one write
            old = read_rows(self.marks, hits)
            counts_now = lfu_words.decayed(old, self._marks_of(old), now, self.halflife)
            seen = lfu_words.word(counts_now + take(counts, hit), now)
        else:
            seen = tf.fill(tf.shape(hits), stamp)
        touched = [tf_variable(self.marks).scatter_update(tf.IndexedSlices(seen, hits))]
        new = tf.where(~held)[:, 0]
        if admit is not None:  # which of the absent keys may have a row
            new = masked(new, admit(take(keys, new), None if counts is None else take(counts, new)))
        new_keys, new_bucket = take(keys, new), take(bucket, new)
        # the new keys of one bucket: for each key the first of them in the step's order (`first`), the
        # keys that are first (`firsts`, one per bucket) and the others (`later`), and each key's rank
        # among them (W: no slot left)
        order = tf.range(tf.size(new, out_type=tf.int64))  # (each new key's place among them)
        first = first_in_group(tf.cast(new_bucket, tf.int32), self.num_buckets)
        later, firsts = tf.dynamic_partition(order, tf.cast(tf.equal(first, tf.range(tf.size(first))), tf.int32), 2)
        rank = rank_in_group(first, limit=width, later=later)  # (`later`: the keys ranked above 0)
        new_held = take(held_keys, new)  # (m, W): the keys of each new key's bucket, as the lookup read them
        if self.num_buckets > 1:
            # A key whose bucket has more empty rows than new keys before it takes the rank-th empty row
            # (empty rows score lowest, in row order), found in the keys the lookup read without reading
            # marks. Taken when a sample of the step's new keys says most find an empty row (a table
            # filling up); at capacity every key goes by marks, which also find empty rows.
            empty_key = self._empty_key(new_bucket)[:, None]
            sample = new[:_SAMPLE]
            empty_sample = tf.reduce_any(tf.equal(take(held_keys, sample), empty_key[:_SAMPLE]), 1)
            with tf.control_dependencies(touched):  # this step's hits are taken
                filling = 2 * tf.math.count_nonzero(empty_sample, dtype=tf.int32) > tf.size(sample, tf.int32)
            # the marks of every new key's bucket, read and scored apart from the ranks (so beside the
            # grouping, which they do not need); none while the table fills
            scored = tf.cond(filling, self._no_scores, lambda: self._scores(new_bucket, now))

            def with_empty_rows() -> tuple[tf.Tensor, tf.Tensor]:
                empty = tf.equal(new_held, empty_key)  # (m, W)
                at = nth_true(empty, rank)
                slow = tf.where(at < 0)[:, 0]
                ok, position, _ = self._by_marks(take(new_bucket, slow), take(rank, slow), now)
                position = updated(at, slow, tf.where(ok, position, -1))  # -1: no row (a quick key's is >= 0)
                return position >= 0, position

            ok, position = tf.cond(filling, with_empty_rows, lambda: self._choose(scored, rank, later)[:2])
            previous = []  # (a row held a key unless it holds its bucket's empty key: no marks needed)
        else:  # (a single bucket's empty rows hold a key like any other: marks tell)
            with tf.control_dependencies(touched):
                ok, position, marks_before = self._by_marks(new_bucket, rank, now)
            previous = [marks_before]
        # the new keys that take a row (placed: their index in `keys`): in a full table's step, all of them
        take_first, take_bucket, placed_keys, placed, position, placed_new, *previous = kept(
            ok, [first, new_bucket, new_keys, new, position, order, *previous])
        taken = take_bucket * width + tf.cast(position, tf.int64)
        # the key each row taken held, in its new key's bucket as the lookup read it (`placed_new`: the
        # key's place among the new keys)
        before = take(tf.reshape(new_held, [-1]), placed_new * width + tf.cast(position, tf.int64))
        evicting = previous[0] >= 0 if previous else tf.not_equal(before, self._empty_key(take_bucket))
        evicted = kept(evicting, [before])[0]
        # each bucket's keys after the step: the rows read, each new key in its slot of its bucket's
        # first new key's row, and those rows kept (a row per bucket)
        new_rows = updated(tf.reshape(new_held, [-1]), take_first * width + position, placed_keys)
        new_rows = take(tf.reshape(new_rows, [-1, width]), firsts)
        with tf.control_dependencies([evicted]):
            seen = lfu_words.word(take(counts, placed), now) if self.packed else tf.fill(tf.shape(taken), stamp)
            tf_variable(self.keys).scatter_update(tf.IndexedSlices(new_rows, take(new_bucket, firsts)))
            tf_variable(self.marks).scatter_update(tf.IndexedSlices(seen, taken))
        # (the rows do not wait for the writes: later reads of these variables follow them, as every
        # access to one variable in a function follows the one before, while the step's gathers run
        # beside them)
        rows = updated(tf.where(held, row, _EMPTY), placed, taken)
        if self.ttl is not None:  # expired keys back in their own rows: fresh values too
            renewed = tf.where(held & ~live)[:, 0]
            placed_keys = tf.concat([placed_keys, take(keys, renewed)], 0)
            taken = tf.concat([taken, take(row, renewed)], 0)
        return Placed(rows, placed_keys, taken, evicted, tf.size(new_keys, tf.int64) - tf.size(placed, tf.int64))

    def _by_marks(self, bucket: tf.Tensor, rank: tf.Tensor, now: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """For new keys of `bucket` with `rank` earlier new keys in it, each: (whether it may take a
        row, the row's position in its bucket, its mark before, -1 for empty, int64): the rank-th
        lowest-scored row, by the marks (read after this step's touches)."""
        return self._choose(self._scores(bucket, now), rank)

    def _scores(self, bucket: tf.Tensor, now: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(each row's priority ``[s, W]``, the higher taken first, its mark, the position of the
        highest in each bucket) of the rows of `bucket`: all of `_by_marks` that needs no ranks.

        A row that this step's keys hold has the priority floor (`_choose`), and is never taken; the
        lowest score goes first, the first of equals on a tie."""
        values = read_spans(self.marks, bucket, self.width)  # (s, W): each bucket's rows
        if self.packed:
            marks = self._marks_of(values)
            score = lfu_words.scores(values, marks, now, self.halflife)
            priority = tf.where(tf.not_equal(marks, now), -score, self._floor)
        else:  # "lru" and "ttl": the age, now less the mark (no mark is later than now): 0 for a row
            # this step's keys hold, the most for an empty row (mark -1), in one subtraction
            marks, priority = values, tf.cast(now, self.mark_dtype) - values
        # the first new key of a bucket: its highest (a top_k of one: the first of equals, as
        # tf.argmax has it, at about two thirds of tf.argmax's cost on a CPU)
        return priority, marks, tf.math.top_k(priority, 1)[1][:, 0]

    @property
    def _floor(self) -> int:
        """The priority of a row this step's keys hold (`_scores`), below every row that may be taken."""
        return -_INT64_MAX if self.packed else 0

    def _no_scores(self) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """`_scores` of no bucket (a step that finds its rows empty, as a filling table does)."""
        dtype = tf.int64 if self.packed else self.mark_dtype
        return tf.zeros([0, self.width], dtype), tf.zeros([0, self.width], dtype), tf.zeros([0], tf.int32)

    def _choose(self, scored: tuple[tf.Tensor, tf.Tensor, tf.Tensor], rank: tf.Tensor,
                later: tf.Tensor | None = None) -> tuple[tf.Tensor, ...]:
        """`_by_marks` from the `_scores` of the keys' buckets and their `rank` (`later`: where it is
        above 0, when known)."""
        priority, marks, position = scored
        width, floor = self.width, self._floor
        later = tf.where(rank > 0)[:, 0] if later is None else later  # the others: the rank-th lowest (few)
        position = updated(position, later, nth_lowest(-take(priority, later), take(position, later),
                                                       tf.minimum(take(rank, later), width - 1)))
        # the slot each key would take, flat in its [W] row; it may if that row's priority is above
        # `floor` (the rank-th highest is then free: the free rows sort first) and its rank is below W
        slot = tf.range(tf.size(rank), dtype=tf.int32) * width + position
        ok = (take(tf.reshape(priority, [-1]), slot) > floor) & (rank < width)
        return ok, position, tf.cast(take(tf.reshape(marks, [-1]), slot), tf.int64)
