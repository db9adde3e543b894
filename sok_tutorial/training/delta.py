"""Publishing a model that keeps training: one full export, then small deltas a server applies.

A serving process holds an export: the checkpoint layout (`sok_tutorial.training.checkpoint`)
without optimizer state, whose manifest also records each table's mark (its clock, see
`sok_tutorial.embedding.lifecycle`). After each training period the trainer writes a delta::

    delta/
        tables/<i>.npz   keys, vectors (and marks, counts) of the rows that changed since the
                         base, and ``evicted``: the keys evicted since (some may be back, above)
        dense.npz        every dense variable (they change every step and are small)
        manifest.json    kind "delta", each table's ``since`` and ``mark``; written last

and the server applies it: `apply_delta` drops the evicted keys from the export, writes the
changed rows over it, and replaces the export directory in one rename, so a reader sees the old
export or the new one, never a mix. A chain of deltas applied to the first export equals a full
export of the latest model (up to the order of keys). A delta is checked against the export
first: same model class, same tables (name, width) and dense variables, and marks that join up
(the delta starts at or before the export's mark and ends at or after it); anything else is an
error naming what differs, and the export is left as it was. So is a delta whose own files do
not agree (`DeltaError`: a missing or damaged file, keys without vectors, repeated or non-integer
keys, rows of another width, NaN values, dense variables of other shapes): what is published
always loads. One process at a time applies deltas to an export (a lock file beside it). Each
full export starts a lineage (an id in its manifest) that the deltas continuing from it carry, so a
delta of another trainer's export is refused too.

The tables must track changes (``track_changes=True``, or any eviction policy). The training
cache writes its incremental model in this format too
(`EmbeddingTrainingCache.get_incremental_model` with ``path=``).

Example:
    >>> import tempfile, pathlib, keras, tensorflow as tf
    >>> from sok_tutorial.embedding import EmbeddingTable
    >>> table = EmbeddingTable(8, 2, eviction_policy="lru", name="items")
    >>> model = keras.Sequential([keras.Input((1,), dtype="int64"), table])
    >>> _ = table(tf.constant([1, 2], tf.int64), training=True)
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = export_model_tables(model, root / "serving")
    >>> _ = table(tf.constant([2, 3], tf.int64), training=True)
    >>> _ = export_delta(model, root / "d1", since=root / "serving")
    >>> summary = apply_delta(root / "serving", root / "d1")
    >>> summary["items"]
    {'changed': 2, 'evicted': 0, 'keys': 3}
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kernels import checks
from sok_tutorial.atomic import atomic_directory, read_json
from sok_tutorial.embedding import lifecycle
from sok_tutorial.embedding.table import tables_of
from sok_tutorial.embedding.table_rows import checked_mark
from sok_tutorial.training.checkpoint import (
    FORMAT,
    MANIFEST,
    CheckpointMismatch,
    dense_variables,
    held_in_part,
    read_npz,
    read_tables,
    relative_path,
    save_checkpoint,
    worker_barrier,
)

_TABLE_ARRAYS = ("keys", "vectors", "key_slots", "marks", "counts")


def _marks(model: Any) -> list[int]:
    return [lifecycle.mark(table) for table in tables_of(model)]


def export_model_tables(model: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """A full export of `model` for serving: every table's rows by key, the dense variables, each
    table's mark (the base the first delta starts from) and a new lineage id, which every delta
    continuing from this export carries. Loads with `load_checkpoint`."""
    state = {"export": {"marks": _marks(model), "lineage": uuid.uuid4().hex}}
    return save_checkpoint(path, model, None, state=state, overwrite=overwrite)


def _since(since: Any, model: Any) -> list[int]:
    """Each table's mark to start from: an export's or delta's marks, or one int for all."""
    n = len(tables_of(model))
    if isinstance(since, (int, np.integer)) and not isinstance(since, (bool, np.bool_)):
        return [checked_mark(since)] * n
    if not isinstance(since, (str, os.PathLike)):
        raise TypeError(f"since={since!r} is invalid: expected an export or delta directory, or a mark (int)")
    marks = _read_base(Path(since), "since")[0]
    if len(marks) != n:
        raise ValueError(f"since={str(since)!r} has {len(marks)} tables, the model {n}")
    return marks


def _read_base(path: Path, arg: str) -> tuple[list[int], str | None]:
    """(each table's mark, the lineage) of an export or delta directory."""
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(f"{arg}={str(path)!r} is not an export or delta ({MANIFEST} missing)")
    return _base_of(read_json(path / MANIFEST, "manifest"), path, arg)


def _base_of(manifest: dict[str, Any], path: Path, arg: str) -> tuple[list[int], str | None]:
    if manifest.get("kind") == "delta":
        return [t["mark"] for t in manifest["tables"]], manifest.get("lineage")
    export = manifest.get("state", {}).get("export", {})
    if export.get("marks") is None:
        raise ValueError(f"{arg}={str(path)!r} is a checkpoint without table marks, not an export "
                         "(write it with export_model_tables)")
    return export["marks"], export.get("lineage")


def export_delta(model: Any, path: str | os.PathLike, since: Any, *, optimizer: Any = None,
                 overwrite: bool = False) -> Path:
    """Write the rows of `model`'s tables that changed after `since` (an export or delta directory,
    or a mark), the keys evicted since, and the dense variables, to the directory `path`.

    With `optimizer`, the changed rows' optimizer slots go too (``slot_<j>``), for a trainer that
    resumes from deltas; serving needs none.
    """
    checks.flag("overwrite", overwrite)
    tables, starts = tables_of(model), _since(since, model)
    for table, start in zip(tables, starts):
        if not table.lifecycle.track_changes:
            raise ValueError(f"table {table.name!r} does not track changes: build it with track_changes=True (or "
                             "an eviction_policy) to export deltas")
        if start > lifecycle.mark(table):
            raise ValueError(f"since={since!r} is invalid: table {table.name!r} has reached mark "
                             f"{lifecycle.mark(table)}, and a delta starts at a mark its tables have reached")
    parts = []
    for table, start in zip(tables, starts):
        arrays = table.export(optimizer, since=start)
        arrays.pop("shard")
        arrays["evicted"] = lifecycle.evicted_since(table, start)
        parts.append(arrays)
    dense = {relative_path(model, v.path): v.numpy() for v in dense_variables(model, tables)}
    lineage = None if isinstance(since, (int, np.integer)) else _read_base(Path(since), "since")[1]
    partial = [table for table in tables if held_in_part(table)]
    if not partial:
        return write_delta(path, model, parts, starts, _marks(model), dense, overwrite=overwrite, lineage=lineage)
    return _write_delta_of_workers(path, model, parts, starts, dense, partial[0], overwrite, lineage)


def _write_delta_of_workers(path: str | os.PathLike, model: Any, parts: list[dict[str, np.ndarray]],
                            starts: list[int], dense: dict[str, np.ndarray], table: Any, overwrite: bool,
                            lineage: str | None) -> Path:
    """Tables sharded over worker processes: every worker calls `export_delta` with the same `path`
    (a directory all can reach) and stages its shards' rows beside it; worker 0 joins them into one
    delta in the one-device layout, as `save_checkpoint` does for checkpoints."""
    tables = tables_of(model)
    workers = table.num_shards // len(table.local_shards)
    worker = table.local_shards[0] // len(table.local_shards)
    staging = Path(path).with_name(f".{Path(path).name}.shards")
    staging.mkdir(parents=True, exist_ok=True)
    for i, (t, arrays) in enumerate(zip(tables, parts)):
        if held_in_part(t):
            np.savez(staging / f"{i}.worker{worker}.npz", **arrays)
    worker_barrier(table)  # every worker's rows are on disk
    if worker == 0:
        for i, t in enumerate(tables):
            if held_in_part(t):
                shards = [dict(np.load(staging / f"{i}.worker{w}.npz")) for w in range(workers)]
                parts[i] = {name: np.concatenate([shard[name] for shard in shards]) for name in shards[0]}
        write_delta(path, model, parts, starts, _marks(model), dense, overwrite=overwrite, lineage=lineage)
        shutil.rmtree(staging, ignore_errors=True)
    worker_barrier(table)  # the delta is complete before anyone reads it
    return Path(path)


def write_delta(path: str | os.PathLike, model: Any, parts: Sequence[Mapping[str, np.ndarray]],
                since: Sequence[int], marks: Sequence[int], dense: Mapping[str, np.ndarray], *,
                overwrite: bool = False, lineage: str | None = None) -> Path:
    """Write a delta directory from per-table arrays (``keys``, ``vectors``, ..., ``evicted``);
    `lineage`: the id of the export it continues (None: a delta from a bare mark, checked by
    marks alone)."""
    tables = tables_of(model)
    with atomic_directory(path, overwrite=overwrite, arg="path") as tmp:
        (tmp / "tables").mkdir()
        entries = []
        for i, (table, arrays, start, mark) in enumerate(zip(tables, parts, since, marks)):
            np.savez(tmp / "tables" / f"{i}.npz", **arrays)
            entries.append({"layer": relative_path(model, table.path), "dim": table.dim, "since": int(start),
                            "mark": int(mark), "keys": len(arrays["keys"]), "evicted": len(arrays["evicted"])})
        np.savez(tmp / "dense.npz", **{f"v{i}": a for i, a in enumerate(dense.values())})
        manifest = {"format": FORMAT, "kind": "delta", "model": type(model).__name__, "lineage": lineage,
                    "tables": entries,
                    "dense": [{"path": p, "shape": list(a.shape)} for p, a in dense.items()]}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return Path(path)


def _check(export: dict[str, Any], delta: dict[str, Any], marks: list[int], where: str) -> None:
    problems = []
    ours, theirs = export.get("state", {}).get("export", {}).get("lineage"), delta.get("lineage")
    if ours is not None and theirs is not None and ours != theirs:
        problems.append(f"the delta continues export lineage {theirs}, this export is lineage {ours} (a delta of "
                        "another trainer's export?)")
    if export["model"] != delta["model"]:
        problems.append(f"model class {delta['model']} vs {export['model']}")
    if len(export["tables"]) != len(delta["tables"]):
        problems.append(f"{len(delta['tables'])} tables vs {len(export['tables'])}")
    for entry, change, mark in zip(export["tables"], delta["tables"], marks):
        name = entry["layer"]
        if (entry["layer"], entry["dim"]) != (change["layer"], change["dim"]):
            problems.append(f"table {change['layer']} (width {change['dim']}) vs {name} (width {entry['dim']})")
        elif change["since"] > mark:
            problems.append(f"table {name}: the delta starts after mark {change['since']} but the export is at "
                            f"mark {mark}: the changes in between are missing (apply the deltas in order)")
        elif change["mark"] < mark:
            problems.append(f"table {name}: the delta ends at mark {change['mark']}, older than the export's {mark}")
    dense = {d["path"]: d["shape"] for d in export["dense"]}
    if dense != {d["path"]: d["shape"] for d in delta["dense"]}:
        problems.append("dense variables differ (names or shapes)")
    if problems:
        raise CheckpointMismatch(f"{where}: " + "; ".join(problems))


def merge(base: Mapping[str, np.ndarray], change: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`base` rows without the evicted keys and the changed ones, then the changed rows. Arrays the
    delta does not carry (optimizer slots of a training save) are dropped: the result serves."""
    drop = np.isin(base["keys"], np.concatenate([change["evicted"], change["keys"]]))
    names = [n for n in base if n in change and n != "evicted"]
    return {n: np.concatenate([np.asarray(base[n])[~drop], np.asarray(change[n])]) for n in names}


class DeltaError(ValueError):
    """A delta that cannot be applied as it is: a file missing or unreadable, or arrays that do not
    agree with each other, with its manifest or with the export. Nothing was written."""


def _load_npz(path: Path, where: str) -> dict[str, np.ndarray]:
    try:
        return read_npz(path)
    except FileNotFoundError:
        raise DeltaError(f"{where}: {path.name} is missing (an incomplete copy?)") from None
    except ValueError as exc:
        raise DeltaError(f"{where}: {exc}") from None


def _delta_manifest(delta_dir: Path) -> dict[str, Any]:
    if not (delta_dir / MANIFEST).is_file():
        raise FileNotFoundError(f"delta_dir={str(delta_dir)!r} is not a delta ({MANIFEST} missing: incomplete?)")
    delta = read_json(delta_dir / MANIFEST, "delta manifest")
    if not isinstance(delta, dict) or delta.get("kind") != "delta":
        kind = delta.get("kind") if isinstance(delta, dict) else type(delta).__name__
        raise ValueError(f"delta_dir={str(delta_dir)!r} is not a delta (manifest kind {kind!r})")
    fields = {"layer": str, "dim": int, "since": int, "mark": int, "keys": int, "evicted": int}
    tables, dense = delta.get("tables"), delta.get("dense")
    if not (isinstance(tables, list) and isinstance(dense, list)
            and all(isinstance(t, dict) and all(isinstance(t.get(k), v) for k, v in fields.items()) for t in tables)
            and all(isinstance(d, dict) and isinstance(d.get("path"), str) and isinstance(d.get("shape"), list)
                    for d in dense)):
        raise DeltaError(f"delta_dir={str(delta_dir)!r}: its {MANIFEST} lacks a table or dense entry, or one is "
                         f"malformed (each table needs {', '.join(fields)}; each dense variable path and shape)")
    return delta


def _check_table(change: dict[str, np.ndarray], entry: dict[str, Any], base: Mapping[str, np.ndarray],
                 where: str) -> None:
    """The arrays of one table of a delta agree with each other, the manifest and the export."""
    def bad(message: str) -> DeltaError:
        return DeltaError(f"{where}, table {entry['layer']}: {message}")

    for name in ("keys", "vectors", "evicted"):
        if name not in change:
            raise bad(f"no {name!r} array")
    keys, vectors, evicted = change["keys"], change["vectors"], change["evicted"]
    for name, array in (("keys", keys), ("evicted", evicted)):
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise bad(f"{name} is {array.dtype} of shape {array.shape}, expected a 1-d integer array")
    if keys.dtype.kind != "i":  # (merged with the export's int64 keys, unsigned ones would become floats)
        raise bad(f"keys are {keys.dtype}, expected signed integers (int64)")
    for name, array in change.items():  # the export keeps its arrays' kinds: it must load as a checkpoint
        if name != "evicted" and name in base and array.dtype.kind != base[name].dtype.kind:
            raise bad(f"{name} is {array.dtype}, the export's {base[name].dtype}")
    for name in ("marks", "counts"):
        if name in change and len(change[name]) and (change[name].dtype.kind not in "iu" or change[name].min() < 0):
            raise bad(f"{name} must be integers >= 0, got {change[name].dtype} from {change[name].min()}")
    if "marks" in change and len(change["marks"]) and int(change["marks"].max()) > entry["mark"]:
        raise bad(f"marks reach {int(change['marks'].max())}, past the delta's own mark {entry['mark']}")
    if len(np.unique(keys)) != len(keys):
        raise bad(f"{len(keys) - len(np.unique(keys))} key(s) appear twice")
    if vectors.shape != (len(keys), entry["dim"]) or not np.issubdtype(vectors.dtype, np.floating):
        raise bad(f"vectors is {vectors.dtype} of shape {vectors.shape}, expected floats of shape "
                  f"({len(keys)}, {entry['dim']}): one row per key")
    if not np.isfinite(vectors).all():
        raise bad(f"{int((~np.isfinite(vectors)).any(axis=1).sum())} vector(s) hold NaN or infinity")
    for name, array in change.items():
        if name not in ("keys", "evicted") and (array.ndim == 0 or array.shape[0] != len(keys)):
            raise bad(f"{name} has shape {array.shape} for {len(keys)} keys")
    if (entry["keys"], entry["evicted"]) != (len(keys), len(evicted)):
        raise bad(f"the manifest counts {entry['keys']} keys and {entry['evicted']} evicted, the arrays hold "
                  f"{len(keys)} and {len(evicted)}")
    if base["vectors"].shape[1:] != vectors.shape[1:]:
        raise bad(f"vectors are {vectors.shape[1]} wide, the export's {base['vectors'].shape[1]}")


def _check_dense(dense: dict[str, np.ndarray], entries: list[dict[str, Any]], where: str) -> list[np.ndarray]:
    arrays = [dense.get(f"v{i}") for i in range(len(entries))]
    for entry, array in zip(entries, arrays):
        if array is None or list(array.shape) != entry["shape"] or not np.isfinite(array).all():
            what = "missing" if array is None else f"of shape {list(array.shape)}, or not finite"
            raise DeltaError(f"{where}: dense variable {entry['path']} is {what}; expected shape {entry['shape']}")
    if len(dense) != len(entries):
        raise DeltaError(f"{where}: dense.npz holds {len(dense)} arrays, the manifest names {len(entries)}")
    return arrays


@contextlib.contextmanager
def _export_lock(export_dir: Path, timeout: float) -> Iterator[None]:
    """Hold the lock of `export_dir` (a file beside it): one process applies deltas to an export at
    a time; another waits up to `timeout` seconds, then gets a TimeoutError."""
    lock = export_dir.parent / f".{export_dir.name}.lock"
    with open(lock, "a+b") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"export_dir={str(export_dir)!r}: another process has been applying a delta "
                                       f"to it for over {timeout} s (lock {lock.name})") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def apply_delta(export_dir: str | os.PathLike, delta_dir: str | os.PathLike, *,
                lock_timeout: float = 300.0) -> dict[str, dict[str, int]]:
    """Apply the delta at `delta_dir` to the export at `export_dir`, atomically; returns per table
    the rows changed, keys evicted and keys held afterwards.

    Every array of the delta is checked first (dtypes, lengths, unique keys, widths, finite
    values, dense shapes), so what is published always loads. One process applies deltas to an
    export at a time (a lock beside it; another waits up to `lock_timeout` seconds). An export
    reached through a symbolic link is updated where the link points.
    """
    export_dir, delta_dir = Path(os.path.realpath(export_dir)), Path(delta_dir)
    if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)) or not lock_timeout >= 0:
        raise ValueError(f"lock_timeout={lock_timeout!r} is invalid: expected seconds >= 0")
    where = f"delta {str(delta_dir)!r}"
    delta = _delta_manifest(delta_dir)
    changes = [_load_npz(delta_dir / "tables" / f"{i}.npz", where) for i in range(len(delta["tables"]))]
    dense = _check_dense(_load_npz(delta_dir / "dense.npz", where), delta["dense"], where)
    _read_base(export_dir, "export_dir")  # an export at all, before a lock file is made beside it
    with _export_lock(export_dir, lock_timeout):  # read again: another process may have applied a delta
        export = read_json(export_dir / MANIFEST, "export manifest")
        marks = _base_of(export, export_dir, "export_dir")[0]
        _check(export, delta, marks, f"{where} does not apply to export {str(export_dir)!r}")
        bases = read_tables(export_dir)
        for change, entry, base in zip(changes, delta["tables"], bases):
            _check_table(change, entry, base, where)
        merged = [merge(base, change) for base, change in zip(bases, changes)]
        summary = {}
        with atomic_directory(export_dir, overwrite=True, arg="export_dir") as tmp:
            (tmp / "tables").mkdir()
            for i, (entry, arrays, change) in enumerate(zip(export["tables"], merged, delta["tables"])):
                np.savez(tmp / "tables" / f"{i}.npz", **arrays)
                entry.update(keys=len(arrays["keys"]), files=1, slots=entry["slots"] if "slot_0" in arrays else [])
                summary[entry["layer"]] = {"changed": change["keys"], "evicted": change["evicted"],
                                           "keys": len(arrays["keys"])}
            np.savez(tmp / "dense.npz", **{f"v{i}": a for i, a in enumerate(dense)})
            for name in os.listdir(export_dir):
                if name.endswith(".npz") and name != "dense.npz":
                    (tmp / name).write_bytes((export_dir / name).read_bytes())  # optimizer.npz: unchanged
            previous = export.get("state", {}).get("export", {})
            export["state"] = {**export.get("state", {}),
                               "export": {**previous, "marks": [t["mark"] for t in delta["tables"]]}}
            (tmp / MANIFEST).write_text(json.dumps(export, indent=2) + "\n")
    return summary
