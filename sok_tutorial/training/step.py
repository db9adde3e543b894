"""`make_sok_step`: the one training step of a custom loop, on one device or N replicas.

SOK's examples write the step by hand: a ``strategy.run`` of a replica function that computes the
loss, takes the gradients, gives the embedding tables' to a sparse optimizer and the rest to a
dense one, and sums the replicas' losses. This module is that step, written once, so every
notebook and script trains with the same maths:

- **One loss convention.** Each replica averages its examples' losses over the *global* batch
  (``tf.nn.compute_average_loss``), so the replicas' gradients add up to the gradient of the mean
  loss of the whole batch, and the step returns that mean. Terms the model adds (``model.losses``,
  e.g. an L2 penalty) count once per step whatever the number of replicas. On one device this is
  exactly what ``model.fit`` computes.
- **Two optimizers or one.** The tables' variables (`split_embedding_variable_from_others`) go to
  `sparse_optimizer`, which updates only the rows the batch touched; the others to
  `dense_optimizer`. Without a `dense_optimizer` the sparse one updates both, as a model compiled
  with one of `sok_tutorial.optimizers` does in ``model.fit``.
- **One device is a strategy of one replica.** Without a `strategy` the step runs on the
  strategy in scope (TensorFlow's default one outside any scope). A global batch given as plain
  arrays is split into equal consecutive slices, one per replica; values distributed already
  (``strategy.experimental_distribute_dataset``) are used as they are.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding.unique_keys import UniqueKeys
from sok_tutorial.embedding.utils import split_embedding_variable_from_others


class SokStep:
    """The compiled step `make_sok_step` returns: ``loss = step(features, labels)``.

    Attributes:
        model, sparse_optimizer, dense_optimizer, strategy, global_batch_size: as given (the
            strategy found when none was).
        num_replicas: replicas the step runs on.
    """

    def __init__(self, model: Any, sparse_optimizer: Any, dense_optimizer: Any, loss: Any, strategy: Any,
                 global_batch_size: int):
        self.model, self.sparse_optimizer, self.dense_optimizer = model, sparse_optimizer, dense_optimizer
        self.strategy, self.global_batch_size = strategy, global_batch_size
        self.num_replicas = strategy.num_replicas_in_sync
        self._loss = loss
        self._compiled = tf.function(self._step, reduce_retracing=True)  # (UniqueKeys: distinct keys vary)

    def __call__(self, features: Any, labels: Any) -> tf.Tensor:
        """Train on one global batch; returns its mean loss (a scalar tensor)."""
        if not isinstance(tf.nest.flatten(labels)[0], tf.distribute.DistributedValues):
            features, labels = self.distribute(features, labels)
        return self._compiled(features, labels)

    def distribute(self, features: Any, labels: Any) -> tuple[Any, Any]:
        """A global batch as per-replica values: replica r gets rows ``[r * B/N, (r + 1) * B/N)``."""
        batch = int(tf.nest.flatten(labels)[0].shape[0])
        if batch != self.global_batch_size:
            raise ValueError(f"labels has {batch} rows, expected global_batch_size={self.global_batch_size}: "
                             "the loss averages over the global batch (drop the last short batch, or make a "
                             "step for its size)")
        if self.num_replicas == 1:
            return tf.nest.map_structure(lambda v: v if isinstance(v, UniqueKeys) else tf.convert_to_tensor(v),
                                         (features, labels))
        if any(isinstance(v, UniqueKeys) for v in tf.nest.flatten(features)):
            raise ValueError(f"features hold keys deduplicated ahead (UniqueKeys), which feed one replica; with "
                             f"{self.num_replicas} replicas pass the keys themselves (each replica deduplicates "
                             "its share)")
        per = batch // self.num_replicas

        def part(array: Any) -> Any:
            return self.strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.convert_to_tensor(array[ctx.replica_id_in_sync_group * per:][:per]))
        return tf.nest.map_structure(part, (features, labels))

    def _step(self, features: Any, labels: Any) -> tf.Tensor:
        per_replica = self.strategy.run(self._replica_step, args=(features, labels))
        return self.strategy.reduce("SUM", per_replica, axis=None)

    def _replica_step(self, features: Any, labels: Any) -> tf.Tensor:
        model = self.model
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            per_example = self._loss(labels, outputs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch_size)
            if model.losses:  # once per step: each replica adds its share
                loss += tf.nn.scale_regularization_loss(tf.add_n([tf.cast(x, loss.dtype) for x in model.losses]))
        variables = list(model.trainable_variables)
        grads = tape.gradient(loss, variables)
        if self.dense_optimizer is None:
            self.sparse_optimizer.apply(grads, variables)
            return loss
        tables, others = split_embedding_variable_from_others(variables)
        by_id = {id(v): g for v, g in zip(variables, grads)}
        if tables:
            self.sparse_optimizer.apply([by_id[id(v)] for v in tables], list(tables))
        if others:
            self.dense_optimizer.apply([by_id[id(v)] for v in others], list(others))
        return loss


def make_sok_step(model: Any, sparse_optimizer: Any, dense_optimizer: Any = None, *, global_batch_size: int,
                  loss: Any = None, from_logits: bool = True, strategy: Any = None) -> SokStep:
    """The training step of a custom loop: ``loss = step(features, labels)`` trains `model` on one
    global batch and returns the batch's mean loss (module docstring for the conventions).

    Args:
        model: a built Keras model (made in ``strategy.scope()`` when there are several replicas).
        sparse_optimizer: one of `sok_tutorial.optimizers`, for the embedding tables (and for
            every other variable when there is no `dense_optimizer`).
        dense_optimizer: a Keras optimizer for the variables that are not tables, or None.
        global_batch_size: rows of a global batch, all replicas together; every batch must have it.
        loss: a per-example loss ``loss(labels, outputs) -> [batch]`` (a Keras loss made with
            ``reduction=None`` works); default binary cross-entropy (``from_logits``).
        strategy: the replicas; default the strategy in scope (one replica outside any scope).

    Both optimizers are built here for the model's variables (in the strategy's scope), so their
    state exists before the first step and a checkpoint can be restored into them.

    Example:
        >>> import keras, numpy as np
        >>> import sok_tutorial as sok
        >>> from sok_tutorial.models import EmbeddingMLP
        >>> rng = np.random.default_rng(0)
        >>> users = rng.integers(0, 50, 512)
        >>> labels = (users % 2).astype("float32")[:, None]
        >>> model = EmbeddingMLP({"user": 50}, dims=4, hidden=[8])
        >>> _ = model({"user": users[:2]})
        >>> step = make_sok_step(model, sok.optimizers.Adam(0.05), keras.optimizers.Adam(0.05), global_batch_size=128)
        >>> losses = [float(step({"user": users[i:i + 128]}, labels[i:i + 128]))
        ...           for _ in range(5) for i in range(0, 512, 128)]
        >>> losses[-1] < losses[0]
        True
    """
    checks.positive_int("global_batch_size", global_batch_size)
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if global_batch_size % replicas:
        raise ValueError(f"global_batch_size={global_batch_size} does not split over {replicas} replicas: "
                         f"expected a multiple of {replicas}")
    if not getattr(model, "built", False) or not model.trainable_variables:
        raise ValueError("model: build it before making its step (call it once on a batch), so the optimizers can "
                         "make their state for its variables")
    for name, optimizer in (("sparse_optimizer", sparse_optimizer), ("dense_optimizer", dense_optimizer)):
        if (optimizer is not None or name == "sparse_optimizer") and not callable(getattr(optimizer, "apply", None)):
            raise TypeError(f"{name}={optimizer!r} is invalid: expected an optimizer (sok_tutorial.optimizers for the "
                            "tables, keras.optimizers or sok_tutorial.optimizers for the dense variables)")
    loss = loss or keras.losses.BinaryCrossentropy(from_logits=from_logits, reduction=None)
    variables = list(model.trainable_variables)
    tables, others = split_embedding_variable_from_others(variables)
    with strategy.scope():
        for optimizer, its in ((sparse_optimizer, variables if dense_optimizer is None else tables),
                               (dense_optimizer, others)):
            if optimizer is not None and its and not optimizer.built:
                optimizer.build(list(its))
    return SokStep(model, sparse_optimizer, dense_optimizer, loss, strategy, global_batch_size)


class StepsBySize:
    """`make_sok_step` for batches of any size: one step per global batch size, made on first use.

    A step averages its loss over the global batch it was made for, so a pass whose last batch is
    shorter needs a step of that batch's size: its loss is then the mean over its own rows, what
    ``model.fit`` does with a last batch. ``steps(features, labels)`` picks (or makes) the step for
    the batch's rows; ``steps.steps`` holds them by size.

    Args:
        model, sparse_optimizer, dense_optimizer, loss, from_logits, strategy: as `make_sok_step`.

    Example:
        >>> import numpy as np
        >>> import sok_tutorial as sok
        >>> from sok_tutorial.models import EmbeddingMLP
        >>> model = EmbeddingMLP({"user": 10}, dims=2, hidden=[4])
        >>> _ = model({"user": np.zeros(2, np.int64)})
        >>> steps = StepsBySize(model, sok.optimizers.SGD(0.1))
        >>> for rows in (8, 8, 3):  # two whole batches and a short one
        ...     _ = steps({"user": np.arange(rows) % 10}, np.ones((rows, 1), "float32"))
        >>> sorted(steps.steps)
        [3, 8]
    """

    def __init__(self, model: Any, sparse_optimizer: Any, dense_optimizer: Any = None, **options: Any):
        self.model, self.sparse_optimizer, self.dense_optimizer = model, sparse_optimizer, dense_optimizer
        self.options = options
        self.steps: dict[int, SokStep] = {}

    def __call__(self, features: Any, labels: Any) -> tf.Tensor:
        rows = int(tf.nest.flatten(labels)[0].shape[0])
        if rows not in self.steps:
            self.steps[rows] = make_sok_step(self.model, self.sparse_optimizer, self.dense_optimizer,
                                             global_batch_size=rows, **self.options)
        return self.steps[rows](features, labels)
