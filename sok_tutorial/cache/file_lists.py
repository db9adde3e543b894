"""File lists: the unit a continuous-training run trains on, each with its keyset beside it.

HugeCTR's continuous training does not train on a whole dataset at once but on one *file list*
after another: a text file naming a few data parts (the count, then one name per line, the
layout of ``_file_list.txt``), written in time order as new days of logs arrive. Beside each list
sits its keyset, ``<file list>.keyset``: the union of its parts' keysets, i.e. every key one pass
over the list can touch. `EmbeddingTrainingCache.update` pulls exactly those rows before the pass,
so the largest keyset is how many rows the device tables need.

Example:
    >>> import numpy as np
    >>> growth = keyset_growth([np.array([1, 2, 3]), np.array([2, 3, 4, 5]), np.array([1, 5])])
    >>> [(g["keys"], g["new keys"], g["keys seen so far"]) for g in growth]
    [(3, 3, 3), (4, 2, 5), (2, 0, 5)]
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kernels import checks
from sok_tutorial.atomic import write_file
from sok_tutorial.cache.staging import keys_beside
from sok_tutorial.data.keyset import keyset_path, write_keyset
from sok_tutorial.data.schema import resolve_files


def write_file_lists(dataset: str | os.PathLike, parts_per_list: int) -> list[tuple[Path, Path]]:
    """Cut a dataset's parts, in their order, into file lists of `parts_per_list` consecutive parts.

    Writes ``file_list.<i>.txt`` in the dataset directory (relative names, as `read_file_list`
    reads them) and its keyset beside it, both atomically. When the parts do not divide evenly,
    the last list holds the rest, so every part is in one list.

    Args:
        dataset: a dataset directory whose parts have keysets beside them (written by
            ``keysets=True`` on the writers, or by `data_gen.criteo_tsv.preprocess_criteo`).
        parts_per_list: parts per file list (days per list, for one part per day).

    Returns:
        ``[(file list, its keyset), ...]`` in order: the ``passes`` argument of
        `EmbeddingTrainingCache.fit`.
    """
    checks.positive_int("parts_per_list", parts_per_list)
    directory = Path(dataset)
    if not directory.is_dir():
        raise NotADirectoryError(f"dataset={str(dataset)!r} is not a dataset directory")
    parts = resolve_files(directory, "dataset")
    chunks = [parts[first:first + parts_per_list] for first in range(0, len(parts), parts_per_list)]
    keysets = [keys_beside(chunk) for chunk in chunks]  # a missing keyset fails here, before anything is written
    lists = []
    for i, (chunk, keys) in enumerate(zip(chunks, keysets)):
        path = directory / f"file_list.{i}.txt"
        write_file(path, f"{len(chunk)}\n" + "".join(f"{os.path.relpath(p, directory)}\n" for p in chunk))
        write_keyset(keyset_path(path), keys)
        lists.append((path, keyset_path(path)))
    return lists


def keyset_growth(keysets: Sequence[np.ndarray]) -> list[dict[str, int]]:
    """How a stream of keysets grows the tables: per keyset, in order, its ``keys``, the
    ``new keys`` no earlier keyset had, and the ``keys seen so far`` (what a parameter server
    holds after training on all of them).

    Args:
        keysets: sorted unique int64 keys of each file list, in training order.
    """
    seen, rows = np.zeros(0, np.int64), []
    for keys in keysets:
        keys = np.unique(np.asarray(keys, dtype=np.int64))
        new = np.setdiff1d(keys, seen, assume_unique=True)
        seen = np.union1d(seen, new)
        rows.append({"keys": len(keys), "new keys": len(new), "keys seen so far": len(seen)})
    return rows
