"""Save and load everything an `EmbeddingTrainingCache` trains: dense weights, table rows, state.

A save is one ``params-NNNNNN`` folder under the save directory, written whole in a staging
folder and renamed into place, and then named by the ``LATEST`` file (also replaced
atomically): a crash at any moment leaves the previous save loadable. The last two saves stay.

A folder holds:

* ``dense.npz``: the model's variables other than the tables, and the optimizer's variables
  other than the tables' slots;
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

if TYPE_CHECKING:
    from sok_tutorial.cache.training_cache import EmbeddingTrainingCache

LATEST = "LATEST"


def dense_variables(cache: EmbeddingTrainingCache) -> dict[str, Any]:
    """``{name in the save: variable}`` of what is saved besides the tables."""
    tables = {id(layer.embedding_variable) for layer in cache.layers}
    slots = {id(v) for pairs in cache.slots.values() for v, _ in pairs}
    out = {f"model/{v.path}": v for v in cache.model.variables if id(v) not in tables}
    out |= {f"optimizer/{v.name}": v for v in cache.optimizer.variables if id(v) not in slots}
    return out


def save_params(cache: EmbeddingTrainingCache, root: Path) -> Path:
    """Write a new ``params-NNNNNN`` folder under `root`, point ``LATEST`` at it; return it."""
    root.mkdir(parents=True, exist_ok=True)
    done = sorted(p.name for p in root.glob("params-[0-9]*") if p.is_dir())
    name = f"params-{int(done[-1].split('-')[1]) + 1 if done else 0:06d}"
    with atomic_directory(root / name, overwrite=False, arg="directory") as tmp:
        dense = dense_variables(cache)
        np.savez(tmp / "dense.npz", **{k: np.asarray(v.numpy()) for k, v in dense.items()})
        for layer in cache.layers:
            keys = cache.ps.keys(layer.name)
            rows, _ = cache.ps.pull(layer.name, keys)
            np.save(tmp / f"{layer.name}.keys.npy", keys)
            np.save(tmp / f"{layer.name}.rows.npy", rows)
        (tmp / "meta.json").write_text(json.dumps({"widths": cache.widths, "dims": {
            layer.name: layer.embedding_vec_size for layer in cache.layers}}, indent=2, sort_keys=True))
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
    dense = dense_variables(cache)
    with np.load(folder / "dense.npz") as saved:
        missing = sorted(set(dense) - set(saved.files))
        if missing:
            raise ValueError(f"the save in {str(folder)!r} lacks variables {missing[:5]}")
        for key, variable in dense.items():
            variable.assign(saved[key])
    tables = {layer.name: (np.load(folder / f"{layer.name}.keys.npy"), np.load(folder / f"{layer.name}.rows.npy"))
              for layer in cache.layers}
    return folder, tables
