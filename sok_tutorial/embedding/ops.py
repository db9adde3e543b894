"""The TensorFlow pieces of a table lookup, and of a table spread over replicas.

* `gather_rows` reads distinct rows of a table's variable; its gradient is a
  `UniqueRowsGradient`, which tells the sparse optimizers that the rows are distinct and their
  gradients summed, and hands them the rows it read, so that a step reads each row once.
  `expand` repeats those rows for every key of the batch, and its gradient sums the repeats
  with one sparse matrix product (`sum_by_position`); `vectors_of` puts the two together, with
  zeros for keys that have no row.
* Deduplicating the keys (`distinct`) and the sums per key (`sum_by_position`) are in
  `sok_tutorial.embedding.dedup`.
* `inserting` decides whether a call gives new keys rows (training) or not (inference).
* `local_components` are the per-device variables behind a mirrored one; the collectives of a
  table spread over replicas are in `sok_tutorial.embedding.collectives`.
* `in_shape_trace` tells when Keras traces a layer only for its output shapes.
* `ids_below` checks that a step's ids are row ids of a table, with one Assert op.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.dedup import sum_by_position
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


def in_shape_trace(variable: Any) -> bool:
    """Keras traces a layer only for its output shapes (``compute_output_spec``, a stateless scope):
    its variables stand for placeholder tensors, and no state may be read or written."""
    return not isinstance(variable.value, tf.Variable)


def ids_below(keys: tf.Tensor, rows: int, message: str) -> tf.Tensor:
    """`keys` (integers), once checked to lie in ``[0, rows)``: in a graph, whatever reads a table
    with them waits for the check, so a bad id gets `message`, not a gather's error.

    One pass: as unsigned, a negative id is larger than any row id (an empty batch's max is 0).
    The Assert carries `message` only, a string: ``tf.debugging.assert_less`` and the like wrap
    an Assert that prints int64 values in a ``tf.cond``, two branch functions per check in every
    step's graph, to trace and optimize at its first call.

    Example:
        >>> ids_below(tf.constant([0, 4], tf.int64), 5, "ids in [0, 5)").numpy().tolist()
        [0, 4]
    """
    largest = tf.reduce_max(tf.bitcast(tf.cast(keys, tf.int64), tf.uint64))
    check = tf.debugging.Assert(largest < tf.constant(rows, tf.uint64), [message])
    with tf.control_dependencies([] if check is None else [check]):
        return tf.identity(keys)


def counts_at_most(counts: tf.Tensor, limit: int, message: str) -> Any:
    """Check that no element of the 1-D integer `counts` exceeds `limit` (an empty one passes): an
    Assert carrying `message` only, a string, as `ids_below` makes it; in eager mode it raises at
    once. Returns the Assert (None in eager mode).

    Example:
        >>> counts_at_most(tf.constant([2, 3]), 3, "at most 3 keys a bag")
    """
    largest = tf.reduce_max(tf.concat([counts, tf.zeros([1], counts.dtype)], 0))
    return tf.debugging.Assert(largest <= tf.cast(limit, counts.dtype), [message])


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


def take(values: tf.Tensor, indices: tf.Tensor) -> tf.Tensor:
    """``tf.gather(values, indices)`` along the first axis, by TensorFlow's ``GatherNd`` kernel: on a
    CPU it reads the same elements or rows faster than its ``Gather`` kernel does (the ``gather`` case
    of ``benchmarks/embedding.py --group index``; the README has the figures), and with indices of
    one dimension its gradient is the same `tf.IndexedSlices`. The indices go as int64: with int32
    ones the kernel refuses a tensor of more than 2**31 elements. Booleans (a mask, a table's
    fresh-row marks) go by ``Gather``: ``GatherNd`` has no GPU kernel for them, and the step would
    copy them to the host and back.

    Example:
        >>> take(tf.constant([[1, 2], [3, 4], [5, 6]]), tf.constant([2, 0])).numpy().tolist()
        [[5, 6], [1, 2]]
    """
    if values.dtype == tf.bool:
        return tf.gather(values, indices)
    return tf.gather_nd(values, tf.expand_dims(tf.cast(indices, tf.int64), -1))


def masked(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """``tf.boolean_mask(values, mask)`` for a 1-D `mask` over the first axis of `values`: the same
    where and gather, as three ops where ``tf.boolean_mask`` builds about twenty-five for masks of
    any rank (shape arithmetic, reshapes). A table's step masks keys a dozen times per replica,
    inside loops too: ops that every trace builds and every first call optimizes.

    Example:
        >>> masked(tf.constant([[1], [2], [3]]), tf.constant([True, False, True])).numpy().tolist()
        [[1], [3]]
    """
    return take(values, tf.reshape(tf.where(mask), [-1]))


def kept(mask: tf.Tensor, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """`masked` of each of `tensors` by one 1-D `mask`, with no gather when the mask is all True:
    then the tensors come back as they are (a ``tf.cond``). In a step of a full table every new key
    takes a row and evicts a key, and the half dozen arrays of its new keys would each be gathered
    whole, in order.

    Example:
        >>> [t.numpy().tolist() for t in kept(tf.constant([True, False]), [tf.constant([1, 2]), tf.constant([3, 4])])]
        [[1], [3]]
    """
    def some() -> list[tf.Tensor]:
        at = tf.reshape(tf.where(mask), [-1])
        return [take(t, at) for t in tensors]

    return tf.cond(tf.reduce_all(mask), lambda: list(tensors), some)


def expand(vectors: tf.Tensor, position: tf.Tensor, pairs: tf.Tensor | None = None) -> tf.Tensor:
    """``vectors[position]``, whose gradient sums repeats with one sparse product (`sum_by_position`,
    on `pairs` when they were made ahead)."""
    @tf.custom_gradient
    def gather(vectors: tf.Tensor) -> tuple[tf.Tensor, Any]:
        def grad(upstream: tf.Tensor) -> tf.Tensor:
            return sum_by_position(tf.convert_to_tensor(upstream), position, tf.shape(vectors)[0], pairs)
        return take(vectors, position), grad
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
    """``variable[indices]``, read as rows (one ``ResourceGatherNd``, `take`), never the whole variable.

    ``tf.gather`` of a distributed variable inside a replica reads all of it first, and TensorFlow
    copies a variable that has been scattered into on every such read: a pass over the whole table
    each step. This gathers from the replica's own copy instead (and, as any read, lets a gradient
    tape watch it)."""
    return take(_local(variable), indices)


#: elements a dense read of a variable copies in the time a gather reads one element (measured about
#: 60 on a CPU: a copy streams, a gather of single elements pays a call and a cache line per element)
COPY_PER_GATHERED = 32


def read_spans(variable: Any, spans: tf.Tensor, width: int) -> tf.Tensor:
    """``[n, width]``: span ``k`` of each of `spans` (int), the `width` consecutive elements of the
    1-D `variable` from element ``k * width``, by whichever is cheaper at run time: a gather of
    single elements (cost grows with ``n * width``), or one read of the whole variable viewed as rows
    of `width` and a gather of whole rows (cost grows with the variable's size: TensorFlow copies a
    variable that sparse ops have written on every dense read). The read is taken when the variable
    holds at most `COPY_PER_GATHERED` times the elements gathered, so either way the cost is that of
    reading about ``n * width`` elements.

    Example:
        >>> read_spans(tf.Variable(tf.range(12)), tf.constant([2, 0]), 4).numpy().tolist()
        [[8, 9, 10, 11], [0, 1, 2, 3]]
    """
    size = int(variable.shape[0])
    spans = tf.cast(spans, tf.int64)  # (what `take` reads by: no second cast of the [n, width] indices)
    return _from_copy_or_gather(
        variable, tf.size(spans) * width,
        lambda copy: take(tf.reshape(copy, [size // width, width]), spans),
        lambda: read_rows(variable, (spans * width)[:, None] + tf.range(width, dtype=tf.int64)))


def read_elements(variable: Any, indices: tf.Tensor) -> tf.Tensor:
    """``variable[indices]`` of a 1-D variable, by whichever costs less at run time: a gather of
    single elements (TensorFlow's resource gather: ~10-15 ns an element on a CPU), or one read of the
    whole variable and a plain gather from that copy, when the variable holds at most
    `COPY_PER_GATHERED` times the elements read.

    Example:
        >>> read_elements(tf.Variable(tf.range(10) * 2), tf.constant([7, 0])).numpy().tolist()
        [14, 0]
    """
    return _from_copy_or_gather(variable, tf.size(indices), lambda copy: take(copy, indices),
                                lambda: read_rows(variable, indices))


def _from_copy_or_gather(variable: Any, reads: tf.Tensor, from_copy: Any, by_gather: Any) -> tf.Tensor:
    """The choice `read_spans` and `read_elements` make at run time: ``from_copy(one read of the
    whole 1-D variable)`` when it holds at most `COPY_PER_GATHERED` times the `reads` elements, else
    ``by_gather()``, a resource gather of single elements."""
    local = _local(variable)
    return tf.cond(reads * COPY_PER_GATHERED >= int(variable.shape[0]), lambda: from_copy(local.read_value()),
                   by_gather)


def updated(values: tf.Tensor, at: tf.Tensor, updates: tf.Tensor) -> tf.Tensor:
    """`values` ``[n, ...]`` with ``values[at] = updates`` (`at`: distinct, any integer type).

    A 1-D `values` (every use in a table's step) goes by two ``SparseToDense`` ops, the updates in
    place over a default and a mask of where they are, and one select: on a CPU about half the time
    of a ``tf.dynamic_stitch`` of the n + k elements, which copies each element through its index
    (``tf.tensor_scatter_nd_update`` copies `values` and then applies the k updates one at a time,
    slower still). Rows go by the stitch (later pieces win).

    Example:
        >>> updated(tf.constant([5, 6, 7]), tf.constant([2, 0]), tf.constant([0, 1])).numpy().tolist()
        [1, 6, 0]
        >>> updated(tf.constant([[5], [6]]), tf.constant([1]), tf.constant([[0]])).numpy().tolist()
        [[5], [0]]
    """
    if values.shape.rank != 1:
        return tf.dynamic_stitch([tf.range(tf.shape(values)[0]), tf.cast(at, tf.int32)], [values, updates])
    at = at if at.dtype in (tf.int32, tf.int64) else tf.cast(at, tf.int64)
    size = tf.shape(values, out_type=at.dtype)
    placed = tf.raw_ops.SparseToDense(sparse_indices=at, output_shape=size, sparse_values=updates,
                                      default_value=tf.zeros([], values.dtype), validate_indices=False)
    mask = tf.raw_ops.SparseToDense(sparse_indices=at, output_shape=size, sparse_values=tf.constant(True),
                                    default_value=tf.constant(False), validate_indices=False)
    return tf.where(mask, placed, values)


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
            shape = tf.constant(variable.shape.as_list(), tf.int64)  # (a table's shape is static)
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
    present = tf.cond(everyone, lambda: rows, lambda: masked(rows, found))
    vectors = gather_rows(variable, present)

    def absent_to_zeros() -> tuple[tf.Tensor, tf.Tensor]:
        at = tf.where(found, tf.cumsum(tf.cast(found, tf.int32)) - 1, tf.size(present))  # absent: the zero row
        return (tf.concat([vectors, tf.zeros(tf.stack([1, tf.shape(vectors)[1]]), vectors.dtype)], 0),
                take(at, position))

    vectors, position = tf.cond(everyone, lambda: (vectors, position), absent_to_zeros)
    return expand(vectors, position)
