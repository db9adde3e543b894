"""Checkpoints: a directory that appears whole or not at all.

Layout::

    step-00001000/
        dense.npz          every model variable that is not an embedding table, by path
        tables/<i>.npz     per table: keys, vectors and optimizer slots of the rows in use
                           (<i>.worker<w>.npz instead: the shards worker w held, multi-worker runs)
        tables/<i>.lifecycle.npz   a table that forgets: its clock, admission sketch, eviction log
        optimizer.npz      the optimizer's other variables (step count, dense slots)
        manifest.json      what is inside and the training position; written last

The directory is written as a temporary sibling and renamed into place, so a crash mid-save
leaves the previous checkpoint as the latest. Tables are stored by key, not by row (`EmbeddingTable.export`), so
they can be reloaded into a table of another size or layout (a dynamic table takes rows
``0 .. n-1`` and its key index is rebuilt), and sharded tables onto any number of replicas (each
shard takes the keys it owns).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kernels import checks
from sok_tutorial.atomic import atomic_directory, read_json
from sok_tutorial.embedding import lifecycle
from sok_tutorial.embedding.table import EmbeddingTable, tables_of
from sok_tutorial.training.naming import match, same_name

MANIFEST = "manifest.json"
FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def dense_variables(model: Any, tables: list[EmbeddingTable]) -> list[Any]:
    """The model's variables that no table owns (a table's rows and key index go in tables/)."""
    owned = {id(v) for table in tables for v in table.variables}
    return [v for v in model.variables if id(v) not in owned]


def relative_path(model: Any, path: str) -> str:
    """A variable or layer path inside `model`: without the model's own (auto-numbered) name."""
    head, _, rest = path.partition("/")
    return rest if head == model.name and rest else path


def held_in_part(table: EmbeddingTable) -> bool:
    """A sharded table of which this process holds only some shards (multi-worker training)."""
    return table.num_shards > 1 and len(table.local_shards) < table.num_shards


def worker_barrier(table: EmbeddingTable) -> None:
    """Wait until every worker gets here: a collective sum over the table's strategy."""
    import tensorflow as tf

    strategy = table.strategy
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)


def _table_arrays(table: EmbeddingTable, optimizer: Any,
                  rows: Mapping[str, dict[str, np.ndarray]] | None) -> dict[str, np.ndarray]:
    if rows is not None and table.name in rows:
        return dict(rows[table.name])
    arrays = table.export(optimizer)
    arrays.pop("shard")
    return arrays


def save_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any = None, *,
                    state: dict[str, Any] | None = None, overwrite: bool = False,
                    rows: Mapping[str, dict[str, np.ndarray]] | None = None) -> Path:
    """Write `model` (and `optimizer`) plus free-form `state` (step, epoch...) to `path`.

    `rows` maps a table's name to the rows to save for it instead of its own, in the layout of
    `EmbeddingTable.export` (``keys``, ``vectors``, ``slot_<j>``): the training cache saves the
    rows of its parameter server this way, so its saves are checkpoints like any other.

    A table with its own optimizer (``EmbeddingTable(optimizer=...)``) saves that optimizer's
    slots with its rows; that optimizer's step count (and learning rate variable) is saved with
    `optimizer`'s other variables when `optimizer` is one of `sok_tutorial.optimizers`, which
    lists the tables' optimizers' variables after its own, and is not saved when `optimizer` is
    None.

    Tables sharded over several worker processes: every worker calls this with the same `path`
    (a directory all of them can reach); each writes the rows of its shards, and worker 0 puts
    the checkpoint together and renames it into place once all have written.
    """
    checks.flag("overwrite", overwrite)
    if not isinstance(path, (str, os.PathLike)) or not Path(path).name:
        raise ValueError(f"path={path!r} is invalid: expected the path of a directory to write")
    try:
        json.dumps(state or {})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"state is invalid: expected JSON values (int, float, str, lists, dicts), got {exc}") from None
    tables = tables_of(model)
    _check_rows(tables, optimizer, rows)
    partial = [table for table in tables if held_in_part(table)]
    workers = partial[0].num_shards // len(partial[0].local_shards) if partial else 1
    worker = partial[0].local_shards[0] // len(partial[0].local_shards) if partial else 0
    staging = Path(path).with_name(f".{Path(path).name}.shards")
    if partial:
        staging.mkdir(parents=True, exist_ok=True)
        for i, table in enumerate(tables):
            if held_in_part(table):
                np.savez(staging / f"{i}.worker{worker}.npz", **_table_arrays(table, optimizer, rows))
                kept = lifecycle.saved_state(table) if rows is None or table.name not in rows else {}
                if kept:
                    np.savez(staging / f"{i}.worker{worker}.lifecycle.npz", **kept)
        worker_barrier(partial[0])  # every worker's shards are on disk
    if worker == 0:
        _write_checkpoint(path, model, optimizer, tables, state, overwrite, staging, workers, rows)
    if partial:
        worker_barrier(partial[0])  # the checkpoint is complete before anyone reads it
    return Path(path)


def _check_rows(tables: list[Any], optimizer: Any, rows: Any) -> None:
    """`save_checkpoint`'s `rows`, checked before anything is written: a mapping from names of the
    model's tables to rows each table could restore."""
    if rows is None:
        return
    if not isinstance(rows, Mapping):
        raise TypeError(f"rows is invalid: expected a mapping from table names to rows, got {type(rows).__name__}")
    names = {table.name: table for table in tables}
    unknown = sorted(set(rows) - set(names))
    if unknown:
        raise ValueError(f"rows names {unknown}, which are not tables of the model ({sorted(names)})")
    for name, arrays in rows.items():
        names[name].check(arrays, optimizer, fit=False)


def _write_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any, tables: list[Any],
                      state: dict[str, Any] | None, overwrite: bool, staging: Path, workers: int,
                      rows: Mapping[str, dict[str, np.ndarray]] | None) -> None:
    slot_ids = set()
    with atomic_directory(path, overwrite=overwrite, arg="path") as tmp:
        (tmp / "tables").mkdir()
        table_entries = []
        for i, table in enumerate(tables):
            slots = table.optimizer_slots(optimizer)
            slot_ids.update(id(slot) for slot in slots)
            if held_in_part(table):
                parts = [staging / f"{i}.worker{w}.npz" for w in range(workers)]
                for w, part in enumerate(parts):
                    shutil.move(part, tmp / "tables" / f"{i}.worker{w}.npz")
                states = [staging / f"{i}.worker{w}.lifecycle.npz" for w in range(workers)]
                kept = lifecycle.merged_state([read_npz(f) for f in states if f.is_file()])
                if kept:
                    np.savez(tmp / "tables" / f"{i}.lifecycle.npz", **kept)
                keys = sum(len(np.load(tmp / "tables" / f"{i}.worker{w}.npz")["keys"]) for w in range(workers))
            else:
                arrays = _table_arrays(table, optimizer, rows)
                np.savez(tmp / "tables" / f"{i}.npz", **arrays)
                keys, parts = len(arrays["keys"]), [None]
                kept = lifecycle.saved_state(table) if rows is None or table.name not in rows else {}
                if kept:
                    np.savez(tmp / "tables" / f"{i}.lifecycle.npz", **kept)
            table_entries.append({"layer": relative_path(model, table.path),
                                  "rows": getattr(table, "total_rows", table.capacity),
                                  "dim": table.dim, "keys": int(keys), "dynamic": table.dynamic,
                                  "sharding": getattr(table, "sharding", "replicated"), "shards": table.num_shards,
                                  "files": len(parts), "slots": [s.name for s in slots],
                                  "storage_dtype": table.precision.storage})  # rows saved in float32 (exact)
        dense = {relative_path(model, v.path): v.numpy() for v in dense_variables(model, tables)}
        np.savez(tmp / "dense.npz", **{f"v{i}": a for i, a in enumerate(dense.values())})
        opt_vars = [v for v in (optimizer.variables if optimizer is not None and optimizer.built else [])
                    if id(v) not in slot_ids]
        np.savez(tmp / "optimizer.npz", **{f"v{i}": v.numpy() for i, v in enumerate(opt_vars)})
        manifest = {"format": FORMAT, "model": type(model).__name__, "state": state or {}, "tables": table_entries,
                    "dense": [{"path": p, "shape": list(a.shape)} for p, a in dense.items()],
                    "optimizer": {"class": type(optimizer).__name__ if optimizer is not None else None,
                                  "variables": [{"name": v.name, "shape": list(v.shape)} for v in opt_vars]}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(staging, ignore_errors=True)


def _read_table(path: Path, i: int, entry: dict[str, Any]) -> dict[str, np.ndarray]:
    """A table's arrays: one file, or one per worker that held shards (concatenated)."""
    files = entry.get("files", 1)
    if files == 1 and (path / "tables" / f"{i}.npz").is_file():
        return read_npz(path / "tables" / f"{i}.npz")
    parts = [path / "tables" / f"{i}.worker{w}.npz" for w in range(files)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise CheckpointMismatch(f"checkpoint {str(path)!r}: table {entry['layer']} lacks {missing} "
                                 f"({files} shard files expected)")
    loaded = [read_npz(p) for p in parts]
    return {name: np.concatenate([part[name] for part in loaded]) for name in loaded[0]}


class CheckpointMismatch(ValueError):
    """The checkpoint was written by a different model or optimizer; the message says what differs."""


def load_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any = None, *,
                    tables: bool = True) -> dict[str, Any]:
    """Restore `model` (and `optimizer`, which must be built) from `path`; returns the saved state.

    Everything is read whole and checked first (the model's class, dense variables by name and
    shape, each table's name, width, keys and optimizer slots, the optimizer's other variables,
    every file's contents); only then is anything assigned, so a checkpoint that does not fit, or
    a damaged one, leaves the model as it was. With
    ``tables=False`` the tables' rows are checked for shape but left alone (`read_tables` gives
    them): how the training cache loads a save into its parameter server.
    """
    checks.flag("tables", tables)
    path = Path(path)
    manifest = _manifest(path)
    owned = tables_of(model)
    problems = []
    if manifest["model"] != type(model).__name__:
        problems.append(f"model class {manifest['model']} vs {type(model).__name__}")
    saved_dense = {d["path"]: tuple(d["shape"]) for d in manifest["dense"]}
    pairs: list[tuple[str, Any]] = []
    try:  # by path without Keras' per-process numbers (dense_3 -> dense) and shape, in model order
        pairs = match(saved_dense, {relative_path(model, v.path): v for v in dense_variables(model, owned)}, str(path))
    except ValueError as exc:
        problems.append(f"dense variables differ ({exc})")
    if len(manifest["tables"]) != len(owned):
        problems.append(f"{len(manifest['tables'])} embedding tables vs {len(owned)}")
    data, states = [], {}
    for i, (entry, table) in enumerate(zip(manifest["tables"], owned)):
        if not same_name(entry["layer"], relative_path(model, table.path)):
            problems.append(f"table {i} was saved as {entry['layer']}, this model's is "
                            f"{relative_path(model, table.path)}")
            continue
        if entry["dim"] != table.dim:
            problems.append(f"table {entry['layer']}: width {entry['dim']} vs {table.dim}")
            continue
        if entry.get("sharding", "replicated") == "table" and getattr(table, "sharding", None) not in (None, "table") \
                and table.num_shards > 1:
            problems.append(f"table {entry['layer']}: saved table-wise (keys placed by slot), restoring "
                            f"sharding={table.sharding!r}")
            continue
        try:
            arrays = _read_table(path, i, entry)
            table.check(arrays, optimizer, fit=tables)
        except (ValueError, FileNotFoundError) as exc:
            problems.append(f"table {entry['layer']}: {exc}")
            continue
        data.append(arrays)
        kept = path / "tables" / f"{i}.lifecycle.npz"
        if tables and table.lifecycle.active and kept.is_file():
            try:
                states[i] = read_npz(kept)
            except ValueError as exc:
                problems.append(f"table {entry['layer']}: {exc}")
    slot_ids = {id(s) for table in owned for s in table.optimizer_slots(optimizer)}
    others = [v for v in optimizer.variables if id(v) not in slot_ids] if optimizer is not None and optimizer.built \
        else []
    if optimizer is not None and not optimizer.built and manifest["optimizer"]["variables"]:
        problems.append(f"optimizer {type(optimizer).__name__} is not built, so the checkpoint's "
                        f"{len(manifest['optimizer']['variables'])} optimizer variables have nowhere to go: build it "
                        "(optimizer.build(model.trainable_variables)) first")
    try:
        saved_optimizer = read_npz(path / "optimizer.npz") if others else None
        dense = read_npz(path / "dense.npz")
    except (ValueError, FileNotFoundError) as exc:
        raise CheckpointMismatch(f"checkpoint {str(path)!r} cannot be loaded: {exc}") from None
    position = {name: i for i, name in enumerate(saved_dense)}
    for name, v in pairs:  # (dense.npz against the manifest: a file replaced since)
        array = dense.get(f"v{position[name]}")
        if array is None or array.shape != tuple(v.shape):
            problems.append(f"dense variable {name}: dense.npz holds {'no array' if array is None else array.shape} "
                            f"for shape {tuple(v.shape)}")
    if saved_optimizer is not None and len(others) != len(saved_optimizer):
        problems.append(f"optimizer has {len(others)} variables, the checkpoint {len(saved_optimizer)}")
    elif saved_optimizer is not None:
        problems += [f"optimizer variable {v.name}: shape {tuple(v.shape)} vs {saved_optimizer[f'v{i}'].shape}"
                     for i, v in enumerate(others) if tuple(v.shape) != saved_optimizer[f"v{i}"].shape]
    if problems:
        raise CheckpointMismatch(f"checkpoint {str(path)!r} does not match this model: " + "; ".join(problems))

    for name, v in pairs:
        v.assign(dense[f"v{position[name]}"])
    for i, (arrays, table) in enumerate(zip(data if tables else [], owned)):
        table.restore(arrays, optimizer)
        if i in states:
            skipped = lifecycle.load_state(table, states[i])
            if skipped:
                warnings.warn(f"checkpoint {str(path)!r}, table {table.name}: lifecycle state saved under other "
                              f"options was not restored: {', '.join(skipped)}", RuntimeWarning, stacklevel=2)
    for i, v in enumerate(others):
        v.assign(saved_optimizer[f"v{i}"])
    return manifest["state"]


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file at `path`; a damaged file is a ValueError naming it (a
    missing one FileNotFoundError), not zipfile's or NumPy's own errors."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path.name} cannot be read ({type(exc).__name__}: {exc}): a damaged file") from None


def _manifest(path: Path) -> dict[str, Any]:
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(f"path={str(path)!r} is not a checkpoint ({MANIFEST} missing: incomplete or not one)")
    manifest = read_json(path / MANIFEST, "checkpoint manifest")
    fields = {"model": str, "state": dict, "tables": list, "dense": list, "optimizer": dict}
    wrong = [name for name, kind in fields.items() if not isinstance(manifest.get(name), kind)] \
        if isinstance(manifest, dict) else list(fields)
    if wrong:
        raise ValueError(f"checkpoint manifest {str(path / MANIFEST)!r} lacks or mangles {wrong}: a damaged or foreign "
                         "file")
    return manifest


def read_tables(path: str | os.PathLike) -> list[dict[str, np.ndarray]]:
    """The rows of every table saved in the checkpoint at `path`, in the model's order of tables
    (`tables_of`), each in the layout of `EmbeddingTable.export`."""
    path = Path(path)
    return [_read_table(path, i, entry) for i, entry in enumerate(_manifest(path)["tables"])]


def checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (``step-*`` with a manifest) in `directory`, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _STEP_DIR.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def prune_checkpoints(directory: str | os.PathLike, keep_last: int | None) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints in `directory` (None keeps all); returns
    those removed. Only complete ``step-*`` checkpoints count and go."""
    if keep_last is None:
        return []
    keep_last = checks.positive_int("keep_last", keep_last)
    removed = checkpoints(directory)[:-keep_last]
    for old in removed:
        shutil.rmtree(old, ignore_errors=True)
    return removed


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    found = checkpoints(directory)
    return found[-1] if found else None


def step_dir(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}"
