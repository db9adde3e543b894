"""SOK-style random samples: ``slot_num`` feature fields of up to ``max_nnz`` int64 keys each.

Slot ``s`` draws its keys from its own range ``[s * V // slot_num, (s + 1) * V // slot_num)``
of the vocabulary (size ``V``), so slots never share keys. Without a sparse mask every slot
holds exactly ``max_nnz`` keys and the keys form a dense ``[N, slot_num, max_nnz]`` array; with
``use_sparse_mask=True`` each slot keeps a random number of keys in ``[0, max_nnz]`` and the
keys come back ragged::

    values  = [k0 k1 k2 | k3 | k4 k5 | ...]     all kept keys, row-major (row, slot, key)
    lengths = [[3, 1, 2, ...], ...]             [N, slot_num] keys kept per (row, slot)

Labels follow a planted model (a weight per key, summed over the row) so a model can learn
them; ``oracle_auc`` of the dataset is the AUC of the true probabilities.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from data_gen._common import GENERATOR_VERSION, AucAccumulator, block_rng, blocks, reusable, write_in_background
from kernels import checks
from sok_tutorial.data.schema import ColumnSchema, Schema
from sok_tutorial.data.writer import DEFAULT_ROW_GROUP_SIZE, DatasetWriter

FEATURE_NAME = "feature"
SOK_BLOCK_ROWS = 4096  # a block of 100 slots x 10 keys is 4M keys: blocks stay small
LABEL_NAME = "label"


class RaggedKeys(NamedTuple):
    """Keys of masked samples: flat ``values`` and per-(row, slot) ``lengths`` ``[N, slot_num]``."""

    values: np.ndarray
    lengths: np.ndarray

    def to_arrow(self) -> pa.Array:
        """As ``list<list<int64>>``: one outer list (the slots) per row."""
        rows, slots = self.lengths.shape
        inner = np.zeros(rows * slots + 1, np.int64)
        np.cumsum(self.lengths.reshape(-1), out=inner[1:])
        outer = np.arange(0, rows * slots + 1, slots, dtype=np.int64)
        return pa.LargeListArray.from_arrays(
            outer, pa.LargeListArray.from_arrays(inner, pa.array(self.values))
        ).cast(pa.list_(pa.list_(pa.int64())))


class _Planted:
    """Validated parameters and the per-key weights of the planted label model."""

    def __init__(self, vocabulary_size: int, slot_num: int, max_nnz: int, use_sparse_mask: bool, seed: int):
        self.vocabulary_size = checks.positive_int("vocabulary_size", vocabulary_size)
        self.slot_num = checks.positive_int("slot_num", slot_num)
        self.max_nnz = checks.positive_int("max_nnz", max_nnz)
        self.use_sparse_mask = bool(use_sparse_mask)
        self.seed = checks.positive_int("seed", seed, allow_zero=True)
        if vocabulary_size < slot_num:
            raise ValueError(f"vocabulary_size={vocabulary_size} is smaller than slot_num={slot_num}: "
                             "every slot needs at least one key of its own")
        self.per_slot = vocabulary_size // slot_num
        rng = np.random.default_rng([self.seed, 0x50C])
        self.weights = rng.standard_normal(vocabulary_size, dtype=np.float32)
        self.scale = np.float32(2.0 / np.sqrt(slot_num * max_nnz))

    def sample(self, keep: int, block: int) -> tuple[np.ndarray | RaggedKeys, np.ndarray, np.ndarray]:
        """The first `keep` rows of block `block` (always drawn whole: prefixes stay identical)."""
        rng, rows = block_rng(self.seed, 2, block), SOK_BLOCK_ROWS
        base = np.arange(self.slot_num, dtype=np.int64) * self.per_slot
        if not self.use_sparse_mask:
            keys = rng.integers(0, self.per_slot, (rows, self.slot_num, self.max_nnz), dtype=np.int64)
            keys += base[None, :, None]
            logit = self.weights[keys].sum(axis=(1, 2))
        else:
            lengths = rng.integers(0, self.max_nnz + 1, (rows, self.slot_num), dtype=np.int64)
            slot_of = np.repeat(np.tile(np.arange(self.slot_num), rows), lengths.reshape(-1))
            values = rng.integers(0, self.per_slot, len(slot_of), dtype=np.int64) + base[slot_of]
            row_of = np.repeat(np.arange(rows), lengths.sum(axis=1))
            logit = np.bincount(row_of, weights=self.weights[values], minlength=rows).astype(np.float32)
            keys = RaggedKeys(values, lengths)
        p = 1.0 / (1.0 + np.exp(-self.scale * logit))
        labels = (rng.random(rows, dtype=np.float32) < p).astype(np.int8)
        if keep < rows:
            if isinstance(keys, RaggedKeys):
                lengths = keys.lengths[:keep]
                keys = RaggedKeys(keys.values[:int(lengths.sum())], lengths)
            else:
                keys = keys[:keep]
        return keys, labels[:keep], p[:keep]

    def params(self) -> dict[str, Any]:
        return {"vocabulary_size": self.vocabulary_size, "slot_num": self.slot_num,
                "max_nnz": self.max_nnz, "use_sparse_mask": self.use_sparse_mask, "seed": self.seed}


def generate_random_samples(num_samples: int, vocabulary_size: int, slot_num: int, max_nnz: int, *,
                            use_sparse_mask: bool = False, seed: int = 0) -> tuple[np.ndarray | RaggedKeys, np.ndarray]:
    """SOK's random samples in memory: ``(keys, labels)``.

    Returns:
        keys: int64 ``[num_samples, slot_num, max_nnz]``, or `RaggedKeys` with ``use_sparse_mask``.
        labels: int8 ``[num_samples]`` of 0/1.

    Example:
        >>> keys, labels = generate_random_samples(4, vocabulary_size=80, slot_num=8, max_nnz=2)
        >>> keys.shape, labels.shape, bool((keys[:, 3] // 10 == 3).all())
        ((4, 8, 2), (4,), True)
    """
    model = _Planted(vocabulary_size, slot_num, max_nnz, use_sparse_mask, seed)
    num_samples = checks.positive_int("num_samples", num_samples)
    parts = [model.sample(rows, index)[:2] for index, rows in blocks(num_samples, SOK_BLOCK_ROWS)]
    labels = np.concatenate([p[1] for p in parts])
    if not use_sparse_mask:
        return np.concatenate([p[0] for p in parts]), labels
    return RaggedKeys(np.concatenate([p[0].values for p in parts]),
                      np.concatenate([p[0].lengths for p in parts])), labels


def iter_random_samples(num_samples: int, vocabulary_size: int, slot_num: int, max_nnz: int, *,
                        use_sparse_mask: bool = False, seed: int = 0) -> Iterator[tuple[Any, np.ndarray]]:
    """The same samples as `generate_random_samples`, in blocks, for outputs larger than memory."""
    model = _Planted(vocabulary_size, slot_num, max_nnz, use_sparse_mask, seed)
    for index, rows in blocks(checks.positive_int("num_samples", num_samples), SOK_BLOCK_ROWS):
        yield model.sample(rows, index)[:2]


def write_random_samples(out_dir: str | Path, num_samples: int, vocabulary_size: int, slot_num: int,
                         max_nnz: int, *, use_sparse_mask: bool = False, seed: int = 0, num_parts: int = 1,
                         row_group_size: int = DEFAULT_ROW_GROUP_SIZE, overwrite: bool = False,
                         reuse: bool = False, progress: bool = True) -> Schema:
    """Write the samples as a parquet dataset: column ``feature`` and ``label``, split into
    ``num_parts`` parts (one per worker). ``feature`` holds ``[slot][key]`` lists
    (``list<list<int64>>``) with a sparse mask; without one every slot has ``max_nnz`` keys and
    the column is stored flat, ``slot_num * max_nnz`` keys per row (schema ``nnz``).

    ``reuse=True`` returns an existing dataset made with the same parameters untouched.
    """
    checks.positive_int("num_samples", num_samples)
    model = _Planted(vocabulary_size, slot_num, max_nnz, use_sparse_mask, seed)
    generator = {"name": "sok_random_samples", "version": GENERATOR_VERSION, "num_samples": num_samples,
                 "num_parts": num_parts, "row_group_size": row_group_size, **model.params()}
    if reuse and (schema := reusable(out_dir, generator)) is not None:
        return schema
    schema = Schema([ColumnSchema(FEATURE_NAME, "list", "int64", cardinality=model.vocabulary_size,
                                  max_nnz=model.max_nnz, slots=model.slot_num,
                                  nnz=None if model.use_sparse_mask else model.max_nnz),  # fixed nnz: flat
                     ColumnSchema(LABEL_NAME, "label", "int8")])
    acc = AucAccumulator()

    def chunks() -> Iterator[dict[str, Any]]:
        for index, rows in blocks(num_samples, SOK_BLOCK_ROWS):
            keys, labels, p = model.sample(rows, index)
            acc.update(p, labels)
            feature = keys.to_arrow() if isinstance(keys, RaggedKeys) else keys.reshape(len(keys), -1)
            yield {FEATURE_NAME: feature, LABEL_NAME: labels}

    with DatasetWriter(out_dir, schema, num_parts=num_parts, total_rows=num_samples,
                       row_group_size=row_group_size, overwrite=overwrite, arg="out_dir") as writer:
        write_in_background(writer.write, chunks(), total=num_samples, count=lambda c: len(c[LABEL_NAME]),
                            progress=progress, desc=f"sok samples -> {Path(out_dir).name}")
        writer.schema.metadata.update(generator=generator, oracle_auc=acc.auc())
        return writer.close()
