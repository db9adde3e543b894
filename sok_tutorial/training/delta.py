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
error naming what differs, and the export is left as it was.

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

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sok_tutorial.atomic import atomic_directory, read_json
from sok_tutorial.embedding import lifecycle
from sok_tutorial.embedding.table import tables_of
from sok_tutorial.training.checkpoint import (
    FORMAT,
    MANIFEST,
    CheckpointMismatch,
    _dense_variables,
    _relative,
    read_tables,
    save_checkpoint,
)

_TABLE_ARRAYS = ("keys", "vectors", "key_slots", "marks", "counts")


def _marks(model: Any) -> list[int]:
    return [lifecycle.mark(table) for table in tables_of(model)]


def export_model_tables(model: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """A full export of `model` for serving: every table's rows by key, the dense variables and
    each table's mark (the base the first delta starts from). Loads with `load_checkpoint`."""
    return save_checkpoint(path, model, None, state={"export": {"marks": _marks(model)}}, overwrite=overwrite)


def _since(since: Any, model: Any) -> list[int]:
    """Each table's mark to start from: an export's or delta's marks, or one int for all."""
    n = len(tables_of(model))
    if isinstance(since, (int, np.integer)) and not isinstance(since, bool):
        return [int(since)] * n
    if not isinstance(since, (str, os.PathLike)):
        raise TypeError(f"since={since!r} is invalid: expected an export or delta directory, or a mark (int)")
    marks = _read_marks(Path(since), "since")
    if len(marks) != n:
        raise ValueError(f"since={str(since)!r} has {len(marks)} tables, the model {n}")
    return marks


def _read_marks(path: Path, arg: str) -> list[int]:
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(f"{arg}={str(path)!r} is not an export or delta ({MANIFEST} missing)")
    manifest = read_json(path / MANIFEST, "manifest")
    if manifest.get("kind") == "delta":
        return [t["mark"] for t in manifest["tables"]]
    marks = manifest.get("state", {}).get("export", {}).get("marks")
    if marks is None:
        raise ValueError(f"{arg}={str(path)!r} is a checkpoint without table marks, not an export "
                         "(write it with export_model_tables)")
    return marks


def export_delta(model: Any, path: str | os.PathLike, since: Any, *, optimizer: Any = None,
                 overwrite: bool = False) -> Path:
    """Write the rows of `model`'s tables that changed after `since` (an export or delta directory,
    or a mark), the keys evicted since, and the dense variables, to the directory `path`.

    With `optimizer`, the changed rows' optimizer slots go too (``slot_<j>``), for a trainer that
    resumes from deltas; serving needs none.
    """
    tables, starts = tables_of(model), _since(since, model)
    parts = []
    for table, start in zip(tables, starts):
        if not table.lifecycle.track_changes:
            raise ValueError(f"table {table.name!r} does not track changes: build it with track_changes=True (or "
                             "an eviction_policy) to export deltas")
        arrays = table.export(optimizer, since=start)
        arrays.pop("shard")
        arrays["evicted"] = lifecycle.evicted_since(table, start)
        parts.append(arrays)
    dense = {_relative(model, v.path): v.numpy() for v in _dense_variables(model, tables)}
    return write_delta(path, model, parts, starts, _marks(model), dense, overwrite=overwrite)


def write_delta(path: str | os.PathLike, model: Any, parts: Sequence[Mapping[str, np.ndarray]],
                since: Sequence[int], marks: Sequence[int], dense: Mapping[str, np.ndarray], *,
                overwrite: bool = False) -> Path:
    """Write a delta directory from per-table arrays (``keys``, ``vectors``, ..., ``evicted``)."""
    tables = tables_of(model)
    with atomic_directory(path, overwrite=overwrite, arg="path") as tmp:
        (tmp / "tables").mkdir()
        entries = []
        for i, (table, arrays, start, mark) in enumerate(zip(tables, parts, since, marks)):
            np.savez(tmp / "tables" / f"{i}.npz", **arrays)
            entries.append({"layer": _relative(model, table.path), "dim": table.dim, "since": int(start),
                            "mark": int(mark), "keys": len(arrays["keys"]), "evicted": len(arrays["evicted"])})
        np.savez(tmp / "dense.npz", **{f"v{i}": a for i, a in enumerate(dense.values())})
        manifest = {"format": FORMAT, "kind": "delta", "model": type(model).__name__, "tables": entries,
                    "dense": [{"path": p, "shape": list(a.shape)} for p, a in dense.items()]}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return Path(path)


def _check(export: dict[str, Any], delta: dict[str, Any], marks: list[int], where: str) -> None:
    problems = []
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


def apply_delta(export_dir: str | os.PathLike, delta_dir: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Apply the delta at `delta_dir` to the export at `export_dir`, atomically; returns per table
    the rows changed, keys evicted and keys held afterwards."""
    export_dir, delta_dir = Path(export_dir), Path(delta_dir)
    marks = _read_marks(export_dir, "export_dir")
    export = read_json(export_dir / MANIFEST, "export manifest")
    if not (delta_dir / MANIFEST).is_file():
        raise FileNotFoundError(f"delta_dir={str(delta_dir)!r} is not a delta ({MANIFEST} missing: incomplete?)")
    delta = read_json(delta_dir / MANIFEST, "delta manifest")
    if delta.get("kind") != "delta":
        raise ValueError(f"delta_dir={str(delta_dir)!r} is not a delta (manifest kind {delta.get('kind')!r})")
    _check(export, delta, marks, f"delta {str(delta_dir)!r} does not apply to export {str(export_dir)!r}")
    changes = [dict(np.load(delta_dir / "tables" / f"{i}.npz")) for i in range(len(delta["tables"]))]
    merged = [merge(base, change) for base, change in zip(read_tables(export_dir), changes)]
    dense = dict(np.load(delta_dir / "dense.npz"))
    summary = {}
    with atomic_directory(export_dir, overwrite=True, arg="export_dir") as tmp:
        (tmp / "tables").mkdir()
        for i, (entry, arrays, change) in enumerate(zip(export["tables"], merged, delta["tables"])):
            np.savez(tmp / "tables" / f"{i}.npz", **arrays)
            entry.update(keys=len(arrays["keys"]), files=1, slots=entry["slots"] if "slot_0" in arrays else [])
            summary[entry["layer"]] = {"changed": change["keys"], "evicted": change["evicted"],
                                       "keys": len(arrays["keys"])}
        np.savez(tmp / "dense.npz", **dense)
        for name in os.listdir(export_dir):
            if name.endswith(".npz") and name != "dense.npz":
                (tmp / name).write_bytes((export_dir / name).read_bytes())  # optimizer.npz: unchanged
        export["state"] = {**export.get("state", {}), "export": {"marks": [t["mark"] for t in delta["tables"]]}}
        (tmp / MANIFEST).write_text(json.dumps(export, indent=2) + "\n")
    return summary
