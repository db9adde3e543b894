"""The TensorFlow pieces of a table lookup, and of a table spread over replicas.

* `gather_rows` reads distinct rows of a table's variable; its gradient is a
  `UniqueRowsGradient`, which tells the sparse optimizers that the rows are distinct and their
  gradients summed, and hands them the rows it read, so that a step reads each row once.
  `expand` repeats those rows for every key of the batch, and its gradient sums the repeats
  with one sparse matrix product (`sum_by_position`); `vectors_of` puts the two together, with
  zeros for keys that have no row.
* `distinct` deduplicates a batch's keys, as ``tf.unique`` does, in four parts on large batches.
* `inserting` decides whether a call gives new keys rows (training) or not (inference).
* `all_gather` is ``ReplicaContext.all_gather`` that also survives every replica sending
  nothing; `local_components` are the per-device variables behind a mirrored one.
* `in_shape_trace` tells when Keras traces a layer only for its output shapes.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.precision import widen

try:  # whether any gradient tape is recording (TensorFlow has no public call for it)
    from tensorflow.python.eager.record import could_possibly_record as _recording
except ImportError:  # older TensorFlow kept it in tape.py
    from tensorflow.python.eager.tape import could_possibly_record as _recording


class UniqueRowsGradient(tf.IndexedSlices):
    """The gradient of one table lookup: distinct ``indices``, each row's gradient summed.

    `read`, when given, holds the rows as the lookup read them (float32, ``[len(indices), dim]``):
    a sparse optimizer that receives this gradient object as it is, in the same step, updates
    from them instead of reading the rows a second time. Anything that makes a new gradient
    (scaling, clipping, all-reduce, the sum of two lookups) makes one without it.
    """

    def __init__(self, values: Any, indices: Any, dense_shape: Any = None, read: tf.Tensor | None = None):
        super().__init__(values, indices, dense_shape)
        self.read = read


_PARTS = 4  # hash maps `distinct` builds on a large batch
PARTS_FROM = 1 << 15  # keys from which it does; below, one tf.unique is as fast
_MIX = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: the multiplier of `mix_keys` and of `distinct`'s parts


def mix_keys(keys: tf.Tensor) -> tf.Tensor:
    """A 64-bit mix of int64 `keys` (multiply, xor-shift, multiply), uint64: its top bits place a key
    in the key index's slots (`sok_tutorial.embedding.index.home_slots`) and in the bucketed index's
    buckets (`sok_tutorial.embedding.buckets.bucket_of`). `mix_keys_np` is its NumPy twin.

    Example:
        >>> keys = [0, 1, -1, 2**63 - 1]
        >>> mix_keys(tf.constant(keys, tf.int64)).numpy().tolist() == mix_keys_np(np.array(keys)).tolist()
        True
    """
    mix = tf.constant(_MIX, tf.uint64)
    h = tf.bitcast(keys, tf.uint64) * mix
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(32, tf.uint64))) * mix


def mix_keys_np(keys: Any) -> np.ndarray:
    """NumPy twin of `mix_keys`."""
    mix = np.uint64(_MIX)
    with np.errstate(over="ignore"):
        h = np.asarray(keys, np.int64).view(np.uint64) * mix
        return (h ^ (h >> np.uint64(32))) * mix


def distinct(keys: tf.Tensor, parts_from: int = PARTS_FROM, any_order: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
    """(distinct `keys`, int32 position of each key among them): ``tf.unique(keys, out_idx=tf.int32)``
    of 1-D integer `keys`, except that from `parts_from` keys on the distinct keys come grouped by
    four parts of the key space (first sight order within each part).

    A number of keys not known while tracing is settled by a ``tf.cond`` on the size, so that the
    order depends on the keys alone (a dynamic table hands out rows in this order). A caller to
    whom the order does not matter (`any_order`: sums per key, as an optimizer takes its rows)
    gets the parts with no ``tf.cond``, which would put both forms, as branch functions, in every
    such step's graph (a sharded table's optimizer's), to be traced and optimized at its first
    call.

    ``tf.unique`` fills one hash map on one core; at the ~200k keys of a large recommender batch
    its map outgrows the core's cache, and it becomes the largest single op of a table's step.
    Split by the top bits of a multiplicative hash of the key (so that any pattern of keys
    spreads over the parts), four maps of a quarter of the keys each fit, and TensorFlow's
    inter-op threads build them side by side; one ``dynamic_stitch`` puts the positions back in
    the batch's order. ``benchmarks/embedding.py`` (``torchrec_shape``) measures the step it is
    part of; the README has the figures.

    Example:
        >>> keys = tf.constant([7, 3, 7, 8, 3, 5], tf.int64)
        >>> unique, position = distinct(keys, parts_from=1)  # (four parts even for six keys)
        >>> sorted(unique.numpy().tolist()), bool(tf.reduce_all(tf.gather(unique, position) == keys))
        ([3, 5, 7, 8], True)
        >>> [k.numpy().tolist() for k in distinct(keys)]  # small batches: exactly tf.unique
        [[7, 3, 8, 5], [0, 1, 0, 2, 1, 3]]
    """
    def one_map() -> tuple[tf.Tensor, tf.Tensor]:
        return tuple(tf.unique(keys, out_idx=tf.int32))  # (a tuple, as in_parts returns, for tf.cond)

    def in_parts() -> tuple[tf.Tensor, tf.Tensor]:
        mixed = tf.bitcast(tf.cast(keys, tf.int64), tf.uint64) * tf.constant(_MIX, tf.uint64)
        part = tf.cast(tf.bitwise.right_shift(mixed, tf.constant(62, tf.uint64)), tf.int32)  # 4 = 2 ** 2 parts
        pieces = tf.dynamic_partition(keys, part, _PARTS)
        where = tf.dynamic_partition(tf.range(tf.size(keys)), part, _PARTS)
        uniques, positions, offset = [], [], tf.constant(0, tf.int32)
        for piece in pieces:
            unique, position = tf.unique(piece, out_idx=tf.int32)
            uniques.append(unique)
            positions.append(position + offset)
            offset += tf.size(unique)
        position = tf.dynamic_stitch(where, positions)
        position.set_shape(keys.shape)  # (a stitch's length is not known while tracing; it is the keys')
        return tf.concat(uniques, 0), position

    known = keys.shape.num_elements()
    if known is None and not any_order:
        return tf.cond(tf.size(keys) >= parts_from, in_parts, one_map)
    return one_map() if known is not None and known < parts_from else in_parts()


def in_shape_trace(variable: Any) -> bool:
    """Keras traces a layer only for its output shapes (``compute_output_spec``, a stateless scope):
    its variables stand for placeholder tensors, and no state may be read or written."""
    return not isinstance(variable.value, tf.Variable)


def inserting(training: Any) -> bool:
    """Whether a call gives new keys rows: in training, not in inference.

    ``training=True`` or ``False`` decides. ``None`` is what Keras passes both when it serves a
    model (``model(x)``, the endpoint of ``model.export``) and when ``model.fit`` trains a model
    whose ``call`` takes no ``training`` argument; what tells them apart is a gradient tape
    recording the call (every training step has one), so ``None`` inserts exactly then.
    """
    if training is None:
        return bool(_recording())
    if isinstance(training, (bool, np.bool_)):
        return bool(training)
    return True  # a tensor: only a training step passes one


def tf_variable(variable: Any) -> Any:
    """The TensorFlow variable behind a Keras one (under a strategy, a distributed variable, which in
    a replica acts on that replica's copy), or a TensorFlow variable itself."""
    value = getattr(variable, "value", variable)
    return variable if callable(value) else value  # (a tf.Variable's `value` is a method)


def local_components(variable: Any) -> list[Any]:
    """The per-device tf.Variables of this process behind a (possibly mirrored) variable."""
    value = tf_variable(variable)
    return list(getattr(value, "values", None) or [value])


def local_view(obj: Any, names: Sequence[str], component: int) -> Any:
    """A shallow copy of `obj` whose variable attributes `names` (those not None) are their local
    copy `component` (`local_components`): one shard's state, on the host or outside its replicas."""
    view = copy.copy(obj)
    for name in names:
        if getattr(obj, name) is not None:
            setattr(view, name, local_components(getattr(obj, name))[component])
    return view


def all_gather(context: Any, values: tf.Tensor, sizes: tf.Tensor | None = None) -> tf.Tensor:
    """``context.all_gather(values, 0)``, also when every replica's `values` is empty (TensorFlow's
    collective crashes the process then): each replica sends one padding row more, dropped after.
    `sizes`: each replica's number of rows, when already gathered (else one more collective)."""
    if sizes is None:
        sizes = context.all_gather(tf.shape(values, out_type=tf.int64)[:1], 0)  # (replicas,)
    pad = tf.zeros(tf.concat([[1], tf.shape(values)[1:]], 0), values.dtype)
    gathered = context.all_gather(tf.concat([values, pad], 0), 0)
    padding = tf.cumsum(tf.cast(sizes, tf.int64) + 1) - 1
    keep = tf.tensor_scatter_nd_update(tf.ones(tf.shape(gathered)[:1], tf.bool), padding[:, None],
                                       tf.zeros_like(padding, tf.bool))
    return tf.boolean_mask(gathered, keep)


def all_gather_slices(context: Any, gradients: Sequence[tf.IndexedSlices]) -> list[tf.IndexedSlices]:
    """Every replica's rows of each of the sparse `gradients` (the rows of all replicas, in replica
    order, as ``context.all_reduce`` of an ``IndexedSlices`` gives them), gathered together:
    three all-gathers (the lengths, the rows, their indices) for all gradients of one row width
    and dtype, where an all-reduce of each on its own takes a gather of its length and a branch
    of padded gathers per gradient. With many replicated tables that is tens of collectives a
    step fewer, and a smaller graph to trace and start. bfloat16 rows travel as float32 (exact):
    TensorFlow's CPU collectives carry no bfloat16.

    Example (one replica: each gradient comes back as it is):
        >>> g = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([4, 1]), tf.constant([9, 3]))
        >>> context = tf.distribute.get_replica_context()
        >>> [s.indices.numpy().tolist() for s in all_gather_slices(context, [g, g])]
        [[4, 1], [4, 1]]
    """
    replicas = context.num_replicas_in_sync
    out: list[tf.IndexedSlices | None] = [None] * len(gradients)
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(gradients):
        row = g.values.shape[1:]  # (a row shape not known while tracing is gathered on its own)
        groups.setdefault((g.values.dtype, tuple(row)) if row.is_fully_defined() else i, []).append(i)
    for members in groups.values():
        parts = [gradients[i] for i in members]
        dtype = parts[0].values.dtype
        carried = tf.float32 if dtype == tf.bfloat16 else dtype  # (CPU collectives carry no bfloat16; exact)
        values = tf.cast(tf.concat([g.values for g in parts], 0), carried)
        indices = tf.concat([tf.cast(g.indices, tf.int64) for g in parts], 0)
        sizes = tf.stack([tf.shape(g.indices, out_type=tf.int64)[0] for g in parts])  # (k,)
        every = tf.reshape(context.all_gather(sizes[None], 0), [-1])  # (replicas * k,): replica-major
        per_replica = tf.reduce_sum(tf.reshape(every, [replicas, len(parts)]), 1)
        pieces = (tf.split(all_gather(context, values, per_replica), every, num=replicas * len(parts)),
                  tf.split(all_gather(context, indices, per_replica), every, num=replicas * len(parts)))
        for j, (i, g) in enumerate(zip(members, parts)):
            mine = range(j, replicas * len(parts), len(parts))  # gradient j of each replica
            out[i] = tf.IndexedSlices(tf.cast(tf.concat([pieces[0][r] for r in mine], 0), dtype),
                                      tf.cast(tf.concat([pieces[1][r] for r in mine], 0), g.indices.dtype),
                                      g.dense_shape)
    return out


def sum_by_position(values: tf.Tensor, position: tf.Tensor, count: tf.Tensor,
                    pairs: tf.Tensor | None = None) -> tf.Tensor:
    """``out[position[k]] += values[k]``: ``[count, ...]`` sums of the rows of `values` ``[K, ...]``.
    `pairs`: the product's indices ``(k, position[k])`` ``[K, 2]`` int64, if made ahead (`UniqueKeys`).

    Two sparse matrix products, each over half of the rows, which the inter-op threads run side by
    side (TensorFlow's CPU kernel of the product runs on one core), and one sum of the two. Each
    product's int32 indices ``(k, position[k])`` are made from its own half (no ``[K, 2]`` array
    of the whole batch to build and then slice). Two at any size: a small batch pays one more
    small product, and a batch sums alike whether its size is known while tracing or not, with no
    ``tf.cond`` between one product and two (which would put both in every graph whose size is
    unknown while tracing, a sharded table's optimizer's among them).

    Example:
        >>> sum_by_position(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([1, 0, 1]), 2).numpy().tolist()
        [[2.0], [5.0]]
    """
    k = tf.shape(position)[0]
    flat = tf.reshape(values, tf.stack([k, -1]))
    shape = tf.stack([tf.cast(k, tf.int64), tf.cast(count, tf.int64)])
    position = tf.cast(position, tf.int32)

    def product(lo: Any, hi: Any) -> tf.Tensor:  # the rows [lo, hi) of `flat`, summed by position
        these = pairs[lo:hi] if pairs is not None else tf.stack([tf.range(lo, hi), position[lo:hi]], 1)  # int32
        ones = tf.ones(tf.shape(these)[:1], values.dtype)
        return tf.raw_ops.SparseTensorDenseMatMul(a_indices=these, a_values=ones, a_shape=shape, b=flat,
                                                  adjoint_a=True)  # (count, prod(rest))

    out = product(0, k // 2) + product(k // 2, k)
    return tf.reshape(out, tf.concat([[count], tf.shape(values)[1:]], 0))


def expand(vectors: tf.Tensor, position: tf.Tensor, pairs: tf.Tensor | None = None) -> tf.Tensor:
    """``vectors[position]``, whose gradient sums repeats with one sparse product (`sum_by_position`,
    on `pairs` when they were made ahead)."""
    @tf.custom_gradient
    def gather(vectors: tf.Tensor) -> tuple[tf.Tensor, Any]:
        def grad(upstream: tf.Tensor) -> tf.Tensor:
            return sum_by_position(tf.convert_to_tensor(upstream), position, tf.shape(vectors)[0], pairs)
        return tf.gather(vectors, position), grad
    return gather(vectors)


def _local(variable: Any) -> Any:
    """The TensorFlow variable behind a Keras one; in a replica, a distributed variable's copy on
    that replica (one of this process's copies, ``values``)."""
    variable = tf_variable(variable)
    copies = getattr(variable, "values", None)
    context = tf.distribute.get_replica_context()
    if not copies or context is None:
        return variable
    if len(copies) == 1:
        return copies[0]
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    return variable if replica is None else copies[int(replica) % len(copies)]


def read_rows(variable: Any, indices: tf.Tensor) -> tf.Tensor:
    """``variable[indices]``, read as rows (one ``ResourceGather``), never the whole variable.

    ``tf.gather`` of a distributed variable inside a replica reads all of it first, and TensorFlow
    copies a variable that has been scattered into on every such read: a pass over the whole table
    each step. This gathers from the replica's own copy instead (and, as any read, lets a gradient
    tape watch it)."""
    return tf.gather(_local(variable), indices)


def updated(values: tf.Tensor, at: tf.Tensor, updates: tf.Tensor) -> tf.Tensor:
    """`values` ``[n, ...]`` with ``values[at] = updates`` (`at`: distinct, any integer type).

    A ``tf.dynamic_stitch`` (later pieces win): it writes its n + k rows in one parallel pass, where
    ``tf.tensor_scatter_nd_update`` copies `values` and then applies the k updates one at a time,
    3-4x slower on a CPU for tens of thousands of updates.

    Example:
        >>> updated(tf.constant([5, 6, 7]), tf.constant([2, 0]), tf.constant([0, 1])).numpy().tolist()
        [1, 6, 0]
    """
    return tf.dynamic_stitch([tf.range(tf.shape(values)[0]), tf.cast(at, tf.int32)], [values, updates])


WRITE_PARTS = 2  # scatters `write_rows` splits a write into, which run side by side
WRITE_PARTS_FROM = 1 << 15  # rows (known while tracing) below which it writes with one
_WRITERS: dict[tuple[tf.DType, tuple[int, ...]], Any] = {}


def _writer(dtype: tf.DType, row_shape: tuple[int, ...]) -> Any:
    """``writer(handle, rows, values)``: `WRITE_PARTS` scatters of consecutive parts of distinct
    `rows` into the variable of `handle`, in a function without automatic control dependencies
    whose control outputs are the scatters (so that none is pruned); made once per dtype and row
    shape."""
    key = (dtype, row_shape)
    if key not in _WRITERS:
        def scatter(handle: tf.Tensor, rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
            n = tf.shape(rows)[0]
            cuts = [n * p // WRITE_PARTS for p in range(WRITE_PARTS + 1)]
            writes = [tf.raw_ops.ResourceScatterUpdate(resource=handle, indices=rows[lo:hi], updates=values[lo:hi])
                      for lo, hi in zip(cuts, cuts[1:])]
            with tf.control_dependencies(writes):
                return tf.identity(n)

        spec = [tf.TensorSpec([], tf.resource), tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None, *row_shape], dtype)]
        wrapped = tf.compat.v1.wrap_function(scatter, spec)
        writes = [op for op in wrapped.graph.get_operations() if op.type == "ResourceScatterUpdate"]
        _WRITERS[key] = wrapped.prune(feeds=wrapped.inputs, fetches=[wrapped.outputs[0], *writes])
    return _WRITERS[key]


def write_rows(variable: Any, rows: tf.Tensor, values: tf.Tensor) -> Any:
    """``variable[rows] = values`` for distinct `rows`, in `WRITE_PARTS` scatters of disjoint parts
    that run side by side (one scatter when the rows are known, while tracing, to be fewer than
    `WRITE_PARTS_FROM`): how an optimizer writes a step's rows and slots back.

    TensorFlow's CPU scatter writes its rows one after another on one core, at the end of every
    training step, when nothing else is left to run beside it; and inside a ``tf.function``,
    automatic control dependencies would run two scatters into one variable one after the other.
    These are made in a function without them (`_writer`), called with the variable's handle, so
    that the step orders the call as any other use of the variable, and the scatters inside run at
    once: the kernel takes a shared lock for plain number types, and distinct rows never overlap. A
    variable without a handle here (a distributed variable outside its replicas) takes its own
    ``scatter_update``.

    Example:
        >>> v = tf.Variable(tf.zeros([4, 2]))
        >>> _ = write_rows(v, tf.constant([3, 0]), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
        >>> v.numpy().tolist()
        [[3.0, 4.0], [0.0, 0.0], [0.0, 0.0], [1.0, 2.0]]
    """
    target = tf_variable(variable)
    try:
        handle = target.handle
    except (AttributeError, ValueError):
        handle = None
    known, row_shape = rows.shape.num_elements(), values.shape[1:]
    if handle is None or (known is not None and known < WRITE_PARTS_FROM) or not row_shape.is_fully_defined():
        return target.scatter_update(tf.IndexedSlices(values, rows))
    return _writer(values.dtype, tuple(row_shape.as_list()))(handle, tf.cast(rows, tf.int64), values)


def gather_rows(variable: Any, rows: tf.Tensor) -> tf.Tensor:
    """``variable[rows]`` for distinct `rows`, its gradient a `UniqueRowsGradient`. Rows stored in
    float16 or bfloat16 come out in float32, and their gradient is float32.

    The rows are read by an ordinary gather (`read_rows`, which makes gradient tapes watch the
    variable) whose own gradient is stopped; an identity that takes the variable's handle as an input gives the
    handle, and so the variable, the gradient instead. A ``tf.custom_gradient`` that read the
    variable itself would make TensorFlow read the whole table in graph mode, every step. Outside
    a gradient tape, and for a distributed variable outside its replicas (which has no handle),
    it is the plain gather.
    """
    if not _recording():
        return widen(read_rows(variable, rows))
    try:
        handle = variable.handle
    except ValueError:
        return widen(read_rows(variable, rows))

    @tf.custom_gradient
    def attach(handle: tf.Tensor, values: tf.Tensor) -> tuple[tf.Tensor, Any]:
        def grad(upstream: tf.Tensor) -> tuple[UniqueRowsGradient, None]:
            shape = tf.stack([tf.cast(variable.shape[0], tf.int64), tf.cast(variable.shape[1], tf.int64)])
            return UniqueRowsGradient(tf.convert_to_tensor(upstream), rows, shape, read=read), None
        return tf.identity(values), grad
    read = widen(tf.stop_gradient(read_rows(variable, rows)))
    return attach(handle, read)


def vectors_of(variable: Any, rows: tf.Tensor, found: tf.Tensor | None, position: tf.Tensor,
               pairs: tf.Tensor | None = None) -> tf.Tensor:
    """The rows of distinct keys (zeros where `found` is False), repeated for every key at `position`
    (`pairs`: `UniqueKeys.pairs`, when made ahead). Only found rows are read, so only they receive
    gradient: the end of every table's lookup.

    Example:
        >>> v = tf.Variable([[1.0], [2.0], [3.0]])
        >>> vectors_of(v, tf.constant([2, 0]), tf.constant([True, False]), tf.constant([0, 1, 0])).numpy().tolist()
        [[3.0], [0.0], [3.0]]
    """
    if found is None:
        return expand(gather_rows(variable, rows), position, pairs)
    everyone = tf.reduce_all(found)  # the usual case: no key needs the zero row
    present = tf.cond(everyone, lambda: rows, lambda: tf.boolean_mask(rows, found))
    vectors = gather_rows(variable, present)

    def absent_to_zeros() -> tuple[tf.Tensor, tf.Tensor]:
        at = tf.where(found, tf.cumsum(tf.cast(found, tf.int32)) - 1, tf.size(present))  # absent: the zero row
        return (tf.concat([vectors, tf.zeros(tf.stack([1, tf.shape(vectors)[1]]), vectors.dtype)], 0),
                tf.gather(at, position))

    vectors, position = tf.cond(everyone, lambda: (vectors, position), absent_to_zeros)
    return expand(vectors, position)
