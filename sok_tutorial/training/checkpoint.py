"""Checkpoints: a directory that appears whole or not at all.

Layout::

    step-00001000/
        dense.npz          every model variable that is not an embedding table, by path
        tables/<i>.npz     per table: keys, vectors and optimizer slots of the rows in use
                           (<i>.worker<w>.npz instead: the shards worker w held, multi-worker runs)
        optimizer.npz      the optimizer's other variables (step count, dense slots)
        manifest.json      what is inside and the training position; written last

The directory is written as a temporary sibling and renamed into place, so a crash mid-save
leaves the previous checkpoint as the latest. Tables are stored by key, not by row, so they can
be reloaded into a table of another size or layout (rows are reassigned compactly), and sharded
tables onto any number of replicas (each shard takes the keys it owns).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from sok_tutorial.atomic import atomic_directory
from sok_tutorial.embedding.layers import is_embedding_variable
from sok_tutorial.embedding.sharding import local_table_rows
from sok_tutorial.embedding.slots import table_slots
from sok_tutorial.training.naming import match

MANIFEST = "manifest.json"
FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def _tables(model: Any) -> list[Any]:
    """Embedding layers of `model` (each owns one table variable), in a stable order."""
    return [layer for layer in model._flatten_layers(include_self=False)
            if is_embedding_variable(getattr(layer, "embedding_variable", None))]


def _dense_variables(model: Any) -> list[Any]:
    return [v for v in model.variables if not is_embedding_variable(v)]


def _relative(model: Any, path: str) -> str:
    """A variable or layer path inside `model`: without the model's own (auto-numbered) name."""
    head, _, rest = path.partition("/")
    return rest if head == model.name and rest else path


def _partial(layer: Any) -> bool:
    """A sharded table of which this process holds only some shards (multi-worker training)."""
    return layer.num_shards > 1 and len(layer._sharded.components) < layer.num_shards


def _barrier(layer: Any) -> None:
    """Wait until every worker gets here: a collective sum over the layer's strategy."""
    import tensorflow as tf

    strategy = layer._sharded.strategy
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)


def _table_arrays(layer: Any, slots: list[Any]) -> dict[str, np.ndarray]:
    rows = local_table_rows(layer, slots)
    arrays = {"keys": rows["keys"], "key_slots": rows["slots"], "vectors": rows["vectors"]}
    arrays.update({f"slot_{j}": rows[f"extra_{j}"] for j in range(len(slots))})
    return arrays


def save_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any = None, *,
                    state: dict[str, Any] | None = None, overwrite: bool = False) -> Path:
    """Write `model` (and `optimizer`) plus free-form `state` (step, epoch...) to `path`.

    Tables sharded over several worker processes: every worker calls this with the same `path`
    (a directory all of them can reach); each writes the rows of its shards, and worker 0 puts
    the checkpoint together and renames it into place once all have written.
    """
    tables = _tables(model)
    partial = [layer for layer in tables if _partial(layer)]
    workers = partial[0]._sharded.num_shards // len(partial[0]._sharded.components) if partial else 1
    worker = partial[0]._sharded.replica_ids[0] // len(partial[0]._sharded.components) if partial else 0
    staging = Path(path).with_name(f".{Path(path).name}.shards")
    if partial:
        staging.mkdir(parents=True, exist_ok=True)
        for i, layer in enumerate(tables):
            if _partial(layer):
                np.savez(staging / f"{i}.worker{worker}.npz",
                         **_table_arrays(layer, table_slots(optimizer, layer.embedding_variable)))
        _barrier(partial[0])  # every worker's shards are on disk
    if worker == 0:
        _write_checkpoint(path, model, optimizer, tables, state, overwrite, staging, workers)
    if partial:
        _barrier(partial[0])  # the checkpoint is complete before anyone reads it
    return Path(path)


def _write_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any, tables: list[Any],
                      state: dict[str, Any] | None, overwrite: bool, staging: Path, workers: int) -> None:
    slot_ids = set()
    with atomic_directory(path, overwrite=overwrite, arg="path") as tmp:
        (tmp / "tables").mkdir()
        table_entries = []
        for i, layer in enumerate(tables):
            slots = table_slots(optimizer, layer.embedding_variable)
            slot_ids.update(id(slot) for slot in slots)
            if _partial(layer):
                parts = [staging / f"{i}.worker{w}.npz" for w in range(workers)]
                for w, part in enumerate(parts):
                    shutil.move(part, tmp / "tables" / f"{i}.worker{w}.npz")
                keys = sum(len(np.load(tmp / "tables" / f"{i}.worker{w}.npz")["keys"]) for w in range(workers))
            else:
                arrays = _table_arrays(layer, slots)
                np.savez(tmp / "tables" / f"{i}.npz", **arrays)
                keys, parts = len(arrays["keys"]), [None]
            table_entries.append({"layer": _relative(model, layer.path), "rows": layer.capacity,
                                  "dim": int(layer.embedding_variable.shape[1]), "keys": int(keys),
                                  "dynamic": layer.use_hashtable, "sharding": layer.sharding,
                                  "shards": layer.num_shards, "files": len(parts), "slots": [s.name for s in slots]})
        dense = {_relative(model, v.path): v.numpy() for v in _dense_variables(model)}
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
        return dict(np.load(path / "tables" / f"{i}.npz"))
    parts = [path / "tables" / f"{i}.worker{w}.npz" for w in range(files)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise CheckpointMismatch(f"checkpoint {str(path)!r}: table {entry['layer']} lacks {missing} "
                                 f"({files} shard files expected)")
    loaded = [np.load(p) for p in parts]
    return {name: np.concatenate([part[name] for part in loaded]) for name in loaded[0].files}


class CheckpointMismatch(ValueError):
    """The checkpoint was written by a different model or optimizer; the message says what differs."""


def load_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any = None) -> dict[str, Any]:
    """Restore `model` (and `optimizer`, which must be built) from `path`; returns the saved state."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(f"path={str(path)!r} is not a checkpoint ({MANIFEST} missing: incomplete or not one)")
    manifest = json.loads((path / MANIFEST).read_text())
    tables, dense_vars = _tables(model), _dense_variables(model)
    problems = []
    if manifest["model"] != type(model).__name__:
        problems.append(f"model class {manifest['model']} vs {type(model).__name__}")
    saved_dense = {d["path"]: tuple(d["shape"]) for d in manifest["dense"]}
    pairs: list[tuple[str, Any]] = []
    try:  # by path without Keras' per-process numbers (dense_3 -> dense) and shape, in model order
        pairs = match(saved_dense, {_relative(model, v.path): v for v in dense_vars}, str(path))
    except ValueError as exc:
        problems.append(f"dense variables differ ({exc})")
    if len(manifest["tables"]) != len(tables):
        problems.append(f"{len(manifest['tables'])} embedding tables vs {len(tables)}")
    for entry, layer in zip(manifest["tables"], tables):
        if entry["dim"] != int(layer.embedding_variable.shape[1]):
            problems.append(f"table {entry['layer']}: width {entry['dim']} vs {int(layer.embedding_variable.shape[1])}")
        if entry["keys"] > layer.capacity:
            problems.append(f"table {entry['layer']}: {entry['keys']} keys do not fit {layer.capacity} rows")
        if entry.get("sharding", "replicated") == "table" and layer.num_shards > 1 and layer.sharding != "table":
            problems.append(f"table {entry['layer']}: saved table-wise (keys placed by slot), restoring "
                            f"sharding={layer.sharding!r}")
    if problems:
        raise CheckpointMismatch(f"checkpoint {str(path)!r} does not match this model: " + "; ".join(problems))

    dense, position = np.load(path / "dense.npz"), {name: i for i, name in enumerate(saved_dense)}
    for name, v in pairs:
        v.assign(dense[f"v{position[name]}"])
    for i, (entry, layer) in enumerate(zip(manifest["tables"], tables)):
        data = _read_table(path, i, entry)
        keys, vectors = data["keys"], data["vectors"]
        if layer.num_shards > 1:  # re-shard: every shard takes the keys it owns now
            slots = table_slots(optimizer, layer.embedding_variable)
            layer._sharded.restore(keys, data["key_slots"] if "key_slots" in data else np.full(len(keys), -1),
                                   [vectors] + [data[f"slot_{j}"] for j in range(len(slots))],
                                   [layer.embedding_variable, *slots])
            continue
        if getattr(layer, "vocabulary", None) is not None:
            rows = np.arange(len(keys), dtype=np.int64)  # compact rows; the vocabulary follows
            layer.vocabulary.restore(keys, rows)
        else:
            rows = keys
        table = layer.embedding_variable
        values = np.zeros(tuple(table.shape), table.dtype) if layer.vocabulary is not None else table.numpy()
        values[rows] = vectors
        table.assign(values)
        slots = table_slots(optimizer, table)
        if optimizer is not None and slots:
            for j, slot in enumerate(slots):
                full = np.zeros(tuple(slot.shape), slot.dtype)
                if f"slot_{j}" in data:
                    full[rows] = data[f"slot_{j}"]
                slot.assign(full)
    if optimizer is not None and optimizer.built:
        saved = np.load(path / "optimizer.npz")
        slot_ids = {id(s) for layer in tables for s in table_slots(optimizer, layer.embedding_variable)}
        others = [v for v in optimizer.variables if id(v) not in slot_ids]
        if len(others) != len(saved.files):
            raise CheckpointMismatch(f"checkpoint {str(path)!r}: optimizer has {len(others)} variables, "
                                     f"the checkpoint {len(saved.files)}")
        for i, v in enumerate(others):
            v.assign(saved[f"v{i}"])
    return manifest["state"]


def checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (``step-*`` with a manifest) in `directory`, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _STEP_DIR.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    found = checkpoints(directory)
    return found[-1] if found else None


def step_dir(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}"
