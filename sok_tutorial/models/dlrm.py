"""DLRM (Naumov et al., 2019) in Keras 3.

The bottom MLP turns the continuous features into one vector of the embedding width; every
categorical feature looks up a vector; the interaction takes the dot product of every pair of
these vectors; the top MLP maps the dot products and the bottom vector to one logit::

    continuous [B, 13] --log1p--> bottom MLP --> d [B, D]
    categorical [B, 26] --------> embeddings --> e [B, 26, D]
    T = [d; e] [B, 27, D];  Z = T T^T;  keep the 27 * 26 / 2 = 351 pairs below the diagonal
    [d, pairs] [B, D + 351] --(zero-padded to a multiple of 16)--> top MLP --> logit [B, 1]

The first top layer takes ``d`` and the pairs as two matmuls into its kernel's two blocks of rows
(`interaction_layer`): the same layer and weights, without transposing the pairs back to one row
per example or concatenating them with ``d``.

Mixed-precision matrix units work on tiles whose dimensions are multiples of 8 or 16; padding
the interaction (``pad_interaction_to=16``: 351 pairs + 16 -> 367 becomes 352 + 16 = 368) gives
the top MLP's first matmul such a width.

On a CPU the interaction and the top MLP run on slices of the batch (``interaction_slice``, 512
examples by default), one after another in the graph: a slice's Gram matrix, ``512 * 27 * 27``
floats (1.5 MB), stays in a core's L2 cache through the transpose and the gather of its pairs,
where the whole batch's would not. The outputs are the same up to rounding (the top layers'
weight gradients add up their examples slice by slice). The batch size must be known when the
step is traced (a ``ParquetLoader`` with ``drop_last``, a dataset batched with
``drop_remainder``); otherwise the batch goes whole. On a GPU (``"auto"``: the device the
step's tensors are placed on) the batch goes whole, as its kernels like it.

References:
    M. Naumov et al., "Deep Learning Recommendation Model for Personalization and
    Recommendation Systems", arXiv:1906.00091 (2019).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.embedding import DistributedEmbedding
from sok_tutorial.embedding.unique_keys import UniqueKeys, unique_keys


def _pair_indices(f: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions ``i * f + j`` of the pairs ``j < i``, and for each of the ``f * f`` positions
    of the Gram matrix the pair it holds plus one (both triangles; 0 on the diagonal)."""
    rows, cols = np.tril_indices(f, k=-1)
    pair = np.arange(1, len(rows) + 1)
    inverse = np.zeros(f * f, np.int64)
    inverse[rows * f + cols], inverse[cols * f + rows] = pair, pair
    return rows * f + cols, inverse


def pairwise_interaction(vectors: tf.Tensor, pad_to: int | None = None) -> tf.Tensor:
    """Dot products of every pair of the ``F`` vectors in ``[B, F, D]``, ``[B, F * (F - 1) / 2]``,
    zero-padded on the right to a multiple of `pad_to`.

    Example:
        >>> v = tf.constant([[[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]]])
        >>> pairwise_interaction(v).numpy().tolist()  # pairs (1,0), (2,0), (2,1)
        [[2.0, 0.0, 3.0]]
        >>> pairwise_interaction(v, pad_to=4).shape
        TensorShape([1, 4])
    """
    pairs = tf.transpose(pairs_by_column(vectors))
    if pad_to:
        pad = (-int(pairs.shape[1])) % pad_to
        if pad:
            pairs = tf.pad(pairs, [[0, 0], [0, pad]])
    return pairs


def pairs_by_column(vectors: tf.Tensor) -> tf.Tensor:
    """`pairwise_interaction` transposed, ``[F * (F - 1) / 2, B]``: one column per example.

    The pairs are the lower triangle of the Gram matrix ``T T^T``, picked out with one gather of
    whole rows of its transpose (a gather of single elements along the second axis is about
    twice as slow on CPU), and left in that layout: the next matmul takes them transposed for
    free (`interaction_layer`). The gradient is written out: the Gram matrix is symmetric, so
    ``dT = G T`` with ``G`` the pairs' gradients scattered into both triangles: one batched
    matmul instead of autodiff's two, and a gather instead of a segment sum.

    Example:
        >>> v = tf.constant([[[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]]])
        >>> pairs_by_column(v).numpy().tolist()
        [[2.0], [0.0], [3.0]]
    """
    f = vectors.shape[1]
    if f is None:
        raise ValueError("pairwise_interaction: the number of vectors (axis 1) must be known statically")
    lower, inverse = _pair_indices(f)

    @tf.custom_gradient
    def pairs_of(t: tf.Tensor) -> tuple[tf.Tensor, Any]:
        gram = tf.reshape(tf.matmul(t, t, transpose_b=True), [-1, f * f])  # (B, F*F)
        pairs = tf.gather(tf.transpose(gram), lower)  # (F(F-1)/2, B)

        def grad(g: tf.Tensor) -> tf.Tensor:
            both = tf.gather(tf.pad(g, [[1, 0], [0, 0]]), inverse)  # (F*F, B), symmetric
            return tf.matmul(tf.reshape(tf.transpose(both), [-1, f, f]), t)

        return pairs, grad

    return pairs_of(vectors)


def kernel_blocks(layer: Any, d: int, pairs: int, dtype: Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor | None]:
    """The first top-MLP `layer`'s kernel rows for the dense vector (`d`) and for the `pairs`, and
    its bias (None without one), in `dtype`: taken once per step, so the slices of a batch share
    them (one gradient of each block, not one per slice)."""
    with tf.name_scope(f"{layer.name}_1"):
        kernel = tf.cast(layer.kernel, dtype)
        return kernel[:d], kernel[d:d + pairs], tf.cast(layer.bias, dtype) if layer.use_bias else None


def interaction_layer(layer: Any, x: tf.Tensor, vectors: tf.Tensor,
                      blocks: tuple[tf.Tensor, tf.Tensor, tf.Tensor | None] | None = None) -> tf.Tensor:
    """The first top-MLP `layer` (a built ``keras.layers.Dense``) applied to ``[x, pairs]`` (the
    dense vector and the pairwise dot products of ``[x; vectors]``, zero-padded to the layer's
    input width) without forming that concatenation: ``x @ W_x + pairs @ W_pairs + b``, the pairs
    in the layout `pairs_by_column` leaves them (padding columns, all zeros, add nothing).

    Example:
        >>> import keras
        >>> layer = keras.layers.Dense(3, activation="relu")
        >>> x, v = tf.random.normal([4, 2]), tf.random.normal([4, 5, 2])
        >>> layer.build((None, 2 + 18))  # x, then 6 vectors' 15 pairs padded to 18
        >>> expected = layer(tf.concat([x, pairwise_interaction(tf.concat([x[:, None], v], 1), 6)], 1))
        >>> bool(tf.reduce_all(tf.abs(interaction_layer(layer, x, v) - expected) < 1e-5))
        True

    `blocks` are `kernel_blocks` taken already (by a caller that applies the layer slice by slice).
    """
    with tf.name_scope("interaction"):
        pairs = pairs_by_column(tf.concat([x[:, None, :], vectors], axis=1))  # (P, B)
    kernel_x, kernel_pairs, bias = blocks or kernel_blocks(layer, x.shape[-1], pairs.shape[0], x.dtype)
    with tf.name_scope(f"{layer.name}_1"):  # as a Keras call of the layer is scoped: profiles name the layer
        h = tf.matmul(x, kernel_x) + tf.matmul(pairs, kernel_pairs, transpose_a=True)
        if bias is not None:
            h = tf.nn.bias_add(h, bias)
        return layer.activation(h)


#: examples per slice of the interaction and top MLP on a CPU (module docstring)
CPU_SLICE = 512


def slice_sizes(batch: int | None, size: int | None) -> list[int] | None:
    """The sizes of the consecutive slices a batch of `batch` examples is cut into, as equal as
    may be and each near `size` examples; None (the batch whole) for no `size`, a batch size not
    known when the graph is traced, or a batch under one and a half slices.

    Example:
        >>> slice_sizes(2048, 512), slice_sizes(1000, 512), slice_sizes(700, 512), slice_sizes(None, 512)
        ([512, 512, 512, 512], [500, 500], None, None)
    """
    if size is None or batch is None:
        return None
    count = max(1, round(batch / size))
    return None if count == 1 else [batch // count + (i < batch % count) for i in range(count)]


def resolve_slice(interaction_slice: Any, x: tf.Tensor | None = None) -> int | None:
    """Examples per slice for `interaction_and_top`: ``"auto"`` is `CPU_SLICE` on a CPU and None
    (the batch whole) on a GPU, the device being the one `x` is placed on, else (no placement
    yet) a GPU if one is visible; an int or None as given."""
    if interaction_slice != "auto":
        return interaction_slice
    device = (getattr(x, "device", "") or "").upper()
    if "GPU" in device:
        return None
    return CPU_SLICE if "CPU" in device or not tf.config.list_logical_devices("GPU") else None


def check_slice(interaction_slice: Any) -> Any:
    """`interaction_slice` if it is ``"auto"``, None or a positive int; else a ValueError naming it."""
    if interaction_slice is None or interaction_slice == "auto":
        return interaction_slice
    return checks.positive_int("interaction_slice", interaction_slice)


def interaction_and_top(x: tf.Tensor, vectors: tf.Tensor, top: Sequence[Any], logit: Any,
                        pad_to: int | None = None, slice_size: int | None = None) -> tf.Tensor:
    """The logit of ``[x, pairs]`` through the top MLP `top` (built layers) and `logit`: the pairs
    straight into the first top layer (`interaction_layer`), or into `logit` when there is no top
    MLP (padded to a multiple of `pad_to`). With a `slice_size`, on consecutive slices of the
    batch of about that many examples (`slice_sizes`; module docstring), the logits concatenated.

    Example:
        >>> import keras
        >>> top, logit = [keras.layers.Dense(4, activation="relu")], keras.layers.Dense(1)
        >>> top[0].build((None, 2 + 6)); logit.build((None, 4))
        >>> x, v = tf.random.normal([8, 2]), tf.random.normal([8, 3, 2])
        >>> whole, sliced = interaction_and_top(x, v, top, logit), interaction_and_top(x, v, top, logit, slice_size=4)
        >>> bool(tf.reduce_all(tf.abs(whole - sliced) < 1e-5))
        True
    """
    f = vectors.shape[1] + 1
    blocks = kernel_blocks(top[0], x.shape[-1], f * (f - 1) // 2, x.dtype) if top else None

    def one(x: tf.Tensor, vectors: tf.Tensor) -> tf.Tensor:
        if top:
            return logit(apply_layers(top[1:], interaction_layer(top[0], x, vectors, blocks)))
        with tf.name_scope("interaction"):
            pairs = pairwise_interaction(tf.concat([x[:, None, :], vectors], axis=1), pad_to)
        return logit(tf.concat([x, pairs], axis=1))

    sizes = slice_sizes(x.shape[0], slice_size)
    if sizes is None:
        return one(x, vectors)
    return tf.concat([one(a, b) for a, b in zip(tf.split(x, sizes), tf.split(vectors, sizes))], axis=0)


def continuous_input(features: Any, cont_names: Sequence[str], dtype: Any) -> tf.Tensor:
    """``log(1 + max(x, 0))`` of the continuous features, ``[B, C]``: from ``features["continuous"]``
    (the loaders' ``concat_continuous``) or stacked from ``features[name]`` for `cont_names`.
    Count-like features have heavy tails; the log tames them before the bottom MLP."""
    if "continuous" in features:
        dense = tf.cast(features["continuous"], dtype)
    else:
        dense = tf.stack([tf.cast(features[n], dtype) for n in cont_names], axis=1)
    return tf.math.log1p(tf.maximum(dense, 0))


def mlps(bottom: Sequence[int], embedding_dim: int, top: Sequence[int]) -> tuple[list[Any], list[Any], Any]:
    """DLRM's layers around the interaction: the bottom MLP (ending at `embedding_dim`), the top
    MLP and the float32 logit (float32 even under mixed precision)."""
    bottom_layers = [keras.layers.Dense(int(w), activation="relu", name=f"bottom_{i}")
                     for i, w in enumerate([*bottom, embedding_dim])]
    top_layers = [keras.layers.Dense(int(w), activation="relu", name=f"top_{i}") for i, w in enumerate(top)]
    return bottom_layers, top_layers, keras.layers.Dense(1, name="logit", dtype="float32")


def apply_layers(layers: Sequence[Any], x: tf.Tensor) -> tf.Tensor:
    """`x` through `layers`, in order."""
    for layer in layers:
        x = layer(x)
    return x


@keras.saving.register_keras_serializable(package="sok_tutorial")
class DLRM(keras.Model):
    """DLRM over batches of ``{name: [B]}`` features, or of ``{"categorical": [B, 26],
    "continuous": [B, 13]}`` (the loaders' ``concat_categorical`` / ``concat_continuous``
    layout, columns in the order of `cat_names` / `cont_names`).

    Args:
        cardinalities: rows of each categorical feature's table (its hash buckets), in order.
        cat_names, cont_names: feature names, in the order of `cardinalities` for the categorical ones.
        embedding_dim: width of every embedding (and of the bottom MLP's output).
        bottom_mlp, top_mlp: hidden widths (the last bottom layer is `embedding_dim` wide).
        embedding: ``"sok"`` (one `DistributedEmbedding` over all features, a table of
            ``sum(cardinalities)`` rows, sparse updates) or ``"keras"`` (one
            ``keras.layers.Embedding`` per feature, dense updates).
        pad_interaction_to: pad the interaction's width to a multiple of this (None: no padding).
        interaction_slice: examples per slice of the batch for the interaction and top MLP
            (module docstring); ``"auto"``: 512 on a CPU, the batch whole with a GPU; None: whole.
    """

    def __init__(self, cardinalities: Sequence[int], cat_names: Sequence[str], cont_names: Sequence[str], *,
                 embedding_dim: int = 16, bottom_mlp: Sequence[int] = (64,), top_mlp: Sequence[int] = (128, 64),
                 embedding: str = "sok", pad_interaction_to: int | None = None, interaction_slice: Any = "auto",
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.cardinalities = [checks.positive_int(f"cardinalities[{i}]", c) for i, c in enumerate(cardinalities)]
        self.cat_names, self.cont_names = list(cat_names), list(cont_names)
        if len(self.cat_names) != len(self.cardinalities):
            raise ValueError(f"{len(self.cat_names)} cat_names but {len(self.cardinalities)} cardinalities")
        self.embedding_dim = checks.positive_int("embedding_dim", embedding_dim)
        self.bottom_widths, self.top_widths = [int(w) for w in bottom_mlp], [int(w) for w in top_mlp]
        self.embedding_kind = checks.one_of("embedding", embedding, ("sok", "keras"))
        self.pad_interaction_to = None if pad_interaction_to is None else checks.positive_int(
            "pad_interaction_to", pad_interaction_to)
        self.interaction_slice = check_slice(interaction_slice)
        self.bottom, self.top, self.logit = mlps(self.bottom_widths, embedding_dim, self.top_widths)
        if self.embedding_kind == "sok":
            self.offsets = np.concatenate([[0], np.cumsum(self.cardinalities)[:-1]]).astype(np.int64)
            self.embedding = DistributedEmbedding("sum", int(sum(self.cardinalities)), embedding_dim,
                                                  slot_num=len(self.cat_names), max_nnz=1, use_hashtable=False,
                                                  name="embedding")
        else:
            self.embeddings = [keras.layers.Embedding(c, embedding_dim, name=f"embedding_{n}")
                               for n, c in zip(self.cat_names, self.cardinalities)]

    def call(self, features: dict[str, Any], training: Any = None) -> tf.Tensor:
        with tf.name_scope("inputs"):
            x = continuous_input(features, self.cont_names, self.compute_dtype)
            ready = isinstance(features.get("categorical"), UniqueKeys)  # from `deduplicate`: offsets added
            keys = features["categorical"] if ready else self._categorical(features)
        x = apply_layers(self.bottom, x)  # (B, D)
        if ready and self.embedding_kind != "sok":
            raise ValueError(f"{self.name}: deduplicated keys (deduplicate) need embedding='sok', got "
                             f"{self.embedding_kind!r}")
        if self.embedding_kind == "sok":
            # one table: (B, F, D)
            vectors = self.embedding(keys if ready else keys + self.offsets, training=training)
        else:
            vectors = tf.stack([emb(keys[:, i]) for i, emb in enumerate(self.embeddings)], axis=1)
        if self.top and not self.top[0].built:  # (the pairs go into it without calling it)
            pairs = (len(self.cat_names) + 1) * len(self.cat_names) // 2
            self.top[0].build((None, self.embedding_dim + pairs + (-pairs) % (self.pad_interaction_to or 1)))
        # (B, 1), float32 even under mixed precision
        return interaction_and_top(x, tf.cast(vectors, x.dtype), self.top, self.logit, self.pad_interaction_to,
                                   resolve_slice(self.interaction_slice, x))

    def _categorical(self, features: dict[str, Any]) -> tf.Tensor:
        """The categorical keys ``[B, F]`` int64: ``features["categorical"]`` (the loaders'
        ``concat_categorical``) or stacked from ``features[name]`` for `cat_names`."""
        if "categorical" in features:
            return tf.cast(features["categorical"], tf.int64)
        return tf.stack([tf.cast(features[n], tf.int64) for n in self.cat_names], axis=1)

    def deduplicate(self, features: dict[str, Any], *rest: Any) -> Any:
        """`features` with their categorical keys as `UniqueKeys` (table offsets added, deduplicated),
        for ``dataset.map(model.deduplicate)``: the input pipeline then runs the deduplication of the
        next batch while the step trains on this one (`sok_tutorial.embedding.unique_keys`). Other
        arguments (labels) pass on.

        Example:
            >>> model = DLRM([4, 5], ["a", "b"], ["x"], embedding_dim=2)
            >>> ready = model.deduplicate({"a": tf.constant([1, 1]), "b": tf.constant([0, 1]), "x": tf.ones([2])})
            >>> ready["categorical"].unique.numpy().tolist(), sorted(ready)
            ([1, 4, 5], ['categorical', 'x'])
            >>> model(ready).shape
            TensorShape([2, 1])
        """
        if self.embedding_kind != "sok":
            raise ValueError(f"{self.name}: deduplicate needs embedding='sok' (one table), got {self.embedding_kind!r}")
        out = {k: v for k, v in features.items() if k not in self.cat_names}
        out["categorical"] = unique_keys(self._categorical(features) + self.offsets)
        return (out, *rest) if rest else out

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "cardinalities": self.cardinalities, "cat_names": self.cat_names,
                "cont_names": self.cont_names, "embedding_dim": self.embedding_dim, "bottom_mlp": self.bottom_widths,
                "top_mlp": self.top_widths, "embedding": self.embedding_kind,
                "pad_interaction_to": self.pad_interaction_to, "interaction_slice": self.interaction_slice}
