"""The native baseline: a parquet dataset as TFRecord files of ``tf.train.Example``, read back
with ``tf.data`` (batched ``parse_example``, a shuffle buffer) and Keras ``Hashing`` layers: the
pipeline most TensorFlow recommender code uses, and the one `ParquetLoader` is measured against.

Examples are serialized with batched ``tf.io.encode_proto`` ops (no per-row Python), so writing
is fast enough for tutorial sizes. Layout of one Example:

* categorical and label columns: ``int64_list`` of one value;
* continuous columns: ``float_list`` of one value, *absent* when missing (parsed as the default);
* list columns: ``int64_list`` of the row's values; slotted lists (``[slot][key]``) also store
  ``<name>__lengths`` (keys per slot) to rebuild ``[B, slots, None]``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tensorflow as tf

from kernels import checks
from sok_tutorial.atomic import atomic_directory, check_destination
from sok_tutorial.data.schema import resolve_files
from sok_tutorial.progress import progress_bar

LENGTHS = "__lengths"


def _encode(message: str, fields: Sequence[str], values: Sequence[tf.Tensor], sizes: tf.Tensor) -> tf.Tensor:
    return tf.io.encode_proto(sizes=sizes, values=list(values), field_names=list(fields), message_type=message)


def _ones(n: int, k: int = 1) -> tf.Tensor:
    return tf.ones([n, k], tf.int32)


def _feature(kind: str, values: tf.Tensor, sizes: tf.Tensor) -> tf.Tensor:
    """[n] serialized Features of an ``int64_list``/``float_list`` with ``sizes[i]`` values each."""
    n = tf.shape(values)[0]
    listed = _encode(f"tensorflow.{kind}", ["value"], [values], sizes)
    return _encode("tensorflow.Feature", [kind.lower().replace("list", "_list")], [tf.reshape(listed, [n, 1])],
                   _ones(n))


def serialize_examples(table: pa.Table, *, int_names: Sequence[str], float_names: Sequence[str],
                       list_names: Sequence[str], slots: Mapping[str, int | None]) -> tf.Tensor:
    """[rows] serialized ``tf.train.Example`` of an Arrow table (see the module docstring)."""
    n = table.num_rows
    entries, present = [], []

    def add(name: str, feature: tf.Tensor, here: np.ndarray | None = None) -> None:
        key = tf.fill([n, 1], name)
        entries.append(_encode("tensorflow.Features.FeatureEntry", ["key", "value"],
                               [key, tf.reshape(feature, [n, 1])], _ones(n, 2)))
        present.append(np.ones(n, bool) if here is None else here)

    for name in int_names:
        values = table.column(name).to_numpy().astype(np.int64)
        add(name, _feature("Int64List", values[:, None], _ones(n)))
    for name in float_names:
        column = table.column(name)
        valid = ~np.asarray(column.is_null())
        values = pc.fill_null(column.cast(pa.float32()), 0.0).to_numpy()
        valid &= ~np.isnan(values)
        add(name, _feature("FloatList", values[:, None], valid.astype(np.int32)[:, None]), valid)
    for name in list_names:
        column = table.column(name).combine_chunks()
        if slots.get(name):
            per_slot = pc.list_value_length(pc.list_flatten(column)).to_numpy().reshape(n, -1)
            add(name + LENGTHS, _feature("Int64List", per_slot.astype(np.int64), _ones(n) * per_slot.shape[1]))
            column = pc.list_flatten(column)  # inner lists; regroup rows below
            lengths = per_slot.sum(axis=1)
            values = pc.list_flatten(column).to_numpy()
        else:
            lengths = pc.list_value_length(column).fill_null(0).to_numpy()
            values = pc.list_flatten(column).to_numpy()
        ragged = tf.RaggedTensor.from_row_lengths(values.astype(np.int64), lengths.astype(np.int64))
        add(name, _feature("Int64List", ragged.to_tensor(), lengths.astype(np.int32)[:, None]))

    # encode_proto takes the first `size` values of a row: move each row's present entries first
    here = np.stack(present, axis=1)
    order = np.argsort(~here, axis=1, kind="stable")
    stacked = tf.gather(tf.stack([tf.reshape(e, [n]) for e in entries], axis=1), order, batch_dims=1)
    features = _encode("tensorflow.Features", ["feature"], [stacked], here.sum(axis=1, keepdims=True).astype(np.int32))
    return _encode("tensorflow.Example", ["features"], [tf.reshape(features, [n, 1])], _ones(n))


def _names(*lists: Any) -> list[list[str]]:
    """label, cat, cont and list names, each a list (one string is one name)."""
    kinds = ("label_names", "cat_names", "cont_names", "list_names")
    return [checks.names(kind, names) for kind, names in zip(kinds, lists)]


def write_tfrecords(paths_or_dataset: Any, out_dir: str | Path, *, label_names: Sequence[str],
                    cat_names: Sequence[str] = (), cont_names: Sequence[str] = (), list_names: Sequence[str] = (),
                    chunk_rows: int = 65_536, overwrite: bool = False, progress: bool = True) -> list[Path]:
    """Write each parquet file as ``part-*.tfrecords`` in `out_dir` (atomically). Returns the files."""
    files = resolve_files(paths_or_dataset)
    checks.positive_int("chunk_rows", chunk_rows)
    label_names, cat_names, cont_names, list_names = _names(label_names, cat_names, cont_names, list_names)
    check_destination(out_dir, overwrite=overwrite, inputs=files)
    columns = [*label_names, *cat_names, *cont_names, *list_names]
    slots = {}
    for name in list_names:
        atype = pq.ParquetFile(files[0]).schema_arrow.field(name).type
        slots[name] = pa.types.is_list(atype.value_type) or pa.types.is_large_list(atype.value_type)
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    bar = progress_bar(progress, total=total, desc=f"-> {Path(out_dir).name} (tfrecords)", unit="row")
    outputs = []
    with atomic_directory(out_dir, overwrite=overwrite, inputs=files) as tmp:
        for i, path in enumerate(files):
            target = tmp / f"part-{i:05d}.tfrecords"
            with tf.io.TFRecordWriter(str(target)) as writer:
                for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows, columns=columns):
                    table = pa.Table.from_batches([batch])
                    for record in serialize_examples(table, int_names=[*label_names, *cat_names],
                                                     float_names=cont_names, list_names=list_names,
                                                     slots=slots).numpy():
                        writer.write(record)
                    bar.update(table.num_rows)
            outputs.append(Path(out_dir) / target.name)
    bar.close()
    return outputs


def tfrecord_dataset(files: Sequence[str | Path], batch_size: int, label_names: Sequence[str], *,
                     cat_names: Sequence[str] = (), cont_names: Sequence[str] = (), list_names: Sequence[str] = (),
                     slots: Mapping[str, int] | None = None, shuffle_buffer: int = 0, seed: int = 0,
                     hash_buckets: int | Mapping[str, int] | None = None, cont_default: float = 0.0,
                     drop_remainder: bool = False, concat_continuous: bool = False,
                     concat_categorical: bool = False) -> tf.data.Dataset:
    """Read TFRecords the tf.data way: shuffle buffer, batch, vectorised parse, Keras hashing.

    Yields ``(features, labels)`` shaped as `ParquetLoader` does: int64 ``[B]`` categoricals,
    float32 ``[B]`` continuous (missing -> `cont_default`), ragged lists, float32 labels ``[B, L]``.

    Args:
        hash_buckets: hash categorical columns with ``keras.layers.Hashing`` into this many bins
            (an int, or ``{column: bins}``).
        concat_continuous, concat_categorical: stack those columns into one ``[B, n]`` tensor
            named ``"continuous"`` / ``"categorical"``, as `ParquetLoader` does.
    """
    import keras

    checks.positive_int("batch_size", batch_size)
    label_names, cat_names, cont_names, list_names = _names(label_names, cat_names, cont_names, list_names)
    files = [str(f) for f in files]
    if not files:
        raise FileNotFoundError("files=[]: no TFRecord files to read")
    slots = dict(slots or {})
    spec: dict[str, Any] = {n: tf.io.FixedLenFeature([], tf.int64) for n in [*label_names, *cat_names]}
    spec.update({n: tf.io.FixedLenFeature([], tf.float32, default_value=cont_default) for n in cont_names})
    for name in list_names:
        partitions = [tf.io.RaggedFeature.RowLengths(name + LENGTHS)] if slots.get(name) else []
        spec[name] = tf.io.RaggedFeature(tf.int64, value_key=name, partitions=partitions, row_splits_dtype=tf.int64)
    hashers = {}
    if hash_buckets is not None:
        bins = hash_buckets if isinstance(hash_buckets, Mapping) else {n: hash_buckets for n in cat_names}
        hashers = {n: keras.layers.Hashing(num_bins=b, name=f"hash_{n}") for n, b in bins.items()}

    def parse(serialized: tf.Tensor) -> tuple[dict[str, Any], tf.Tensor]:
        parsed = tf.io.parse_example(serialized, spec)
        labels = tf.stack([tf.cast(parsed.pop(n), tf.float32) for n in label_names], axis=1)
        for name, layer in hashers.items():
            parsed[name] = tf.cast(layer(parsed[name]), tf.int64)
        if concat_categorical and cat_names:
            parsed["categorical"] = tf.stack([parsed.pop(n) for n in cat_names], axis=1)
        if concat_continuous and cont_names:
            parsed["continuous"] = tf.stack([parsed.pop(n) for n in cont_names], axis=1)
        return parsed, labels

    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)
