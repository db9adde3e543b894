"""`ParquetLoader`: batches straight from parquet into TensorFlow (NVTabular's
``KerasSequenceLoader`` API on Keras 3).

The engine (`sok_tutorial.data.loader_base`) reads, transforms, shuffles and batches; this file
turns its batches into TensorFlow tensors and plugs into Keras: ``model.fit(loader)`` works
directly (the loader is its own Keras data adapter), and ``loader.to_tf_dataset()`` gives a
``tf.data.Dataset`` with a full output signature.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.data import columns as cols
from sok_tutorial.data.loader_base import LoaderCore

try:  # Keras returns a DataAdapter passed to fit() unchanged: the loader serves its own tf.data pipeline
    from keras.src.trainers.data_adapters.data_adapter import DataAdapter as _AdapterBase
except ImportError:  # pragma: no cover - other Keras layouts: use loader.to_tf_dataset()
    _AdapterBase = object

CONTINUOUS = "continuous"  # feature name of the concatenated continuous columns
CATEGORICAL = "categorical"  # feature name of the concatenated categorical columns


class ParquetLoader(_AdapterBase):
    """Iterate ``(features, labels)`` batches of a parquet dataset, for Keras and custom loops.

    Args:
        paths_or_dataset: a dataset directory, a ``_file_list.txt``, a glob, or parquet files.
        batch_size: rows per batch (per rank).
        label_names: label columns; labels come as float32 ``[B, len(label_names)]``.
        cat_names: categorical columns -> int64 ``[B]``.
        cont_names: continuous columns -> float32 ``[B]`` (or one ``[B, n]``, see
            ``concat_continuous``).
        list_names: multi-hot columns -> ``tf.RaggedTensor`` ``[B, None]`` (``[B, slots, None]``
            for slotted columns), or dense ``[B, (slots,) max_nnz]`` with ``sparse_as_dense``
            (zero padded). Lists are never flattened.
        shuffle: permute row groups per epoch and rows within each chunk (seeded).
        seed: same seed, same order; each epoch derives its own order from it.
        parts_per_chunk: row groups read, concatenated and shuffled together.
        buffer_size: most rows resident per chunk: an int, or a float fraction of free memory.
        global_size, global_rank: shard for data-parallel workers; ranks read disjoint rows
            whose union is the dataset (counts differ by at most one row).
        drop_last: drop the epoch's last, partial batch.
        sparse_as_dense: see ``list_names``.
        transforms: `HashBucket` and/or a fitted `Categorify`, applied in the loader.
        device: ``"auto"``, ``"cpu"`` or ``"gpu"`` (CuPy arrays handed to TF via DLPack).
        prefetch: batches prepared ahead by the background threads.
        concat_continuous: deliver continuous columns as one ``[B, n]`` tensor named
            ``"continuous"``.
        concat_categorical: deliver categorical columns as one int64 ``[B, n]`` tensor named
            ``"categorical"`` (DLRM's layout; fewer, larger tensors cross into TensorFlow).
        fill_nan: replace missing/NaN continuous values with this (default: an error).
        label_range: ``(low, high)`` every label must lie in (default ``(0, 1)``: click labels for
            binary cross-entropy); ``None`` allows any finite label. NaN labels are always an error.
        max_nnz: ``{list column: limit}`` overriding schema.json; longer lists are an error
            unless ``truncate_lists=True``.

    Raises:
        LoaderError: bad data met while reading (corrupt file, nulls, NaN labels, long lists),
            naming the file and column. Iterated directly, the loader raises it as it is; inside
            ``model.fit`` (through `to_tf_dataset`) ``tf.data`` re-raises it as
            ``tf.errors.InvalidArgumentError`` carrying the same message: catch that type there.

    Example:
        >>> import tempfile, pathlib
        >>> from data_gen.criteo import write_criteo_parquet
        >>> from sok_tutorial.data import HashBucket
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "criteo"
        >>> _ = write_criteo_parquet(out, 1000, progress=False)
        >>> loader = ParquetLoader(out, 256, ["label"], cat_names=["C1", "C2"], cont_names=["I1"],
        ...                        fill_nan=0.0, transforms=[HashBucket(100)])
        >>> features, labels = next(iter(loader))
        >>> len(loader), features["C1"].shape, labels.shape
        (4, TensorShape([256]), TensorShape([256, 1]))
    """

    def __init__(self, paths_or_dataset: Any, batch_size: int, label_names: Sequence[str],
                 cat_names: Sequence[str] = (), cont_names: Sequence[str] = (), list_names: Sequence[str] = (),
                 shuffle: bool = True, seed: int = 0, parts_per_chunk: int = 1, buffer_size: int | float = 0.05,
                 global_size: int = 1, global_rank: int = 0,
                 drop_last: bool = False, sparse_as_dense: bool = False, transforms: Sequence[Any] = (),
                 device: str = "auto", prefetch: int = 2, concat_continuous: bool = False,
                 concat_categorical: bool = False,
                 fill_nan: float | None = None, max_nnz: Mapping[str, int] | None = None, truncate_lists: bool = False,
                 label_range: tuple[float, float] | None = (0.0, 1.0)):
        self.core = LoaderCore(paths_or_dataset, batch_size, label_names, cat_names=cat_names, cont_names=cont_names,
                               list_names=list_names, shuffle=shuffle, seed=seed, parts_per_chunk=parts_per_chunk,
                               buffer_size=buffer_size, global_size=global_size, global_rank=global_rank,
                               drop_last=drop_last, sparse_as_dense=sparse_as_dense, transforms=transforms,
                               device=device, fill_nan=fill_nan, max_nnz=max_nnz, truncate_lists=truncate_lists,
                               label_range=label_range)
        self.prefetch = checks.positive_int("prefetch", prefetch)
        self._pool = cols.BufferPool()  # buffers of stacked columns, reused once TF lets go of them
        self.concat_continuous = bool(concat_continuous)
        if self.concat_continuous and not cont_names:
            raise ValueError("concat_continuous=True needs cont_names")
        self.concat_categorical = bool(concat_categorical)
        if self.concat_categorical and not cat_names:
            raise ValueError("concat_categorical=True needs cat_names")

    # ----------------------------------------------------------------- iteration
    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return len(self.core)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], tf.Tensor]]:
        """One epoch; each new iteration is the next epoch (reshuffled from the seed)."""
        return self.core.iterate(self._to_tf, prefetch=self.prefetch)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will read (set it to replay an epoch's order)."""
        return self.core.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.core.epoch = checks.positive_int("epoch", value, allow_zero=True)

    @property
    def batch_size(self) -> int:
        return self.core.batch_size

    @property
    def num_rows(self) -> int:
        """Rows this rank reads per epoch."""
        start, stop = self.core.rank_rows
        return stop - start

    @property
    def cardinalities(self) -> dict[str, int | None]:
        """Embedding rows each categorical/list column needs, after the loader's transforms."""
        out: dict[str, int | None] = {}
        for name in self.core.cat_names + self.core.list_names:
            card = self.core.schema[name].cardinality if self.core.schema and name in self.core.schema else None
            for t in self.core.transforms:
                if t.applies_to(name) and t.cardinality(name) is not None:
                    card = t.cardinality(name)
            out[name] = card
        return out

    # ------------------------------------------------------------------ tensors
    def _tensor(self, array: Any) -> tf.Tensor:
        if isinstance(array, np.ndarray):
            if array.flags.c_contiguous and array.flags.writeable and cols.is_aligned(array) and array.size:
                # zero copy; the loader never writes to an array after handing it out
                return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
            return tf.convert_to_tensor(array)
        return tf.experimental.dlpack.from_dlpack(array.toDlpack())  # CuPy: stays on the GPU

    def _stack(self, columns: list[Any]) -> Any:
        """Columns side by side, ``[B, len(columns)]``; on the CPU into an aligned buffer, so the
        hand-over to TensorFlow stays zero-copy."""
        if self.core.xp is not np:
            return self.core.xp.stack(columns, axis=1)
        out = self._pool.empty(len(columns[0]) * len(columns), columns[0].dtype).reshape(len(columns[0]), -1)
        return np.stack(columns, axis=1, out=out)

    def _list(self, col: Any) -> Any:
        if not isinstance(col, cols.Ragged):
            return self._tensor(col)
        tensor = tf.RaggedTensor.from_row_splits(self._tensor(col.values), self._tensor(col.offsets), validate=False)
        return tf.RaggedTensor.from_uniform_row_length(tensor, col.slots, validate=False) if col.slots else tensor

    def _to_tf(self, batch: cols.Columns) -> tuple[dict[str, Any], tf.Tensor]:
        core = self.core
        if self.concat_categorical:
            features: dict[str, Any] = {CATEGORICAL: self._tensor(self._stack([batch[n] for n in core.cat_names]))}
        else:
            features = {n: self._tensor(batch[n]) for n in core.cat_names}
        if self.concat_continuous:
            features[CONTINUOUS] = self._tensor(self._stack([batch[n] for n in core.cont_names]))
        else:
            features.update({n: self._tensor(batch[n]) for n in core.cont_names})
        features.update({n: self._list(batch[n]) for n in core.list_names})
        labels = self._stack([batch[n] for n in core.label_names])
        return features, self._tensor(labels)

    @property
    def element_spec(self) -> tuple[dict[str, Any], tf.TensorSpec]:
        """The ``(features, labels)`` signature of every batch. With ``drop_last`` every batch has
        ``batch_size`` rows, and the signature says so: a model traced on it knows its batch size
        (the DLRM's interaction is then cut into slices, `sok_tutorial.models.dlrm`)."""
        core = self.core
        b = core.batch_size if core.drop_last else None
        if self.concat_categorical:
            spec: dict[str, Any] = {CATEGORICAL: tf.TensorSpec([b, len(core.cat_names)], tf.int64, name=CATEGORICAL)}
        else:
            spec = {n: tf.TensorSpec([b], tf.int64, name=n) for n in core.cat_names}
        if self.concat_continuous:
            spec[CONTINUOUS] = tf.TensorSpec([b, len(core.cont_names)], tf.float32, name=CONTINUOUS)
        else:
            spec.update({n: tf.TensorSpec([b], tf.float32, name=n) for n in core.cont_names})
        for n in core.list_names:
            slots, width = core.slots[n], core.max_nnz[n]
            if core.sparse_as_dense:
                spec[n] = tf.TensorSpec([b, slots, width] if slots else [b, width], tf.int64, name=n)
            elif slots:
                spec[n] = tf.RaggedTensorSpec([b, slots, None], tf.int64, ragged_rank=2, row_splits_dtype=tf.int64)
            else:
                spec[n] = tf.RaggedTensorSpec([b, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)
        return spec, tf.TensorSpec([b, len(core.label_names)], tf.float32, name="labels")

    def to_tf_dataset(self) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` over the loader; each pass over it is the loader's next epoch."""
        dataset = tf.data.Dataset.from_generator(self.__iter__, output_signature=self.element_spec)
        return dataset.prefetch(tf.data.AUTOTUNE)  # hand-over off the training step's critical path

    # ----------------------------------------------- Keras data adapter protocol
    def get_tf_dataset(self) -> tf.data.Dataset:
        return self.to_tf_dataset()

    def get_numpy_iterator(self) -> Iterator[Any]:
        for features, labels in self:
            yield tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, (features, labels))

    def get_jax_iterator(self) -> Iterator[Any]:
        return self.get_numpy_iterator()

    def get_torch_dataloader(self) -> Any:
        raise NotImplementedError("ParquetLoader feeds TensorFlow; iterate it directly for other frameworks")

    @property
    def num_batches(self) -> int:
        return len(self)

    @property
    def has_partial_batch(self) -> bool:
        return self.partial_batch_size is not None

    @property
    def partial_batch_size(self) -> int | None:
        rest = self.num_rows % self.batch_size
        return rest if rest and not self.core.drop_last else None

    def on_epoch_begin(self) -> None:
        pass

    def on_epoch_end(self) -> None:
        pass

    def __repr__(self) -> str:
        c = self.core
        return (f"ParquetLoader({len(c.files)} files, {c.num_rows:,} rows, batch_size={c.batch_size}, "
                f"rank {c.global_rank}/{c.global_size}, shuffle={c.shuffle}, device={c.device!r})")
