"""What a run of the training cache reports: its per-pass records in TensorBoard, and what the
passes cost.

`EmbeddingTrainingCache.fit` returns one record per pass (``keys``, ``samples``, ``pull_s``,
``train_s``, ``write_back_s``, ``loss``, and ``eval_*`` with an evaluation pass); a custom loop
makes the same from `EmbeddingTrainingCache.history` and its own timing. A pass costs a pull, the
training and a write-back, so throughput here counts all three: what a continuous-training job
really delivers, not the speed of the training step alone.

Example:
    >>> records = [{"samples": 100, "pull_s": 1.0, "train_s": 8.0, "write_back_s": 1.0},
    ...            {"samples": 100, "pull_s": 0.5, "train_s": 4.0, "write_back_s": 0.5}]
    >>> pass_throughput(records), pass_throughput(records, skip=0), cache_share(records)
    (20.0, 13.333333333333334, 0.2)
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

PASS_SCALARS = ("loss", "eval_auc", "pull_s", "train_s", "write_back_s")
PASS_SECONDS = ("pull_s", "train_s", "write_back_s")


def log_passes(log_dir: str | os.PathLike, records: Sequence[Mapping[str, Any]], *, first_step: int = 0,
               keys: Sequence[str] = PASS_SCALARS) -> None:
    """Write each pass's scalars to TensorBoard as ``pass/<key>``, pass ``i`` at step ``first_step + i``.

    Keys a record lacks (``eval_auc`` without an evaluation pass) are left out. Call it again
    with the next records and ``first_step`` moved on to continue the same curves.

    Args:
        log_dir: the run's directory (one per parameter server or API, to compare them).
        records: pass records, e.g. what `EmbeddingTrainingCache.fit` returns.
        first_step: the step of the first record.
        keys: the record's numbers to log.
    """
    import tensorflow as tf

    writer = tf.summary.create_file_writer(os.fspath(log_dir))
    with writer.as_default():
        for step, record in enumerate(records, start=first_step):
            for key in keys:
                if key in record:
                    tf.summary.scalar(f"pass/{key}", float(record[key]), step=step)
    writer.close()


def _seconds(record: Mapping[str, Any]) -> float:
    return float(sum(record[k] for k in PASS_SECONDS))


def pass_throughput(records: Sequence[Mapping[str, Any]], *, skip: int = 1) -> float:
    """Samples per second over whole passes (pull + train + write-back), leaving out the first
    `skip` passes: a run's first pass also traces and compiles the training step, a one-off cost
    that would otherwise decide which of two runs looks faster.

    Args:
        records: pass records with ``samples`` and the seconds of ``pull_s``, ``train_s``, ``write_back_s``.
        skip: passes left out at the start.
    """
    if skip < 0 or len(records) <= skip:
        raise ValueError(f"skip={skip} with {len(records)} pass records: expected 0 <= skip < the number of passes")
    kept = records[skip:]
    return sum(int(r["samples"]) for r in kept) / sum(_seconds(r) for r in kept)


def cache_share(records: Sequence[Mapping[str, Any]]) -> float:
    """The share of the passes' time spent in pulls and write-backs: what the cache adds to training."""
    if not records:
        raise ValueError("records is empty: expected the records of at least one pass")
    return sum(float(r["pull_s"]) + float(r["write_back_s"]) for r in records) / sum(_seconds(r) for r in records)
