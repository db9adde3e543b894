"""Staging a pass for the training cache: the next keyset's background pull, and keysets.

A pass's keys map to device rows ``0 .. n-1`` through a ``kernels.key_index.KeyIndex`` of its
sorted keyset; the loader's remap of every categorical value goes through it (its dense path,
a gather per value, where a binary search would take a logarithm of the keyset).

* `Prefetch`: pulls rows from the parameter server in a background thread, in chunks (a
  parameter server call may hold the GIL for its whole length, so short calls let the training
  thread run in between), and can be stopped between chunks.
* `as_keys` and `keys_beside`: a pass's keyset from an array, a keyset file, or the keyset
  files written beside its data files.

Example:
    >>> import numpy as np
    >>> as_keys(np.array([9, 3, 9, -2**63])).tolist()
    [-9223372036854775808, 3, 9]
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sok_tutorial.data.keyset import keyset_path, read_keyset

_CHUNK = 4096  # keys per parameter-server call in the background pull
WRITE_KEYSETS = ("keysets=True on the data_gen writers (e.g. data_gen.criteo.write_criteo_parquet, "
                 "data_gen.criteo_tsv.preprocess_criteo) or sok_tutorial.data.keyset.write_keyset")


def as_keys(keyset: Any) -> np.ndarray:
    """Sorted unique int64 keys of `keyset`: an integer array, or the path of a keyset file."""
    if isinstance(keyset, (str, Path)):
        path = Path(keyset)
        if not path.exists():
            raise FileNotFoundError(f"keyset={str(path)!r} does not exist (write it with {WRITE_KEYSETS})")
        keyset = read_keyset(path)
    keys = np.asarray(keyset)
    if keys.dtype.kind not in "iu":
        raise TypeError(f"keyset must hold integer keys, got dtype {keys.dtype}")
    keys = keys.astype(np.int64).reshape(-1)
    return keys if bool(np.all(keys[1:] > keys[:-1])) else np.unique(keys)  # keyset files are sorted


def keys_beside(files: Any) -> np.ndarray:
    """The keys of the keyset files written beside data `files` (a directory, glob or list)."""
    from sok_tutorial.data.schema import resolve_files

    paths = [keyset_path(f) for f in resolve_files(files)]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"no keyset beside the data files: {missing[:3]} (write them with {WRITE_KEYSETS})")
    return np.concatenate([read_keyset(p) for p in paths])


class Prefetch:
    """``pull(keys[i:i + _CHUNK])`` for every chunk, in a daemon thread; `result` joins them.

    Args:
        pull: maps int64 keys to ``{table: rows [n, width]}``.
        keys: the keys to pull.
    """

    def __init__(self, pull: Callable[[np.ndarray], dict[str, np.ndarray]], keys: np.ndarray):
        self.keys = keys
        self._pull, self._stop = pull, threading.Event()
        self._parts: list[dict[str, np.ndarray]] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cache-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for start in range(0, max(len(self.keys), 1), _CHUNK):
                if self._stop.is_set():
                    return
                self._parts.append(self._pull(self.keys[start:start + _CHUNK]))
        except BaseException as exc:  # noqa: BLE001 - re-raised by result()
            self._error = exc

    def result(self) -> dict[str, np.ndarray]:
        """The pulled rows of every key, in order (re-raises the background thread's error)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return {name: np.concatenate([part[name] for part in self._parts]) for name in self._parts[0]}

    def cancel(self) -> None:
        """Stop after the chunk in flight and wait for it (the server is not used afterwards)."""
        self._stop.set()
        self._thread.join()

