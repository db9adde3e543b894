"""The training and validation sets of a DLRM comparison: Criteo-like clicks drawn from a planted
model (with its oracle AUC), or a sample of a real Criteo download, each as parquet and as
TFRecords, made once and reused while their inputs are unchanged.

Example:
    >>> import tempfile
    >>> data = criteo_for_dlrm(tempfile.mkdtemp(), 3000, 1000, scale=0.001, num_parts=2, progress=False)
    >>> data.train_rows, data.valid_rows, len(data.train_tfrecords), 0.5 < data.oracle_auc < 1
    (3000, 1000, 2, True)
    >>> hashed, rows = data.tables(fraction=0.5, hash_above=100)
    >>> sorted(hashed)[:3], rows["C1"] == hashed["C1"] == 3800, rows["C6"]
    (['C1', 'C10', 'C11'], True, 3)
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from data_gen.criteo import CAT_NAMES, CONT_NAMES, held_out_block, scaled_cardinalities, write_criteo_parquet
from data_gen.criteo_files import take_criteo_rows
from data_gen.criteo_tsv import preprocess_criteo
from kernels import checks
from sok_tutorial.data import Schema, resolve_files
from sok_tutorial.data.categorify import Categorify
from sok_tutorial.data.tfrecord import write_tfrecords

_SOURCE = "source.json"  # what a preprocessed or converted directory was made from


@dataclass(frozen=True)
class ClickData:
    """Where the rows are and what is known about them."""

    train: Path  # parquet dataset directories
    valid: Path
    train_tfrecords: list[Path]  # the same rows as TFRecords (empty when not asked for)
    valid_tfrecords: list[Path]
    cardinalities: list[int]  # ids per categorical field, C1 .. C26
    oracle_auc: float | None  # the AUC of the true click probability; None for real clicks
    train_rows: int
    valid_rows: int
    click_rate: float  # in the training rows
    real: bool

    def tables(self, fraction: float, hash_above: int) -> tuple[dict[str, int], dict[str, int]]:
        """``(hashed, rows)``: the fields with more than `hash_above` ids are hashed into
        ``fraction`` of their ids (``hashed``, for `HashBucket` or TF's ``Hashing``); every field's
        table rows (``rows``: the hashed size, or the field's own ids, which need no hashing)."""
        checks.fraction("fraction", fraction, low=1e-6, high=1e6)
        checks.positive_int("hash_above", hash_above, allow_zero=True)
        hashed = {n: max(1, int(fraction * c)) for n, c in zip(CAT_NAMES, self.cardinalities) if c > hash_above}
        return hashed, {n: hashed.get(n, c) for n, c in zip(CAT_NAMES, self.cardinalities)}


def criteo_for_dlrm(data_dir: str | Path, rows: int, valid_rows: int, *, num_parts: int = 4, criteo_dir: str = "",
                    scale: float = 0.03, interactions: float = 0.0, seed: int = 0, min_count: int = 4,
                    tfrecords: bool = True, progress: bool = True) -> ClickData:
    """`rows` training and `valid_rows` validation rows under `data_dir`, as parquet (and TFRecords).

    Generated (``criteo_dir=""``): `data_gen.criteo.CriteoLike` at Criteo's cardinalities times
    `scale`, with `interactions` planted, `num_parts` training parts; the validation rows come
    from the same model, further on in its stream (no row is in both).

    Real (`criteo_dir`, a download `data_gen.criteo_files.find_criteo_files` recognises): the
    first ``rows / num_parts`` rows of `num_parts` days (or consecutive slices of Kaggle's
    ``train.txt``), validation from the day (or slice) after; `preprocess_criteo` fits its
    vocabulary on the training rows only (ids seen fewer than `min_count` times share id 0) and
    takes ``log(1 + x)`` of the counts. There is no oracle.

    Everything is reused while its inputs and parameters are unchanged.
    """
    checks.positive_int("rows", rows)
    checks.positive_int("valid_rows", valid_rows)
    checks.positive_int("num_parts", num_parts)
    data_dir = Path(data_dir)
    if criteo_dir:
        name = data_dir / f"criteo-dlrm-real-{rows}-{valid_rows}-{num_parts}"
        tsv = take_criteo_rows(criteo_dir, name / "tsv", [rows // num_parts] * num_parts + [valid_rows],
                               overwrite=True, progress=progress)
        train, valid = name / f"train-min{min_count}", name / f"valid-min{min_count}"
        train_schema = _preprocessed(tsv[:-1], train, min_count, None, progress)
        valid_schema = _preprocessed(tsv[-1:], valid, min_count, train / "categorify", progress)
        cards = [next(c.cardinality for c in train_schema.columns if c.name == n) for n in CAT_NAMES]
        oracle = None
    else:
        cards = scaled_cardinalities(scale)
        name = data_dir / (f"criteo-dlrm-{rows}-{scale}-{seed}" + (f"-x{interactions}" if interactions else ""))
        train, valid = name / "train", name / "valid"
        common = {"cardinalities": cards, "seed": seed, "interactions": interactions, "reuse": True,
                  "overwrite": True, "progress": progress}
        train_schema = write_criteo_parquet(train, rows, num_parts=num_parts, **common)
        valid_schema = write_criteo_parquet(valid, valid_rows, first_block=held_out_block(rows), **common)
        oracle = valid_schema.metadata["oracle_auc"]
    files = resolve_files(train)
    labels = np.concatenate([pq.read_table(f, columns=["label"])["label"].to_numpy() for f in files])
    return ClickData(train, valid, _tfrecords(train, train_schema, progress) if tfrecords else [],
                     _tfrecords(valid, valid_schema, progress) if tfrecords else [], cards, oracle, len(labels),
                     sum(pq.read_metadata(f).num_rows for f in resolve_files(valid)), float(labels.mean()),
                     bool(criteo_dir))


def _preprocessed(files: list[Path], out: Path, min_count: int, vocabulary: Path | None, progress: bool) -> Schema:
    """`preprocess_criteo` of `files` into `out` (with the vocabulary saved at `vocabulary`, else
    fitting one), skipped when `out` already holds exactly that."""
    stamp = json.dumps({"files": [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files],
                        "min_count": min_count, "vocabulary_from": str(vocabulary or "")})
    if (out / _SOURCE).is_file() and (out / _SOURCE).read_text() == stamp:
        return Schema.load(out)
    categorify = Categorify.load(vocabulary) if vocabulary is not None else None
    schema = preprocess_criteo(files, out, min_count=min_count, normalize=False, categorify=categorify,
                               keysets=False, scheduler="synchronous", overwrite=True, progress=progress)
    (out / _SOURCE).write_text(stamp)
    return schema


def _tfrecords(parquet_dir: Path, schema: Schema, progress: bool) -> list[Path]:
    """The TFRecords of a parquet dataset, rewritten only when the parquet data changed."""
    out = parquet_dir.with_name(parquet_dir.name + "-tfrecords")
    stamp = json.dumps(schema.metadata, sort_keys=True)
    if (out / _SOURCE).exists() and (out / _SOURCE).read_text() == stamp:
        return sorted(out.glob("*.tfrecords"))
    start = time.perf_counter()
    files = write_tfrecords(parquet_dir, out, label_names=["label"], cat_names=CAT_NAMES, cont_names=CONT_NAMES,
                            overwrite=True, progress=progress)
    (out / _SOURCE).write_text(stamp)
    if progress:
        print(f"wrote {parquet_dir.name} as TFRecords in {time.perf_counter() - start:.1f} s")
    return files
