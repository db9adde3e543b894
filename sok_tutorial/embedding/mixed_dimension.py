"""Mixed-dimension embeddings: frequent ids get wide vectors, rare ids narrow ones.

Ids are assumed sorted by frequency, id 0 the most frequent (`frequency_order` gives the
remapping from counts). The vocabulary is split into blocks of consecutive ids; block ``i``
has its own table of width ``d_i`` and, when ``d_i`` is below the common width ``D``, a
projection ``P_i`` (``d_i x D``, no bias) so every key's vector is ``D`` wide::

    block_sizes [2, 3, 5]     ids 0 1 | 2 3 4 | 5 6 7 8 9
    block_dims  [8, 4, 2]     table_0 [2, 8]   table_1 [3, 4]   table_2 [5, 2]
    key 6  ->  block 2, row 6 - 5 = 1  ->  table_2[1] @ P_2  ([2] @ [2, 8] -> [8])

The paper's rule gives block ``i`` the width ``d_i = D (p_i / max_j p_j) ** alpha``, ``p_i``
the popularity of one of its rows (lookups of the block over its rows): `mixed_dimensions`.
`frequency_blocks` sizes a feature's layer from its ids' counts: ranks, blocks and widths.

References:
    A. Ginart, M. Naumov, D. Mudigere, J. Yang, J. Zou, "Mixed Dimension Embeddings with
    Application to Memory-Efficient Recommendation Systems", ISIT 2021 (arXiv:1909.11810).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding.compositional import ComposedEmbedding, bad, integer, label
from sok_tutorial.embedding.table import EmbeddingTable


def frequency_order(counts: Any) -> tuple[np.ndarray, np.ndarray]:
    """(order, inverse) of ids by decreasing count: ``order[rank]`` is the id of that rank (ties by
    id), ``inverse[id]`` its rank, the key to give a `MixedDimensionEmbedding`.

    Example:
        >>> order, inverse = frequency_order([5, 40, 0, 40])
        >>> order.tolist(), inverse.tolist()
        ([1, 3, 0, 2], [2, 0, 3, 1])
    """
    counts = np.asarray(counts)
    if counts.ndim != 1 or (counts.size and counts.min() < 0):
        raise ValueError(f"counts must be a 1-D array of non-negative counts, got shape {counts.shape}")
    order = np.argsort(-counts, kind="stable").astype(np.int64)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order), dtype=np.int64)
    return order, inverse


def mixed_dimensions(block_sizes: Sequence[int], base_dim: int, alpha: float = 0.3, *,
                     block_counts: Sequence[float] | None = None, min_dim: int = 1) -> list[int]:
    """Widths of the blocks by the power-law rule ``d_i = base_dim (p_i / max p) ** alpha``, rounded,
    clipped to ``[min_dim, base_dim]``.

    Args:
        block_sizes: rows of each block.
        base_dim: the width of the most popular block (the common width).
        alpha: 0 gives every block `base_dim`; larger shrinks unpopular blocks faster (the paper
            finds 0.2-0.3 best on Criteo).
        block_counts: lookups of each block (say, in a sample of the training data). None: every
            block is looked up equally often, as the tables of separate features are (one key per
            sample each) and as the decades of a Zipf(1) feature are, so ``p_i ~ 1 / block_sizes[i]``.
        min_dim: the narrowest width.

    Example:
        >>> mixed_dimensions([10, 100, 1000], 16, alpha=0.5)  # p ~ 1/10, 1/100, 1/1000
        [16, 5, 2]
        >>> mixed_dimensions([10, 100, 1000], 16, alpha=0.3, block_counts=[50, 30, 20])
        [16, 7, 3]
    """
    base_dim, min_dim = checks.positive_int("base_dim", base_dim), checks.positive_int("min_dim", min_dim)
    if min_dim > base_dim:
        raise ValueError(f"min_dim={min_dim} is invalid: expected at most base_dim={base_dim}")
    sizes = np.asarray(block_sizes, np.float64)
    if sizes.ndim != 1 or not sizes.size or (sizes < 1).any():
        raise ValueError(f"block_sizes={block_sizes!r} is invalid: expected one or more positive row counts")
    counts = np.ones_like(sizes) if block_counts is None else np.asarray(block_counts, np.float64)
    if counts.shape != sizes.shape or (counts < 0).any() or not counts.any():
        raise ValueError(f"block_counts={block_counts!r} is invalid: expected {len(sizes)} non-negative counts, "
                         "not all zero")
    popularity = counts / sizes
    dims = np.rint(base_dim * (popularity / popularity.max()) ** alpha)
    return [int(d) for d in np.clip(dims, min_dim, base_dim)]


class FrequencyBlocks(NamedTuple):
    """A feature's mixed-dimension layout (`frequency_blocks`)."""

    block_sizes: list[int]  # ids per block, most frequent first: a `MixedDimensionEmbedding`'s block_sizes
    block_dims: list[int]  # each block's width: its block_dims
    inverse: np.ndarray  # inverse[id]: the id's rank by count, the key the layer takes (`frequency_order`)


def frequency_blocks(counts: Any, fractions: Sequence[float], base_dim: int, alpha: float = 0.3, *,
                     min_dim: int = 1) -> FrequencyBlocks:
    """Blocks and widths of a `MixedDimensionEmbedding` for one feature, from its ids' counts.

    The ids are ranked by count (`frequency_order`) and cut into consecutive blocks holding
    `fractions` of them, most frequent first (each block at least one id, the last the ids the
    others leave); each block's width follows from its share of the lookups (`mixed_dimensions`
    with ``block_counts``), so a block of rare ids gets a narrow table however many ids it holds.

    Args:
        counts: ``[V]`` non-negative lookups of each id ``0 .. V-1``, say ``np.bincount`` of the
            feature's training column with ``minlength=V``.
        fractions: the blocks' shares of the ``V`` ids, positive, adding up to 1.
        base_dim, alpha, min_dim: as in `mixed_dimensions` (the widest block is `base_dim` wide).

    Returns:
        `FrequencyBlocks`: ``block_sizes`` and ``block_dims`` for the layer, and ``inverse``, the
        remapping from ids to the ranked keys the layer looks up.

    Example:
        >>> counts = [5, 40, 0, 40, 1, 2, 0, 0, 3, 9]  # ids 1 and 3 most often, then 9, 0, 8, ...
        >>> blocks = frequency_blocks(counts, [0.2, 0.3, 0.5], 8, alpha=0.5)
        >>> blocks.block_sizes, blocks.block_dims  # lookups per row: 80/2, 17/3, 3/5
        ([2, 3, 5], [8, 3, 1])
        >>> blocks.inverse[[1, 3, 9]].tolist()  # the most frequent ids are keys 0, 1, 2
        [0, 1, 2]
    """
    counts = np.asarray(counts)
    order, inverse = frequency_order(counts)
    shares = np.asarray(fractions, np.float64)
    if shares.ndim != 1 or not shares.size or not (shares > 0).all() or abs(shares.sum() - 1) > 1e-6:
        raise ValueError(f"fractions={fractions!r} is invalid: expected one or more positive shares of the ids "
                         "adding up to 1")
    if len(counts) < len(shares):
        raise ValueError(f"counts has {len(counts)} ids, fewer than the {len(shares)} blocks of "
                         f"fractions={fractions!r}: expected at least one id per block")
    sizes = [max(1, int(f * len(counts))) for f in shares[:-1]]
    sizes.append(len(counts) - sum(sizes))
    if sizes[-1] < 1:
        raise ValueError(f"fractions={fractions!r} leave no id of {len(counts)} for the last block: expected at "
                         "least one id per block")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    block_counts = np.add.reduceat(counts[order].astype(np.float64), starts)
    dims = mixed_dimensions(sizes, base_dim, alpha, block_counts=block_counts, min_dim=min_dim)
    return FrequencyBlocks(sizes, dims, inverse)


@keras.saving.register_keras_serializable(package="sok_tutorial")
class MixedDimensionEmbedding(ComposedEmbedding):
    """Keys (frequency-ranked ids) -> ``table_i[key - start_i] @ P_i`` of their block ``i``, combined per slot.

    Args:
        combiner: ``"sum"``, ``"mean"``, ``"sqrtn"`` or None, as in `DistributedEmbedding`.
        block_sizes: rows of each block, most frequent ids first; the vocabulary is their sum.
        embedding_vec_size: the common output width ``D``.
        block_dims: each block's width in ``[1, D]``; None: `mixed_dimensions` with `alpha`
            and `min_dim`. A block of width ``D`` has no projection.
        alpha, min_dim: the power-law rule's exponent and narrowest width.
        slot_num, max_nnz, max_feature_num, key_dtype, embedding_initializer, sequence_output,
            optimizer: as in `DistributedEmbedding`. Each block's table draws from the
            initializer with its own seed; projections start Glorot-uniform.

    Example:
        >>> layer = MixedDimensionEmbedding("mean", [10, 100, 1000], 16, alpha=0.5, slot_num=2)
        >>> layer.block_dims, layer.num_parameters  # 10*16 + 100*5 + 1000*2 + (5 + 2)*16
        ([16, 5, 2], 2772)
        >>> layer(tf.constant([[0, 1009], [57, 3]], tf.int64)).shape
        TensorShape([2, 2, 16])
    """

    def __init__(self, combiner: str | None, block_sizes: Sequence[int], embedding_vec_size: int, *,
                 block_dims: Sequence[int] | None = None, alpha: float = 0.3, min_dim: int = 1, **kwargs: Any):
        layer = label(type(self), kwargs.get("name"))
        sizes = list(block_sizes) if isinstance(block_sizes, (list, tuple, np.ndarray)) else None
        if not sizes or not all(integer(s) and s >= 1 for s in sizes):
            raise bad(layer, "block_sizes", block_sizes, "a non-empty sequence of positive integers (rows per block)")
        super().__init__(combiner, int(sum(sizes)), embedding_vec_size, **kwargs)
        dim, layer = self.embedding_vec_size, label(type(self), self.name)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha >= 0:
            raise bad(layer, "alpha", alpha, "a number >= 0")
        if not integer(min_dim) or not 1 <= min_dim <= dim:
            raise bad(layer, "min_dim", min_dim, f"an integer in [1, embedding_vec_size={dim}]")
        self.block_sizes, self.alpha, self.min_dim = [int(s) for s in sizes], float(alpha), int(min_dim)
        if block_dims is None:
            block_dims = mixed_dimensions(self.block_sizes, dim, self.alpha, min_dim=self.min_dim)
        dims = list(block_dims) if isinstance(block_dims, (list, tuple, np.ndarray)) else None
        if dims is None or len(dims) != len(sizes) or not all(integer(d) and 1 <= d <= dim for d in dims):
            raise bad(layer, "block_dims", block_dims, f"{len(sizes)} integers (one per block) in "
                      f"[1, embedding_vec_size={dim}]")
        self.block_dims = [int(d) for d in dims]
        self.ends = np.cumsum(self.block_sizes).astype(np.int64)
        self.starts = self.ends - np.asarray(self.block_sizes, np.int64)
        self.block_tables: list[EmbeddingTable] = []
        self.block_projections: list[Any] = []

    @property
    def tables(self) -> list[EmbeddingTable]:
        return list(self.block_tables)

    @property
    def projections(self) -> list[Any]:
        return [p for p in self.block_projections if p is not None and p.built]

    def _make(self, common: dict[str, Any]) -> None:
        tables, projections = [], []
        for i, (rows, width) in enumerate(zip(self.block_sizes, self.block_dims)):
            init = {"class_name": "KeyedInitializer", "config": {"kind": self.init.kind, "a": self.init.a,
                                                                 "b": self.init.b, "seed": self.init.seed + i}}
            tables.append(EmbeddingTable(rows, width, initializer=init, name=f"{self.name}_block{i}", **common))
            projection = None
            if width < self.embedding_vec_size:
                projection = keras.layers.Dense(self.embedding_vec_size, use_bias=False, dtype=self.dtype_policy,
                                                name=f"{self.name}_projection{i}")
                projection.build((None, width))
            projections.append(projection)
        self.block_tables, self.block_projections = tables, projections

    def _compose(self, keys: tf.Tensor, training: Any) -> tf.Tensor:
        n = len(self.block_sizes)
        block = tf.searchsorted(tf.constant(self.ends), keys, side="right", out_type=tf.int32)  # (K,)
        rows = tf.dynamic_partition(keys - tf.gather(tf.constant(self.starts), block), block, n)
        where = tf.dynamic_partition(tf.range(tf.size(keys)), block, n)
        vectors = []
        for table, projection, part in zip(self.block_tables, self.block_projections, rows):
            v = table.lookup(part, training)  # (K_i, d_i)
            vectors.append(v if projection is None else tf.cast(projection(v), v.dtype))  # (K_i, D)
        return tf.dynamic_stitch(where, vectors)  # (K, D)

    @property
    def num_parameters(self) -> int:
        dim = self.embedding_vec_size
        return sum(rows * d + (d * dim if d < dim else 0) for rows, d in zip(self.block_sizes, self.block_dims))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        del config["vocabulary_size"]
        return {**config, "block_sizes": self.block_sizes, "block_dims": self.block_dims, "alpha": self.alpha,
                "min_dim": self.min_dim}
