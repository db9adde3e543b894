"""The dataset convention: column kinds, ``schema.json`` and ``_file_list.txt``.

A dataset directory holds::

    part-00000.parquet  part-00001.parquet  ...   one part per worker, row groups sized for streaming
    part-00000.parquet.keyset  ...                 optional: the unique keys of each part
    schema.json                                    columns, row counts, generator metadata
    _file_list.txt                                 number of files, then one file name per line

Every column has a kind: ``categorical`` (one int64 id per row), ``continuous`` (a float),
``label`` or ``list`` (a multi-hot int64 column, ragged: ``list<int64>``, or ``list<list<int64>>``
with a fixed number of ``slots`` per row as in SOK's ``[batch, slot, nnz]`` samples). When every
slot holds the same number of keys (``nnz``), the column is stored flat, ``slots * nnz`` values
per row (it decodes several times faster than nested lists), and read back as
``[batch, slot, nnz]``.
"""
from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from kernels import checks
from sok_tutorial.atomic import read_json, write_file, write_json

KINDS = ("categorical", "continuous", "label", "list")
SCHEMA_FILE = "schema.json"
FILE_LIST = "_file_list.txt"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ColumnSchema:
    """One column of a dataset.

    Args:
        name: column name in the parquet files.
        kind: one of ``categorical``, ``continuous``, ``label``, ``list``.
        dtype: NumPy name of the values' type (``int64``, ``float32``...).
        cardinality: ids lie in ``[0, cardinality)`` when known (after categorify or hashing).
        max_nnz: longest list in the column (``list`` only); the writer measures it.
        slots: fixed number of inner lists per row for ``list<list<int64>>`` columns.
        nnz: with ``slots``, a fixed number of keys per slot: stored flat as ``list<int64>``.
        key_offset: start of this column's ids in the dataset's global key space (keysets).
    """

    name: str
    kind: str
    dtype: str
    cardinality: int | None = None
    max_nnz: int | None = None
    slots: int | None = None
    nnz: int | None = None
    key_offset: int | None = None

    def __post_init__(self) -> None:
        checks.one_of(f"kind of column {self.name!r}", self.kind, KINDS)
        if self.cardinality is not None:
            checks.positive_int(f"cardinality of column {self.name!r}", self.cardinality)
        if self.nnz is not None and not self.slots:
            raise ValueError(f"column {self.name!r}: nnz={self.nnz} needs slots (keys per slot of slotted lists)")

    def arrow_type(self) -> pa.DataType:
        value = pa.from_numpy_dtype(self.dtype)
        if self.kind != "list":
            return value
        return pa.list_(pa.list_(value)) if self.slots and not self.nnz else pa.list_(value)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass
class Schema:
    """The columns of a dataset plus its row counts and free-form metadata."""

    columns: tuple[ColumnSchema, ...]
    parts: tuple[dict[str, Any], ...] = ()  # [{"file": ..., "num_rows": ...}] once written
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.columns = tuple(self.columns)
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"columns: duplicate column names {dupes}")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def num_rows(self) -> int:
        return sum(p["num_rows"] for p in self.parts)

    def __getitem__(self, name: str) -> ColumnSchema:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"no column {name!r} in schema; columns are {self.names}")

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def names_of(self, kind: str) -> list[str]:
        checks.one_of("kind", kind, KINDS)
        return [c.name for c in self.columns if c.kind == kind]

    def select(self, names: Sequence[str]) -> "Schema":
        checks.known_names("names", names, self.names)
        return Schema(tuple(self[n] for n in names), self.parts, dict(self.metadata))

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type()) for c in self.columns])

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "columns": [c.to_dict() for c in self.columns],
            "num_rows": self.num_rows,
            "parts": list(self.parts),
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Schema":
        columns = tuple(ColumnSchema(**c) for c in d["columns"])
        return cls(columns, tuple(d.get("parts", ())), dict(d.get("metadata", {})))

    def save(self, directory: str | os.PathLike) -> Path:
        return write_json(Path(directory) / SCHEMA_FILE, self.to_dict())

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Schema":
        path = Path(directory) / SCHEMA_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {SCHEMA_FILE} in {str(directory)!r}: not a dataset directory")
        return cls.from_dict(read_json(path, "dataset schema"))

    @classmethod
    def infer(cls, arrow_schema: pa.Schema, *, cat_names: Iterable[str] = (),
              cont_names: Iterable[str] = (), label_names: Iterable[str] = (),
              list_names: Iterable[str] = (), cardinalities: dict[str, int] | None = None) -> "Schema":
        """Build a schema from an Arrow schema and the names of each kind (others are dropped)."""
        cardinalities = dict(cardinalities or {})
        columns = []
        kinds = [("categorical", cat_names), ("continuous", cont_names),
                 ("label", label_names), ("list", list_names)]
        for kind, names in kinds:
            for name in checks.known_names(f"{kind} names", names, arrow_schema.names):
                columns.append(_infer_column(name, kind, arrow_schema.field(name).type,
                                             cardinalities.get(name)))
        return cls(tuple(columns))


def _infer_column(name: str, kind: str, atype: pa.DataType, cardinality: int | None) -> ColumnSchema:
    slots = None
    if kind == "list":
        if not pa.types.is_list(atype) and not pa.types.is_large_list(atype):
            raise TypeError(f"list column {name!r} has Arrow type {atype}, expected a list type")
        atype = atype.value_type
        if pa.types.is_list(atype) or pa.types.is_large_list(atype):
            atype, slots = atype.value_type, 0  # slots measured by the writer
    if kind in ("categorical", "list"):
        if not pa.types.is_integer(atype):
            raise TypeError(f"{kind} column {name!r} has Arrow type {atype}: expected integer ids "
                            "(run Categorify on strings first)")
        dtype = "int64"
    elif kind == "continuous":
        if not (pa.types.is_floating(atype) or pa.types.is_integer(atype)):
            raise TypeError(f"continuous column {name!r} has Arrow type {atype}, expected a number")
        dtype = "float32"  # what the model consumes; halves the bytes of float64 sources
    else:
        if not (pa.types.is_integer(atype) or pa.types.is_floating(atype) or pa.types.is_boolean(atype)):
            raise TypeError(f"label column {name!r} has Arrow type {atype}, expected a number")
        dtype = "float32" if pa.types.is_floating(atype) else "int8"
    return ColumnSchema(name, kind, dtype, cardinality=cardinality, slots=slots or None)


def write_file_list(directory: str | os.PathLike, files: Sequence[str]) -> Path:
    """HugeCTR's file-list layout: the number of files, then one path per line (relative)."""
    return write_file(Path(directory) / FILE_LIST, "".join([f"{len(files)}\n"] + [f"{f}\n" for f in files]))


def read_file_list(path: str | os.PathLike) -> list[Path]:
    """Read a ``_file_list.txt``; relative entries resolve against the list's directory and must
    stay inside it (``../`` out of it is an error); absolute entries are taken as they are."""
    path = Path(path)
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    if not lines or not lines[0].isdigit() or int(lines[0]) != len(lines) - 1:
        raise ValueError(f"{str(path)!r} is not a file list: expected a count line followed by that many paths")
    files = [p if p.is_absolute() else path.parent / p for p in map(Path, lines[1:])]
    root = path.parent.resolve()
    escaping = [str(p) for p in map(Path, lines[1:]) if not p.is_absolute()
                and root not in (root / p).resolve().parents]
    if escaping:
        raise ValueError(f"{str(path)!r} lists {escaping[:3]}, relative paths that leave its directory; a file list "
                         "names files inside its directory (or absolute paths)")
    return files


def resolve_files(paths_or_dataset: Any, arg: str = "paths_or_dataset") -> list[Path]:
    """Parquet files named by a dataset directory, a file list, a glob, a file, or a list of them."""
    if isinstance(paths_or_dataset, (str, os.PathLike)):
        items = [paths_or_dataset]
    else:
        items = list(paths_or_dataset)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            if (p / FILE_LIST).is_file():
                files += read_file_list(p / FILE_LIST)
            else:
                files += sorted(p.glob("*.parquet"))
        elif p.is_file() and p.suffix == ".txt":
            files += read_file_list(p)
        elif p.is_file():
            files.append(p)
        else:
            files += [Path(f) for f in sorted(glob.glob(str(item)))]
    if not files:
        raise FileNotFoundError(f"{arg}={paths_or_dataset!r}: no parquet files found")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{arg}={paths_or_dataset!r}: listed files do not exist: {missing[:5]}")
    return files


def dataset_dir(paths_or_dataset: Any) -> Path | None:
    """The directory holding ``schema.json`` for these files, if they form one dataset."""
    files = resolve_files(paths_or_dataset)
    parents = {f.parent for f in files}
    if len(parents) == 1 and (next(iter(parents)) / SCHEMA_FILE).is_file():
        return next(iter(parents))
    return None
