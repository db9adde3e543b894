"""`UniqueKeys`: a batch's keys deduplicated ahead of the training step, in the input pipeline.

A table's lookup starts by deduplicating its keys (`sok_tutorial.embedding.dedup.distinct`: hash
maps filled on the step's critical path, the largest single op of a static table's step on the
TorchRec-shaped workload). Nothing in it depends on the table, so a ``tf.data`` pipeline can do
it for the next batch while the step trains on this one, on a core the step leaves idle::

    keys [batch, slots] --unique_keys--> UniqueKeys(unique [U], position [batch, slots])
                                          keys == tf.gather(unique, position)

The layers (`DistributedEmbedding` with dense keys, `All2AllDenseEmbedding`) and
`EmbeddingTable.lookup` take a `UniqueKeys` wherever they take a dense key tensor and give the
same vectors and gradients; a table that cannot use the deduplication (a sharded table, which
deduplicates each replica's share after routing; `QREmbedding`) looks up ``keys()`` instead.
``tf.data`` carries it through ``map`` and ``prefetch``; it is made per batch, after batching.

Example:
    >>> keys = tf.constant([[7, 3], [3, 9]], tf.int64)
    >>> ready = unique_keys(keys)
    >>> ready.unique.numpy().tolist(), ready.position.numpy().tolist()
    ([7, 3, 9], [[0, 1], [1, 2]])
    >>> bool(tf.reduce_all(ready.keys() == keys)), ready.shape
    (True, TensorShape([2, 2]))
    >>> dataset = tf.data.Dataset.from_tensor_slices(tf.zeros([8, 2], tf.int64)).batch(4)
    >>> [type(k).__name__ for k in dataset.map(unique_keys).prefetch(1)]
    ['UniqueKeys', 'UniqueKeys']
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf

from sok_tutorial.embedding.dedup import distinct, row_position_pairs


class UniqueKeys(tf.experimental.ExtensionType):
    """Distinct keys ``unique [U]`` (int64) and, for every key of the batch, its place among them,
    ``position`` (int32, the batch's key shape): the batch's keys are ``unique[position]``.
    `pairs` (int32 ``[K, 2]``: ``(k, position[k])`` for the K keys in flat order), when given, are
    the indices of the sparse product that sums the gradients of repeated keys in the backward
    pass (`sok_tutorial.embedding.dedup.sum_by_position`), made ahead as well. `rows` (int64
    ``[U]``), when given, are the rows a dynamic table's index held for the distinct keys when the
    pipeline looked them up (-1: none then; `lookup_ahead`): hints the table checks, never trusts.

    It acts as a tensor of the keys' shape where the layers expect one (Keras passes it through
    ``layer(keys)``), so a step written for key tensors takes it unchanged.
    """

    __name__ = "sok_tutorial.UniqueKeys"
    unique: tf.Tensor
    position: tf.Tensor
    pairs: Optional[tf.Tensor] = None  # noqa: UP045 (TensorFlow's extension types read typing's Optional)
    rows: Optional[tf.Tensor] = None  # noqa: UP045

    def __validate__(self) -> None:
        if self.unique.dtype != tf.int64 or self.position.dtype != tf.int32:
            raise TypeError(f"UniqueKeys needs int64 unique keys and int32 positions, got unique "
                            f"{self.unique.dtype.name} and position {self.position.dtype.name}")
        if self.rows is not None and self.rows.dtype != tf.int64:
            raise TypeError(f"UniqueKeys needs int64 rows, got {self.rows.dtype.name}")

    @property
    def shape(self) -> tf.TensorShape:
        """The batch's key shape (that of `position`)."""
        return self.position.shape

    @property
    def dtype(self) -> tf.DType:
        return self.unique.dtype

    @property
    def is_tensor_like(self) -> bool:  # Keras takes it as a layer's positional input
        return True

    def keys(self) -> tf.Tensor:
        """The batch's keys again, ``unique[position]``."""
        return tf.gather(self.unique, self.position)

    def reshape(self, shape: Any) -> UniqueKeys:
        """The same keys in another shape (of as many keys, so the same flat order)."""
        return UniqueKeys(self.unique, tf.reshape(self.position, shape), self.pairs, self.rows)


def unique_keys(keys: Any, *rest: Any) -> Any:
    """`keys` (an integer tensor of any shape) deduplicated: a `UniqueKeys`, with its `pairs`. With more arguments (a
    ``tf.data`` element ``(keys, labels, ...)``), the first is deduplicated and the rest pass on,
    so ``dataset.map(unique_keys)`` works on ``(keys, labels)`` batches as on bare keys."""
    keys = tf.convert_to_tensor(keys)
    if not keys.dtype.is_integer:
        raise TypeError(f"keys must be integers (int64 or int32), got {keys.dtype.name}")
    unique, position = distinct(tf.reshape(keys, [-1]))
    pairs = row_position_pairs(position)  # (int32, as the step would make them)
    ready = UniqueKeys(tf.cast(unique, tf.int64), tf.reshape(position, tf.shape(keys)), pairs)
    return (ready, *rest) if rest else ready


def lookup_ahead(layer: Any) -> Callable[..., Any]:
    """A ``tf.data`` map function that does what `unique_keys` does and also looks the distinct keys
    up in the key index of `layer`'s table (a `DistributedEmbedding`, or an `EmbeddingTable`), so
    that the next batch's index lookups, too, run beside the step rather than in it.

    The rows travel in `UniqueKeys.rows`. They are hints: between the pipeline's lookup and the
    step, the step before may give new keys rows, and a restore may move every row, so the table
    keeps a hint only if the row is in use and holds that key (one gather), and looks the other
    keys up, and gives new ones rows, as it would without hints. The pipeline looks a batch up
    only when 9 in 10 of a sample of its keys have rows (otherwise every hint is -1 and the step
    does its own lookups): while many keys are new, rows found ahead save little, and the
    pipeline's reads of the index would make the step's writes to it wait
    (``benchmarks/embedding.py``, ``dynamic_pipeline`` against ``dynamic``).
    A table whose rows can move while it trains (an eviction policy, admission, change tracking),
    a sharded table, a static one and one replicated over several replicas take no hints: for them
    it is `unique_keys`. The layer must be built (its index exists) before the pipeline runs.

    Example:
        >>> import sok_tutorial as sok
        >>> layer = sok.DistributedEmbedding("sum", 100, 4, slot_num=2, max_nnz=1, use_hashtable=True)
        >>> _ = layer(tf.constant([[10, 20]], tf.int64), training=True)  # builds it; 10 and 20 get rows
        >>> dataset = tf.data.Dataset.from_tensor_slices(tf.constant([[20, 10], [10, 20]], tf.int64)).batch(2)
        >>> ready = next(iter(dataset.map(lookup_ahead(layer))))
        >>> ready.unique.numpy().tolist(), ready.rows.numpy().tolist()
        ([20, 10], [1, 0])
        >>> layer(ready, training=True).shape
        TensorShape([2, 2, 4])
    """
    table = getattr(layer, "table", layer)  # (a layer's table is None until the layer is built)
    if table is not None and not (hasattr(table, "lookup") and hasattr(table, "built")):
        raise TypeError(f"lookup_ahead needs an embedding layer or table, got {type(layer).__name__}")
    if table is None or not table.built:
        raise ValueError(f"lookup_ahead: {getattr(layer, 'name', layer)} is not built yet, so it has no key index "
                         "to look keys up in; build it first (call it on a batch, or build the model)")
    rows_ahead = getattr(table, "rows_ahead", None)

    def ahead(keys: Any, *rest: Any) -> Any:
        ready = keys if isinstance(keys, UniqueKeys) else unique_keys(keys)
        ready = ready if rows_ahead is None else rows_ahead(ready)
        return (ready, *rest) if rest else ready

    return ahead


def as_keys(keys: Any) -> Any:
    """Plain keys: a `UniqueKeys` expanded back, anything else as it is."""
    return keys.keys() if isinstance(keys, UniqueKeys) else keys


def like_keys(keys: Any) -> Any:
    """A tensor of the keys' shape, for shape arithmetic: `UniqueKeys`' positions, or the keys."""
    return keys.position if isinstance(keys, UniqueKeys) else keys
