"""`EmbeddingTable`: an embedding table as one object, which everything else talks to.

A table owns its variable ``[capacity, dim]``, its key index, its key-seeded initializer
(`sok_tutorial.embedding.initializers`) and, through `optimizer_slots`, the optimizer's per-row
state. Its keys are either row ids (``dynamic=False``: ``0 .. capacity - 1``, anything else is an
error) or any int64 (``dynamic=True``: the in-graph index of `sok_tutorial.embedding.index`
gives a key a row on first sight). The SOK layers flatten keys, ask their table for vectors and
combine them; sharding is `sok_tutorial.embedding.sharding.ShardedTable`, the same object split
over replicas; checkpoints, export, summaries and the training cache use the public methods
below and, for rows by key (export, check, restore, read, write), those of
`sok_tutorial.embedding.table_rows.RowsByKey`; the lookup itself is
`sok_tutorial.embedding.table_lookup.KeysToVectors`. `tables_of` finds a model's tables, `table_of`
the table owning a variable (how the sparse optimizers recognise tables).

A lookup, in TensorFlow ops (no Python in the graph)::

    keys [K] --unique--> keys [U] --index--> rows [U] --gather--> vectors [U, dim] --expand--> [K, dim]

Keys are deduplicated first, so the index and the gather see every distinct key once (a step
of 26 x 8192 Zipf keys holds ~114k distinct among 213k). The gradient flows back the same way:
the expand's gradient sums the K rows of upstream gradient into U with one sparse matrix
product, faster on a CPU than ``tf.math.unsorted_segment_sum`` (``benchmarks/embedding.py``,
``reduce``, times the two side by side). The table receives a `UniqueRowsGradient`
(`sok_tutorial.embedding.ops`), which tells the sparse optimizers that its rows are distinct
and already summed, so they skip their own deduplication. Where TensorFlow combines gradients
(a table looked up twice in one step, or all-reduced over replicas), it arrives as a plain
``tf.IndexedSlices`` and the optimizers deduplicate it as before.

Example:
    >>> table = EmbeddingTable(capacity=100, dim=4, name="items")
    >>> table(tf.constant([[10, 2**40], [10, -3]], tf.int64), training=True).shape
    TensorShape([2, 2, 4])
    >>> table.size, sorted(table.export()["keys"].tolist())
    (3, [-3, 10, 1099511627776])
"""
from __future__ import annotations

import copy
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import heap_reuse, huge_pages, lifecycle
from sok_tutorial.embedding import index as key_index
from sok_tutorial.embedding.initializers import KeyedInitializer, init_spec, keyed_initial_values
from sok_tutorial.embedding.lifecycle_state import LifecycleState
from sok_tutorial.embedding.ops import in_shape_trace, local_components
from sok_tutorial.embedding.precision import DenseOptimizerGuard, Precision
from sok_tutorial.embedding.table_ahead import RowsAhead
from sok_tutorial.embedding.table_lookup import KeysToVectors
from sok_tutorial.embedding.table_rows import RowsByKey

_OWNER = "_sok_tutorial_table"  # set on a table's variable objects: a weak reference to the table


def table_of(variable: Any) -> EmbeddingTable | None:
    """The table owning `variable` (its Keras variable, the tf.Variable behind it, or a replica's
    component of it), or None for any other variable. The mark lives on the variable objects
    themselves, so a new variable never inherits a dead one's table."""
    owner = getattr(variable, _OWNER, None)
    return owner() if isinstance(owner, weakref.ref) else None


def optimizer_config(optimizer: Any) -> dict[str, Any] | None:
    """A table's own optimizer as Keras serialises it (its hyperparameters, not its slots)."""
    return None if optimizer is None else keras.saving.serialize_keras_object(optimizer)


def optimizer_from_config(optimizer: Any) -> Any:
    """The optimizer of `optimizer_config` again (anything else passes through unchanged)."""
    if not isinstance(optimizer, dict):
        return optimizer
    try:
        return keras.saving.deserialize_keras_object(copy.deepcopy(optimizer))  # Keras edits what it reads
    except (TypeError, ValueError) as exc:
        raise TypeError(f"optimizer={optimizer.get('class_name')!r} could not be rebuilt from its config: "
                        "import sok_tutorial.optimizers (which registers the sparse optimizers with Keras) "
                        f"before from_config or load_model ({exc})") from exc


def tables_of(model: Any) -> list[EmbeddingTable]:
    """The embedding tables of a Keras model or layer, in a stable order (the order of its layers)."""
    if isinstance(model, EmbeddingTable):
        return [model]
    found = [layer for layer in model._flatten_layers(include_self=True) if isinstance(layer, EmbeddingTable)]
    return list({id(t): t for t in found}.values())


@keras.saving.register_keras_serializable(package="sok_tutorial")
class EmbeddingTable(KeysToVectors, RowsByKey, RowsAhead, keras.layers.Layer):
    """An embedding table: int keys (any shape) -> vectors (``keys.shape + [dim]``).

    Args:
        capacity: rows of the table (``max_vocabulary_size_per_gpu`` in the SOK layers).
        dim: width of a vector.
        dynamic: any int64 key gets a row on first sight in a training call (`inserting`:
            ``training=True``, or a call under a gradient tape), up to `capacity` keys, then
            `VocabularyExhausted`; other calls embed keys never seen to zeros. ``False``: keys are
            row ids in ``[0, capacity)``.
        initializer: a Keras initializer (uniform, normal, truncated normal, constant), drawn per key.
        optimizer: this table's own optimizer (one of `sok_tutorial.optimizers`), used instead of the
            model's for this table's rows; None: the model's optimizer updates it.
        eviction_policy: ``"lru"``, ``"lfu"`` or ``"ttl"``: a full table evicts rows instead of
            raising `VocabularyExhausted` (None), within buckets of ``bucket_capacity`` rows (a
            power of two up to 1024; the capacity is rounded up to whole buckets). With ``ttl`` (steps) or
            ``ttl_seconds``, ``lfu_halflife`` (steps per halving of LFU counts), ``eviction_log``
            (evicted keys remembered for delta exports): see `sok_tutorial.embedding.lifecycle`.
        min_count: a new key gets a row once seen this many times, at most 2048 (counted in a
            count-min sketch of ``sketch_depth x sketch_width`` float16 counters; by default 2
            counters a row per row of capacity); before, it embeds to zeros.
            ``admit_probability``: admit a new key with this probability.
        track_changes: remember which rows changed and when, for delta exports (on with a policy).
            An option of a feature that is off (``bucket_capacity`` or ``eviction_log`` without a
            policy, ``lfu_halflife`` without ``"lfu"``, ``sketch_*`` without ``min_count > 1``) is
            refused unless it is at its default.
        storage_dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``: the type rows are stored in
            (lookups and updates compute in float32); ``stochastic_rounding``: round updates to it
            stochastically instead of to nearest; ``slot_dtype``: the optimizer slots' type,
            ``"float32"`` or ``"storage"`` (the table's). See `sok_tutorial.embedding.precision`.
    """

    def __init__(self, capacity: int, dim: int, *, dynamic: bool = True, initializer: Any = "random_uniform",
                 optimizer: Any = None, eviction_policy: str | None = None, ttl: int | None = None,
                 ttl_seconds: float | None = None, lfu_halflife: int = 1000, bucket_capacity: int = 8,
                 min_count: int = 1, admit_probability: float = 1.0, sketch_depth: int = 4,
                 sketch_width: int | None = None, track_changes: bool = False, eviction_log: int | None = None,
                 storage_dtype: str = "float32", stochastic_rounding: bool = False, slot_dtype: str = "float32",
                 **kwargs: Any):
        lifecycle.refuse_removed(kwargs.get("name", "EmbeddingTable"), kwargs)
        super().__init__(**kwargs)
        self.precision = Precision.create(self.name, storage_dtype, stochastic_rounding, slot_dtype)
        self.optimizer = optimizer_from_config(optimizer)
        self.capacity = checks.positive_int("capacity", capacity)
        self.dim = checks.positive_int("dim", dim)
        self.dynamic = checks.flag("dynamic", dynamic)
        self.init = init_spec(initializer)
        self.lifecycle = lifecycle.Lifecycle.create(
            self.name, self.capacity, self.dynamic, eviction_policy=eviction_policy, ttl=ttl, ttl_seconds=ttl_seconds,
            lfu_halflife=lfu_halflife, bucket_capacity=bucket_capacity, min_count=min_count,
            admit_probability=admit_probability, sketch_depth=sketch_depth, sketch_width=sketch_width,
            track_changes=track_changes, eviction_log=eviction_log)
        self.capacity = self.lifecycle.rows(self.capacity)  # whole buckets
        self.state = LifecycleState(self.name, self.lifecycle, self.capacity)  # its variables come with `build`
        self.num_shards, self.local_shards, self.strategy = 1, [0], None

    # ------------------------------------------------------------------ state
    @property
    def indexed(self) -> bool:
        """Whether rows are assigned by the dynamic index (else row = key)."""
        return self.dynamic

    @property
    def column_groups(self) -> int:
        """Groups of replicas that each hold a slice of the width (1: every replica holds whole rows)."""
        return 1

    def build(self, input_shape: Any = None) -> None:
        if self.built:
            return
        self.variable = self.add_weight(name="embedding_variable", shape=(self.capacity, self.dim), autocast=False,
                                        initializer=self._initializer(), trainable=True,
                                        dtype=self.precision.storage)
        if self.precision.low:  # a Keras dense optimizer would update it in 16 bits: refused
            self.variable.constraint = DenseOptimizerGuard(self.name, self.precision.storage)
        if self.indexed and not self.lifecycle.evicts:  # (a table that evicts has a bucketed index)
            slots, capacity = key_index.num_slots(self.capacity), self.capacity
            self._slots = self.add_weight(name="slots", shape=(slots, 2), dtype="int64", trainable=False,
                                          initializer=keras.initializers.Constant(-1))
            self._row_keys = self.add_weight(name="row_keys", shape=(capacity,), dtype="int64", trainable=False,
                                             initializer="zeros")
            self._size = self.add_weight(name="size", shape=(), dtype="int64", trainable=False, initializer="zeros")
        if self.lifecycle.active:
            self.state.create(self)
        self._mark_variables()
        super().build(input_shape)

    def _mark_variables(self) -> None:
        """Mark the variable objects as this table's (`table_of`). Keras creates the TensorFlow
        variable behind a Keras one later when a model is built in a symbolic pass, so each
        lookup marks it again if it is new."""
        behind = [] if in_shape_trace(self.variable) else [self.variable.value, *local_components(self.variable)]
        fresh = False
        for v in (self.variable, *behind):
            if table_of(v) is not self:
                setattr(v, _OWNER, weakref.ref(self))
                fresh = True
        if fresh and behind:  # the TensorFlow variables are new: no step has updated them yet
            huge_pages.advise(self.weights)
            heap_reuse.keep_freed_memory()  # (once per process: the steps' temporaries stay in malloc's heaps)

    def _initializer(self) -> KeyedInitializer:
        return KeyedInitializer(self.init.kind, self.init.a, self.init.b, self.init.seed, dynamic=self.indexed)

    def index_variables(self, component: int | None = None) -> key_index.IndexVariables:
        """The index variables: mirrored ones (replica context writes its own copy) or one shard's."""
        if component is None:
            return key_index.IndexVariables(self._slots.value, self._row_keys.value, self._size.value)
        return key_index.IndexVariables(*(local_components(v)[component]
                                          for v in (self._slots, self._row_keys, self._size)))

    @property
    def buckets(self) -> Any:
        """The bucketed key index of a table with an eviction policy (None without one)."""
        return self.state.buckets

    def shard_states(self) -> list[LifecycleState]:
        """The lifecycle state of each distinct shard in this process (replicas that hold the same keys,
        as the column slices of one row group do, share one)."""
        return [self.state.local(c) for c in range(len(self.local_shards))]

    @property
    def size(self) -> int:
        """Keys with a row (this process's shards): the rows in use."""
        if not self.indexed:
            return self.capacity * len(self.local_shards)
        if self.lifecycle.evicts:
            return sum(len(state.live()[0]) for state in self.shard_states())
        return sum(int(local_components(self._size)[i].numpy()) for i in range(len(self.local_shards)))

    @property
    def evictions(self) -> int:
        """Keys evicted so far (0 for a table without an eviction policy)."""
        return sum(state.evictions() for state in self.shard_states()) if self.built else 0

    @property
    def unplaced(self) -> int:
        """New keys that found every row of their bucket in use by their own step, so got no row
        that step (0 for a table without an eviction policy)."""
        return sum(state.unplaced_keys() for state in self.shard_states()) if self.built else 0

    @property
    def index_bytes_per_row(self) -> int:
        """Memory of the key index per row of capacity: the bucketed index's keys, marks and counts,
        or the open-addressing index's slots and row keys (0 for a table of row ids)."""
        if not self.indexed:
            return 0
        if self.buckets is not None:
            return self.buckets.bytes_per_row
        return key_index.index_bytes(self.capacity) // self.capacity

    def optimizer_slots(self, optimizer: Any) -> list[Any]:
        """The variables of `optimizer` holding per-row state of this table (first dimension = rows);
        a table with its own optimizer (`optimizer` argument) always answers with that one's."""
        optimizer = self.optimizer if self.optimizer is not None else optimizer
        if optimizer is None or not getattr(optimizer, "built", False) or not self.built:
            return []
        prefix = self.variable.path.replace("/", "_") + "_"  # Keras names slots "<variable path>_<slot>"
        return [v for v in optimizer.variables
                if v.name.startswith(prefix) and len(v.shape) and int(v.shape[0]) == self.capacity]

    def fresh_rows(self, rows: tf.Tensor) -> tf.Tensor | None:
        """Which of `rows` (distinct) went to a new key since an optimizer last updated them, clearing
        the mark: the optimizer then starts their slots afresh. None for a table that never gives a
        row a second key (no eviction), where a row's slots start at zero anyway."""
        return self.state.fresh_rows(rows)

    def initial_values(self, keys: Any) -> np.ndarray:
        """The key-seeded initial vectors of `keys` ``[n, dim]`` (NumPy)."""
        return keyed_initial_values(keys, self.dim, self.init)

    def call(self, keys: Any, training: Any = None) -> tf.Tensor:
        return self.lookup(keys, training)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*input_shape, self.dim)

    def load_own_variables(self, store: Any) -> None:
        """Keras weights files: a table with a policy refuses weights of another index layout (an older
        format, or another ``bucket_capacity``) with a message saying so, before writing anything. A
        table without one takes the earlier format of its index too (``slot_rows`` ``[S]``: a slot
        held its row only), each slot's key put back beside its row (`key_index.slots_of_rows`)."""
        if self.indexed and not self.lifecycle.evicts:
            position = {id(v): str(i) for i, v in enumerate(self._trainable_variables + self._non_trainable_variables)}
            at = position[id(self._slots)]
            earlier = store[at] if at in store.keys() else None  # (a count mismatch: Keras says so)
            if earlier is not None and len(earlier.shape) == 1 and earlier.shape[0] == self._slots.shape[0]:
                keys = store[position[id(self._row_keys)]]
                store = {**{k: store[k] for k in store.keys()}, at: key_index.slots_of_rows(earlier, keys)}
        if self.lifecycle.evicts:
            mine = [tuple(v.shape) for v in self.variables]
            theirs = [tuple(store[str(i)].shape) for i in range(len(store.keys()))]
            if mine != theirs:
                raise ValueError(
                    f"{self.name}: these weights hold another key index layout ({len(theirs)} variables; this table "
                    f"has the bucketed index of bucket_capacity={self.lifecycle.bucket_capacity}, {len(mine)} "
                    "variables: row_keys [buckets, bucket_capacity], row_seen and the eviction log). Load them into "
                    "a table built the same way, or move the rows by key: save_checkpoint, then load_checkpoint "
                    "(sok_tutorial.training), which re-hashes every key into this table's buckets")
        super().load_own_variables(store)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self.lifecycle.config(), **self.precision.config(),
                "capacity": self.capacity, "dim": self.dim, "dynamic": self.dynamic,
                "optimizer": optimizer_config(self.optimizer),
                "initializer": {"class_name": "KeyedInitializer", "config": self._initializer().get_config()}}
