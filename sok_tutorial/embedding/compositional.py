"""Tables that fit: quotient-remainder (`QREmbedding`) and mixed-dimension
(`MixedDimensionEmbedding`, in `sok_tutorial.embedding.mixed_dimension`) embeddings.

Both are `DistributedEmbedding` layers whose one big table is replaced by a few small
`EmbeddingTable` s of row ids (``dynamic=False``), composed per key. Keys, combiners
(``"sum"``, ``"mean"``, ``"sqrtn"``, None), ``sp_weights``, ``slot_num``, ``max_nnz``, ragged,
sparse and dense key layouts are `DistributedEmbedding`'s; keys are ids in
``[0, vocabulary_size)``, anything else is an error. The sub-tables are ordinary tables, so the
sparse optimizers update only their touched rows, checkpoints find them (`tables_of`) and the
summaries count them. ``layer.num_parameters`` and ``layer.bytes`` give the memory the layer's
weights take (optimizer slots not included), for plots of memory against quality.

A quotient-remainder lookup, ``c = num_collisions``::

    key k --> quotient row  k // c   (ceil(vocabulary_size / c) rows) --> q
          \\-> remainder row k %  c   (c rows)                         --> r
    vector = q * r  ("mult")  |  q + r  ("add")  |  [q, r]  ("concat", each half as wide)

Two keys share a quotient row or a remainder row, never both (the partitions are
complementary), so every key keeps a vector of its own while the tables hold
``ceil(V / c) + c`` rows instead of ``V``.

References:
    H.-J. M. Shi, D. Mudigere, M. Naumov, J. Yang, "Compositional Embeddings Using Complementary
    Partitions for Memory-Efficient Recommendation Systems", KDD 2020 (arXiv:1909.02107).
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.initializers import InitSpec, KeyedInitializer
from sok_tutorial.embedding.layers import DistributedEmbedding
from sok_tutorial.embedding.ops import ids_below
from sok_tutorial.embedding.table import EmbeddingTable, optimizer_config
from sok_tutorial.embedding.unique_keys import as_keys

OPERATIONS = ("mult", "add", "concat")
_NOT_OPTIONS = ("use_hashtable", "sharding", "exchange", "slot_sizes", "max_vocabulary_size_per_gpu")


def bad(layer: str, name: str, value: Any, expected: str) -> ValueError:
    """The error of a bad constructor argument: the layer, the argument, its value, what was expected."""
    return ValueError(f"{layer}: {name}={value!r} is invalid: expected {expected}")


def label(layer: type, name: str | None) -> str:
    """How errors name a layer: its class, and its name when it has one (``QREmbedding 'items'``)."""
    return f"{layer.__name__} {name!r}" if name else layer.__name__


def integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class ComposedEmbedding(DistributedEmbedding):
    """A `DistributedEmbedding` whose vectors are composed from several tables of row ids.

    Subclasses make the tables (`_make`), compose the vectors of in-range keys (`_compose`) and
    count their parameters (`num_parameters`).
    """

    def __init__(self, combiner: str | None, vocabulary_size: int, embedding_vec_size: int, *, slot_num: int = 1,
                 max_nnz: int = 1, max_feature_num: int | None = None, key_dtype: Any = "int64",
                 embedding_initializer: Any = "random_uniform", sequence_output: str = "ragged",
                 optimizer: Any = None, **kwargs: Any):
        layer = label(type(self), kwargs.get("name"))
        for name in _NOT_OPTIONS:
            if name in kwargs:
                raise ValueError(f"{layer}: {name} is not an option: the layer's tables hold row ids "
                                 "[0, vocabulary_size), whole on every replica")
        if not integer(vocabulary_size) or vocabulary_size < 1:
            raise bad(layer, "vocabulary_size", vocabulary_size, "a positive integer")
        super().__init__(combiner, int(vocabulary_size), embedding_vec_size, slot_num, max_nnz, max_feature_num,
                         use_hashtable=False, key_dtype=key_dtype, embedding_initializer=embedding_initializer,
                         sequence_output=sequence_output, optimizer=optimizer, **kwargs)
        self.vocabulary_size = int(vocabulary_size)

    # ------------------------------------------------------------------ tables
    @property
    def tables(self) -> list[EmbeddingTable]:
        """The layer's tables (empty until it is built)."""
        return []

    @property
    def projections(self) -> list[Any]:
        """Dense layers mapping table vectors to the common width (none by default)."""
        return []

    def build(self, input_shape: Any = None) -> None:
        if not self.tables:
            self._make({"dynamic": False, "optimizer": self.table_optimizer, **self.table_options})
            for table in self.tables:
                table.build()
        keras.layers.Layer.build(self, input_shape)

    def _make(self, common: dict[str, Any]) -> None:
        raise NotImplementedError

    def _compose(self, keys: tf.Tensor, training: Any) -> tf.Tensor:
        raise NotImplementedError

    @property
    def embedding_variable(self) -> Any:
        raise AttributeError(f"{self.name}: a {type(self).__name__} holds several tables, not one variable; "
                             "see .tables and .embedding_weights")

    # ------------------------------------------------------------------ memory
    @property
    def embedding_weights(self) -> list[Any]:
        """Every weight of the embedding (tables, then projections) once built, else []."""
        return [t.variable for t in self.tables] + [p.kernel for p in self.projections]

    @property
    def num_parameters(self) -> int:
        """Numbers the layer's weights hold (tables and projections; optimizer slots not included)."""
        raise NotImplementedError

    @property
    def bytes(self) -> int:
        """Bytes of the layer's weights: of the built variables, or float32 numbers before `build`."""
        weights = self.embedding_weights
        if not weights:
            return 4 * self.num_parameters
        return int(sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in weights))

    # ------------------------------------------------------------------ keys -> vectors
    def _vectors(self, flat_keys: Any, training: Any, slots: Any = None) -> tf.Tensor:
        if not self.built:
            self.build()
        flat_keys = as_keys(flat_keys)  # a `UniqueKeys`: its tables deduplicate their own ids
        message = f"{self.name}: negative key or key out of range [0, {self.vocabulary_size}); keys are ids " \
                  "(vocabulary_size)"
        keys = ids_below(flat_keys, self.vocabulary_size, message)
        return self._compose(keys, training)  # (K, embedding_vec_size)

    def get_config(self) -> dict[str, Any]:
        init = KeyedInitializer(self.init.kind, self.init.a, self.init.b, self.init.seed).get_config()
        return {**keras.layers.Layer.get_config(self), **self.table_options, "combiner": self.combiner,
                "vocabulary_size": self.vocabulary_size, "embedding_vec_size": self.embedding_vec_size,
                "slot_num": self.slot_num, "max_nnz": self.max_nnz, "max_feature_num": self.max_feature_num,
                "key_dtype": self.key_dtype, "sequence_output": self.sequence_output,
                "optimizer": optimizer_config(self.table_optimizer),
                "embedding_initializer": {"class_name": "KeyedInitializer", "config": init}}


@keras.saving.register_keras_serializable(package="sok_tutorial")
class QREmbedding(ComposedEmbedding):
    """Quotient-remainder embedding: key ``k`` -> ``q[k // c] op r[k % c]``, ``c = num_collisions``.

    Args:
        combiner: ``"sum"``, ``"mean"``, ``"sqrtn"`` or None, as in `DistributedEmbedding`.
        vocabulary_size: keys are ids in ``[0, vocabulary_size)``.
        embedding_vec_size: width of an output vector.
        num_collisions: ``c``, keys sharing a quotient row, in ``[1, vocabulary_size]``; the
            quotient table has ``ceil(vocabulary_size / c)`` rows, the remainder table ``c``.
        operation: ``"mult"`` (element-wise product, the paper's best), ``"add"`` or ``"concat"``
            (each table half as wide; `embedding_vec_size` must be even).
        slot_num, max_nnz, max_feature_num, key_dtype, sequence_output, optimizer: as in
            `DistributedEmbedding`, and ``sp_weights`` in `call`.
        embedding_initializer: the quotient table's initializer (and, for ``"add"`` and
            ``"concat"``, the remainder's, drawn with ``seed + 1`` so the two tables' rows of the
            same id are unrelated). With ``"mult"`` the remainder table starts uniform in
            ``[0.5, 1.5]``: a product of two small draws (say both in ``[-0.05, 0.05]``) would
            start ~400 times smaller than a plain table's vectors and pass tiny gradients to both
            tables; a factor near 1 keeps the quotient's scale (outputs and gradients as a
            plain table's), stays positive so it never cancels what the quotient row learns, and
            spreads enough that the ``c`` keys sharing a quotient row start apart.

    Example:
        >>> layer = QREmbedding("sum", 1000, 8, num_collisions=4, slot_num=2, max_nnz=3)
        >>> keys = tf.ragged.constant([[[10, 999], []], [[10], [7, 7, 7]]], dtype=tf.int64, ragged_rank=2)
        >>> layer(keys).shape
        TensorShape([2, 2, 8])
        >>> [(t.capacity, t.dim) for t in layer.tables], layer.num_parameters  # (250 + 4) * 8
        ([(250, 8), (4, 8)], 2032)

    References:
        Shi et al., KDD 2020 (see the module's docstring).
    """

    def __init__(self, combiner: str | None, vocabulary_size: int, embedding_vec_size: int, *,
                 num_collisions: int = 4, operation: str = "mult", **kwargs: Any):
        super().__init__(combiner, vocabulary_size, embedding_vec_size, **kwargs)
        if not integer(num_collisions) or not 1 <= num_collisions <= self.vocabulary_size:
            raise bad(label(type(self), self.name), "num_collisions", num_collisions,
                      f"an integer in [1, vocabulary_size={self.vocabulary_size}]")
        if operation not in OPERATIONS:
            raise bad(label(type(self), self.name), "operation", operation, f"one of {OPERATIONS}")
        if operation == "concat" and self.embedding_vec_size % 2:
            raise bad(label(type(self), self.name), "embedding_vec_size", self.embedding_vec_size,
                      "an even width with operation='concat' (each table gives half of a vector)")
        self.num_collisions, self.operation = int(num_collisions), operation
        self.quotient_rows = -(-self.vocabulary_size // self.num_collisions)
        self.part_dim = self.embedding_vec_size // 2 if operation == "concat" else self.embedding_vec_size
        self.quotient: EmbeddingTable | None = None
        self.remainder: EmbeddingTable | None = None

    @property
    def tables(self) -> list[EmbeddingTable]:
        return [t for t in (self.quotient, self.remainder) if t is not None]

    def _make(self, common: dict[str, Any]) -> None:
        remainder_init = (InitSpec("uniform", 0.5, 1.5, self.init.seed + 1) if self.operation == "mult"
                          else dataclasses.replace(self.init, seed=self.init.seed + 1))
        self.quotient = EmbeddingTable(self.quotient_rows, self.part_dim, initializer=self.init,
                                       name=f"{self.name}_quotient", **common)
        self.remainder = EmbeddingTable(self.num_collisions, self.part_dim, initializer=remainder_init,
                                        name=f"{self.name}_remainder", **common)

    def _compose(self, keys: tf.Tensor, training: Any) -> tf.Tensor:
        c = tf.constant(self.num_collisions, tf.int64)
        q = self.quotient.lookup(keys // c, training)  # (K, part_dim)
        r = self.remainder.lookup(keys % c, training)  # (K, part_dim)
        if self.operation == "mult":
            return q * r
        if self.operation == "add":
            return q + r
        return tf.concat([q, r], axis=-1)

    @property
    def num_parameters(self) -> int:
        return (self.quotient_rows + self.num_collisions) * self.part_dim

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_collisions": self.num_collisions, "operation": self.operation}
