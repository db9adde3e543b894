"""Save and load everything an `EmbeddingTrainingCache` trains: dense weights, table rows, state.

A save is one ``params-NNNNNN`` folder under the save directory, written whole in a staging
folder and renamed into place, and then named by the ``LATEST`` file (also replaced
atomically): a crash at any moment leaves the previous save loadable. The last two saves stay.

A folder holds:

* ``dense.npz``: the model's variables other than the tables, and the optimizer's variables
  other than the tables' slots, named relative to the model (see `dense_variables` and `match`,
  which loads them into another instance of the model, whatever Keras numbered its layers);
* ``<table>.keys.npy`` and ``<table>.rows.npy``: every key the parameter server holds and its
  row (vector, then optimizer state);
* ``meta.json``: each table's row width and vector size.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sok_tutorial.atomic import atomic_directory, write_file
from sok_tutorial.training.naming import match

if TYPE_CHECKING:
    from sok_tutorial.cache.training_cache import EmbeddingTrainingCache

LATEST = "LATEST"


def dense_variables(cache: EmbeddingTrainingCache) -> dict[str, Any]:
    """``{name in the save: variable}`` of what is saved besides the tables, in the model's order.

    Names are relative to the model: its own name, which Keras numbers per process
    (``wide_and_deep_1``), is left out of variable paths (``model/hidden/kernel``) and of the
    optimizer's names for them (``optimizer/hidden_kernel_momentum``).
    """
    tables = {id(table.variable) for table in cache.tables}
    slots = {id(v) for pairs in cache.slots.values() for v, _ in pairs}
    named = [(f"model/{_relative(v.path, cache.model.name + '/')}", v)
             for v in cache.model.variables if id(v) not in tables]
    named += [(f"optimizer/{_relative(v.name, cache.model.name + '_')}", v)
              for v in cache.optimizer.variables if id(v) not in slots]
    out: dict[str, Any] = {}
    for name, variable in named:
        key, k = name, 1
        while key in out:  # names Keras does not keep unique stay apart, in order
            key, k = f"{name}#{k}", k + 1
        out[key] = variable
    return out


def _relative(name: str, head: str) -> str:
    return name[len(head):] if name.startswith(head) and len(name) > len(head) else name


def save_params(cache: EmbeddingTrainingCache, root: Path) -> Path:
    """Write a new ``params-NNNNNN`` folder under `root`, point ``LATEST`` at it; return it."""
    root.mkdir(parents=True, exist_ok=True)
    done = sorted(p.name for p in root.glob("params-[0-9]*") if p.is_dir())
    name = f"params-{int(done[-1].split('-')[1]) + 1 if done else 0:06d}"
    with atomic_directory(root / name, overwrite=False, arg="directory") as tmp:
        dense = dense_variables(cache)
        np.savez(tmp / "dense.npz", **{k: np.asarray(v.numpy()) for k, v in dense.items()})
        for table in cache.tables:
            keys = cache.ps.keys(table.name)
            rows, _ = cache.ps.pull(table.name, keys)
            np.save(tmp / f"{table.name}.keys.npy", keys)
            np.save(tmp / f"{table.name}.rows.npy", rows)
        (tmp / "meta.json").write_text(json.dumps({"widths": cache.widths, "dims": {
            table.name: table.dim for table in cache.tables}}, indent=2, sort_keys=True))
    write_file(root / LATEST, name)
    for old in done[:-1]:
        shutil.rmtree(root / old, ignore_errors=True)
    return root / name


def load_params(cache: EmbeddingTrainingCache, root: Path) -> tuple[Path, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Assign the dense weights of the save ``LATEST`` names; return its folder and its tables.

    The tables come back as ``{table: (keys, rows)}`` for the cache to push to its server.
    """
    if not (root / LATEST).exists():
        raise FileNotFoundError(f"directory={str(root)!r} holds no saved parameters ({LATEST} is missing)")
    folder = root / (root / LATEST).read_text().strip()
    meta = json.loads((folder / "meta.json").read_text())
    if meta["widths"] != cache.widths:
        raise ValueError(f"saved tables {meta['widths']} do not match this model and optimizer {cache.widths}")
    with np.load(folder / "dense.npz") as saved:
        arrays = {name: saved[name] for name in saved.files}  # in save order
    pairs = match({name: a.shape for name, a in arrays.items()}, dense_variables(cache), str(folder))
    tables = {table.name: (np.load(folder / f"{table.name}.keys.npy"), np.load(folder / f"{table.name}.rows.npy"))
              for table in cache.tables}
    for name, variable in pairs:  # only once everything is read and matches
        variable.assign(arrays[name])
    return folder, tables
