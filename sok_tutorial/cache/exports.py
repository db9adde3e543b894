"""`CacheExports`: what leaves `EmbeddingTrainingCache` for serving and for restarts: the keys
changed since the last export (`get_incremental_model`, optionally as a delta directory) and whole
saves of the parameter server's rows with the dense weights (`save_params_to_files`,
`load_params_from_files`, checkpoints of `sok_tutorial.training.checkpoint`).

A mixin of `sok_tutorial.cache.training_cache.EmbeddingTrainingCache`, whose server, tables and
row packing it reads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kernels import checks
from kernels.unique import unique
from sok_tutorial.training.checkpoint import (
    checkpoints,
    dense_variables,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    read_tables,
    relative_path,
    save_checkpoint,
    step_dir,
)
from sok_tutorial.training.delta import write_delta

KEEP = 2  # saves kept by save_params_to_files


class IncrementalModel(dict):
    """What `CacheExports.get_incremental_model` returns: ``{table: (keys, vectors)}`` of the keys
    whose vectors changed, and `deleted`, ``{table: keys}`` of the keys the server no longer holds
    (those a `load_params_from_files` took back), which a server of the model drops."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: dict[str, np.ndarray] = {}

    def copy(self) -> IncrementalModel:
        """A shallow copy that keeps `deleted` (``dict.copy`` would return a plain dict without it).

        Example:
            >>> model = IncrementalModel()
            >>> model["wide"], model.deleted["wide"] = (np.arange(2), np.zeros((2, 4))), np.array([7])
            >>> copied = model.copy()
            >>> type(copied).__name__, copied.deleted["wide"].tolist(), copied["wide"][0].tolist()
            ('IncrementalModel', [7], [0, 1])
        """
        out = IncrementalModel()
        out.update(self)
        out.deleted = dict(self.deleted)
        return out


class CacheExports:
    """Incremental exports and saves of the cache's server (module docstring)."""

    def get_incremental_model(self, path: str | Path | None = None) -> IncrementalModel:
        """``{table: (keys, vectors)}`` of exactly the keys whose vectors changed since the last call,
        by training or by a `load_params_from_files`; the keys a load deleted are in the result's
        ``deleted`` (`IncrementalModel`).

        With `path`, also write them as a delta directory (`sok_tutorial.training.delta`, with the
        dense variables, the deleted keys as its evicted ones) that `apply_delta` applies to a
        `save_params_to_files` save or to the previous delta's result: the cache's marks count its
        incremental exports.
        """
        if self.active:
            self._sync()
        out = IncrementalModel()
        for table in self.tables:  # (a listed key the server no longer holds was deleted by a load)
            listed = self._updated[table.name]
            keys = unique(np.concatenate(listed))[0] if listed else np.zeros(0, np.int64)
            rows, found = self.ps.pull(table.name, keys)
            out[table.name] = (keys[found], rows[found, :table.dim])
            out.deleted[table.name] = keys[~found]
        if path is not None:  # (a delta that cannot be written keeps the changes for the next call)
            parts = [{"keys": keys, "vectors": vectors, "evicted": out.deleted[name]}
                     for name, (keys, vectors) in out.items()]
            dense = {relative_path(self.model, v.path): v.numpy() for v in dense_variables(self.model, self.tables)}
            write_delta(path, self.model, parts, [self._mark] * len(parts), [self._mark + 1] * len(parts), dense)
        for table in self.tables:
            self._updated[table.name] = []
        self._mark += 1
        return out

    def save_params_to_files(self, directory: str | Path | None = None, *, keep_last: int | None = KEEP) -> Path:
        """Write dense weights, every table row and its optimizer state under `directory`.

        A save is a checkpoint (`sok_tutorial.training.save_checkpoint`: a ``step-NNNNNNNN``
        folder, complete before its manifest makes it one, so a crash at any moment leaves the
        previous save loadable) whose tables hold the parameter server's rows rather than the
        device's. It loads into a model of in-memory tables as well. The newest `keep_last` saves
        stay (``None``: all).
        """
        if keep_last is not None:
            checks.positive_int("keep_last", keep_last)
        root = Path(directory) if directory is not None else self.dest
        if root is None:
            raise ValueError("save_params_to_files needs a directory (or dest_sparse_models= on the cache)")
        if self.active:
            self._sync()
        rows = {}
        for table in self.tables:
            keys = self.ps.keys(table.name)
            rows[table.name] = {"keys": keys, **self._unpack(table, self.ps.pull(table.name, keys)[0])}
        done = checkpoints(root)
        step = int(done[-1].name.split("-")[1]) + 1 if done else 0
        path = save_checkpoint(step_dir(root, step), self.model, self.optimizer, rows=rows,
                               state={"passes": len(self.history),
                                      "export": {"marks": [self._mark] * len(self.tables)}})
        prune_checkpoints(root, keep_last)
        return path

    def load_params_from_files(self, directory: str | Path) -> Path:
        """Load the newest save under `directory`: dense weights into the model, rows into the server,
        which then holds the saved rows only (keys first pushed after the save are deleted). The
        next `get_incremental_model` lists the keys whose vectors the load changed and those it
        deleted, so that a server of the model follows the rollback.

        Not during a pass: its `write_back` would push the rows it trained over the loaded ones. (The
        load a cache makes when it starts from a save, ``train_from_scratch=False``, is its starting
        point, not a change: a model's server holds that save already.)"""
        return self._load_params(directory, report=True)

    def _load_params(self, directory: str | Path, report: bool) -> Path:
        """`load_params_from_files`; `report`: list what the load changes in the next incremental model."""
        path = latest_checkpoint(directory)
        if path is None:
            raise FileNotFoundError(f"directory={str(directory)!r} holds no save (a step-* checkpoint with its "
                                    "manifest.json, as save_params_to_files writes)")
        if self.active:
            raise RuntimeError("load_params_from_files during a pass: call write_back() or discard() first (the "
                               "pass's write-back would push its rows over the loaded ones)")
        self.ps.ensure_tables(self.widths)  # (the server takes the rows: open, before anything is assigned)
        load_checkpoint(path, self.model, self.optimizer, tables=False)  # checks everything, then assigns
        saved = read_tables(path)
        self._cancel_prefetch()
        self._known = None  # the server's rows change under the cache
        changes = [self._load_changes(table, arrays) for table, arrays in zip(self.tables, saved)] if report else []
        self.ps.replace_tables({table.name: (arrays["keys"], self._pack(table, arrays))
                                for table, arrays in zip(self.tables, saved)})
        for table, changed in zip(self.tables, changes):
            self._updated[table.name].append(changed)
        return path

    def _load_changes(self, table: Any, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """The keys whose vectors loading `arrays` into table changes: saved keys whose vectors differ
        from the server's or that it lacks, and the server's keys the save lacks (deleted)."""
        keys = np.asarray(arrays["keys"], np.int64)
        rows, found = self.ps.pull(table.name, keys)
        differs = ~found | np.any(rows[:, :table.dim] != np.asarray(arrays["vectors"], np.float32), axis=1)
        return np.concatenate([keys[differs], np.setdiff1d(self.ps.keys(table.name), keys)])
