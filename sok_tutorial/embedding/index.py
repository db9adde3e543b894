"""The key index of a dynamic embedding table, in the graph: any int64 key gets a row on first sight.

This is the index of a table that never drops a key (no eviction policy); a table with one has
the bucketed index of `sok_tutorial.embedding.buckets`. It is three variables of the table (of
each shard, when the table is sharded)::

    slots      [S, 2] int64      open addressing: the (key, row) in each slot, row -1 for empty
    row_keys   [capacity] int64  the key of each row; rows 0 .. size-1 are in use
    size       [] int64          rows in use; a new key gets row ``size``

``S`` is the power of two at least twice the capacity, so at most half the slots are ever full.
A key's home slot is the top bits of a 64-bit mix of the key, and collisions probe the following
slots (linear probing). Emptiness lives in the row half of a slot and no key value is reserved:
``0``, negatives, ``-2**63`` and ``2**63 - 1`` are keys like any other. A slot holds its key
beside its row, so a lookup reads one 16-byte slot, one cache line, where a slot holding only
the row would need a second read (of ``row_keys``, at a row found first) to tell its key apart
from another's. That costs ``16 * S / capacity + 8`` bytes per row, 40 to 72 from 4 rows up;
``row_keys`` serves exports (the key of each row) and the input pipeline's lookups
(`sok_tutorial.embedding.table_ahead`), never a step's own lookup. Everything is TensorFlow ops
on TensorFlow variables, so the index works in ``model.fit``, in ``tf.function``, under
``tf.distribute`` (its variables are mirrored; each replica writes its own copy), and it is saved
with the table by checkpoints and SavedModels.

A lookup probes all keys at once: one gather of their home slots settles most keys, and the few
that collided probe on in a ``tf.while_loop`` over the shrinking rest. New keys (distinct,
absent) take rows ``size, size + 1, ...`` in the order given, and each claims the empty slot its
lookup ended on, writing its key and row there. When several new keys claim one slot, one scatter
decides, a gather back tells each key whether it won, and the losers probe on.

``benchmarks/embedding.py`` (``index`` cases) times this index beside TensorFlow's two
lookup-table resources, ``tf.lookup.experimental.DenseHashTable`` and ``MutableHashTable``, on
each step's distinct keys of the torchrec_shape workload; the README has the figures. On a CPU
``DenseHashTable`` runs no faster than this one. The choice rests on what the two resources
cannot do: they have CPU kernels only (on a GPU, keys would cross to the host and rows back
every step), ``DenseHashTable`` reserves two sentinel keys, and both live outside
``tf.distribute``'s variables, so every replica would need a resource of its own and
checkpoints a second path.

Rows are handed out in order of first sight (within each of the four parts a large batch is
deduplicated in, `sok_tutorial.embedding.dedup.distinct`), so the rows a step touches sit in the
front of the table, hot keys first, rather than spread over all of it: gathering and scattering
them is cheaper than in a static table with the same keys. What a dynamic table costs against a
static one, once its keys have rows (``dynamic_warm``) and in the first steps, when most of a
step's keys are new and get rows and initial vectors, is in the ``torchrec_shape`` cases of the
same benchmark and in the README.

On a GPU every op here has a GPU kernel (gathers, scatters, bitwise arithmetic on uint64,
``tf.where``). What crosses to the host is the control flow: the size of each
``tf.where``/``tf.boolean_mask`` result and the condition of each ``tf.while_loop`` round, a
few bytes at a time, never keys or rows.

Example:
    >>> index = IndexVariables.create(capacity=4)
    >>> rows, new_keys, _ = lookup_or_insert(index, tf.constant([42, -7, 2**63 - 1], tf.int64), 4, "demo")
    >>> rows.numpy().tolist(), int(index.size.numpy())
    ([0, 1, 2], 3)
    >>> lookup(index, tf.constant([-7, 5], tf.int64))[0].numpy().tolist()
    [1, -1]
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.dedup import mix_keys
from sok_tutorial.embedding.ops import masked, read_rows, take, updated

_EMPTY = -1


class VocabularyExhausted(tf.errors.InvalidArgumentError):
    """A dynamic table has no row left for a new key.

    Raised as this class when the table is called eagerly; inside a graph (``tf.function``,
    ``model.fit``) TensorFlow raises it as its `tf.errors.InvalidArgumentError`, this class's
    base, with the same message. Nothing is written in either case.
    """

    def __init__(self, *args: Any):
        # (message), or TensorFlow's (node_def, op, message, ...) when Keras re-raises it with context
        super().__init__(*((None, None, *args) if len(args) == 1 else args))


def num_slots(capacity: int) -> int:
    """Slots of the index of a table of `capacity` rows: a power of two, at least twice as many."""
    return 1 << max(3, math.ceil(math.log2(2 * capacity)))


def index_bytes(capacity: int) -> int:
    """Bytes of the slots (key and row, 16 a slot) and row keys (8 a row) of a table of `capacity`
    rows; the ``size`` scalar aside."""
    return 16 * num_slots(capacity) + 8 * capacity


@dataclass
class IndexVariables:
    """The index's state (see the module docstring); ``slots.shape[0]`` is a power of two."""

    slots: Any
    row_keys: Any
    size: Any

    @classmethod
    def create(cls, capacity: int) -> IndexVariables:
        """Fresh tf.Variables (a table creates its own through Keras; this serves tests and examples)."""
        return cls(tf.Variable(empty_slots(num_slots(capacity))),
                   tf.Variable(tf.zeros([capacity], tf.int64)), tf.Variable(tf.constant(0, tf.int64)))

    @property
    def bits(self) -> int:
        return int(self.slots.shape[0]).bit_length() - 1


def empty_slots(count: int) -> tf.Tensor:
    """``[count, 2]`` int64 slots holding no key (every element -1: the row half says empty)."""
    return tf.fill([count, 2], tf.constant(_EMPTY, tf.int64))


def slots_of_rows(slot_rows: Any, row_keys: Any) -> np.ndarray:
    """The ``[S, 2]`` slots of an index saved as ``slot_rows`` ``[S]`` (the row in each slot, -1 for
    empty) beside its ``row_keys``: NumPy arrays of an index of the earlier format, each slot's key
    put back beside its row. Every key stays in the slot it had."""
    slot_rows, row_keys = np.asarray(slot_rows, np.int64), np.asarray(row_keys, np.int64)
    held = slot_rows >= 0
    keys = np.where(held, row_keys[np.where(held, slot_rows, 0)], _EMPTY)
    return np.stack([keys, slot_rows], 1)


def home_slots(keys: tf.Tensor, bits: int) -> tf.Tensor:
    """Start slot of each key: the top `bits` bits of its 64-bit mix (`mix_keys`)."""
    return tf.bitcast(tf.bitwise.right_shift(mix_keys(keys), tf.constant(64 - bits, tf.uint64)), tf.int64)


def _probe(index: IndexVariables, keys: tf.Tensor, slots: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(row in each slot, whether it holds the key): one read of each slot, its key and row."""
    held, rows = tf.unstack(read_rows(index.slots, slots), axis=1)
    return rows, (rows >= 0) & tf.equal(held, keys)


def lookup(index: IndexVariables, keys: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(row of each key or -1, its slot: where it is, or the empty slot where it would go).

    `keys` is 1-D int64; repeated keys are fine (each is looked up).
    """
    keys = tf.convert_to_tensor(keys, tf.int64)
    mask = tf.constant((1 << index.bits) - 1, tf.int64)
    slots = home_slots(keys, index.bits)
    row, hit = _probe(index, keys, slots)
    rows = tf.where(hit, row, _EMPTY)
    pending = tf.where(~hit & (row != _EMPTY))[:, 0]  # another key sits there: probe on

    def body(pos: tf.Tensor, at: tf.Tensor, done: tf.Tensor, found: tf.Tensor, ended: tf.Tensor) -> tuple:
        at = (at + 1) & mask
        row, hit = _probe(index, take(keys, pos), at)
        end = hit | (row == _EMPTY)
        return (masked(pos, ~end), masked(at, ~end), tf.concat([done, masked(pos, end)], 0),
                tf.concat([found, masked(tf.where(hit, row, _EMPTY), end)], 0),
                tf.concat([ended, masked(at, end)], 0))

    none = tf.zeros([0], tf.int64)
    _, _, done, found, ended = tf.while_loop(
        lambda pos, *_: tf.size(pos) > 0, body, [pending, take(slots, pending), none, none, none],
        shape_invariants=[tf.TensorShape([None])] * 5)
    return updated(rows, done, found), updated(slots, done, ended)


def insert(index: IndexVariables, keys: tf.Tensor, rows: tf.Tensor, slots: tf.Tensor) -> tf.Operation:
    """Place distinct absent `keys` with their `rows`, each from the empty slot its `lookup` ended on.

    Writes ``row_keys[rows] = keys``; `size` is the caller's.
    """
    mask = tf.constant((1 << index.bits) - 1, tf.int64)
    written = index.row_keys.scatter_update(tf.IndexedSlices(keys, rows))

    def claim(keys: tf.Tensor, rows: tf.Tensor, at: tf.Tensor) -> tf.Tensor:
        """Claim slots `at` (empty) for `keys` and their `rows`; the keys that lost their slot to another."""
        pairs = tf.stack([keys, rows], 1)
        with tf.control_dependencies([index.slots.scatter_update(tf.IndexedSlices(pairs, at))]):
            return tf.not_equal(read_rows(index.slots, at)[:, 1], rows)

    def body(keys: tf.Tensor, rows: tf.Tensor, at: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        at = (at + 1) & mask
        free = read_rows(index.slots, at)[:, 1] < 0
        lost = claim(masked(keys, free), masked(rows, free), masked(at, free))
        again = updated(~free, tf.where(free)[:, 0], lost)  # occupied, or lost the claim
        return masked(keys, again), masked(rows, again), masked(at, again)

    with tf.control_dependencies([written]):
        lost = claim(keys, rows, slots)
        placed = tf.while_loop(lambda keys, *_: tf.size(keys) > 0, body,
                               [masked(keys, lost), masked(rows, lost), masked(slots, lost)],
                               shape_invariants=[tf.TensorShape([None])] * 3)
    with tf.control_dependencies(placed):
        return tf.no_op()


def _exhausted_message(name: str, total: Any, held: Any, new: Any, capacity: int) -> str:
    return (f"{name}: vocabulary exhausted: {total} distinct keys need rows but "
            f"max_vocabulary_size_per_gpu={capacity} ({held} held, {new} new in this batch); raise it, or "
            "hash keys into fewer buckets (HashBucket) before the layer")


def lookup_or_insert(index: IndexVariables, keys: tf.Tensor, capacity: int, name: str,
                     share: Callable[[tf.Tensor], tf.Tensor] | None = None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(row of each of the distinct `keys`, keys new to the index, their rows).

    New keys take rows ``size, size + 1, ...``; a table without room for them raises
    `VocabularyExhausted` before anything is written. `share`, for a table replicated over
    several replicas, maps this replica's new keys to every replica's (``all_gather``), so all
    copies of the index take the same keys in the same order and stay identical.
    """
    keys = tf.convert_to_tensor(keys, tf.int64)
    rows, slots = lookup(index, keys)
    missing = rows < 0
    new_at = tf.where(missing)[:, 0]
    new_keys, new_slots = take(keys, new_at), take(slots, new_at)
    if share is not None:
        new_keys = tf.unique(share(new_keys))[0]  # first-occurrence order: the same on every replica
        new_slots = lookup(index, new_keys)[1]
    held, count = index.size.read_value(), tf.size(new_keys, tf.int64)
    if tf.executing_eagerly() and int(held) + int(count) > capacity:
        raise VocabularyExhausted(_exhausted_message(name, int(held) + int(count), int(held), int(count), capacity))
    check = tf.debugging.Assert(held + count <= capacity, [tf.strings.format(
        _exhausted_message(name.replace("{", "{{").replace("}", "}}"), "{}", "{}", "{}", capacity),
        (held + count, held, count))])
    with tf.control_dependencies([check]):
        new_rows = held + tf.range(count)
        placed = insert(index, new_keys, new_rows, new_slots)
    with tf.control_dependencies([placed]):
        grown = index.size.assign_add(count)
    if share is not None:
        with tf.control_dependencies([grown]):
            return tf.where(missing, lookup(index, keys)[0], rows), tf.identity(new_keys), new_rows
    # The new keys' rows in their places, known before the slots are written: the step's lookups
    # start while the insert runs beside them (a later access to the index in the function follows
    # it, as every access to a variable follows the one before). A step whose keys all have rows,
    # the usual one once a table is warm, skips the update (its writes cost less than a running
    # count over all keys).
    return tf.cond(count > 0, lambda: updated(rows, new_at, new_rows), lambda: rows), new_keys, new_rows
