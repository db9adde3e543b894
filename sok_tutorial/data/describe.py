"""What a dataset directory holds, in a form a notebook can show: its schema as a table, its size
on disk (of any directory: an export, a delta).

A dataset directory is self-describing (``schema.json`` names every column's kind, dtype and
cardinality), so a reader can check what the loader will be told before any training starts.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from sok_tutorial.data.schema import Schema

SCHEMA_FIELDS = ("name", "kind", "dtype", "cardinality", "max_nnz", "slots", "key_offset")


def schema_table(schema: Schema) -> pd.DataFrame:
    """One row per column of `schema`: what the loader will be told about it.

    Fields no column sets (``slots`` for a dataset without slotted lists, say) are left out, so
    the table shows only what matters for this dataset.

    Args:
        schema: a dataset's schema, as `Schema.load` or a writer returns it.

    Returns:
        A DataFrame indexed by column name, with the columns of `SCHEMA_FIELDS` that any column
        sets (empty strings where a column leaves one unset).

    Example:
        >>> from sok_tutorial.data.schema import ColumnSchema
        >>> schema = Schema((ColumnSchema("user", "categorical", "int64", cardinality=100),
        ...                  ColumnSchema("label", "label", "int8")))
        >>> table = schema_table(schema)
        >>> list(table.columns), table.loc["user", "cardinality"], table.loc["label", "cardinality"]
        (['kind', 'dtype', 'cardinality'], 100, '')
    """
    rows = [{f: c.to_dict().get(f, "") for f in SCHEMA_FIELDS} for c in schema.columns]
    table = pd.DataFrame(rows, columns=list(SCHEMA_FIELDS)).set_index("name")
    return table.loc[:, (table != "").any()]


def disk_bytes(path: str | os.PathLike) -> int:
    """Bytes of the files under `path` (a directory, searched recursively, or one file).

    Raises:
        FileNotFoundError: `path` does not exist.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "part.parquet").write_bytes(b"x" * 1000)
        >>> disk_bytes(d), disk_bytes(d / "part.parquet")
        (1000, 1000)
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"path={str(path)!r} does not exist")
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files)


def disk_mib(path: str | os.PathLike) -> float:
    """`disk_bytes` of `path` in MiB.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "part.parquet").write_bytes(b"x" * 2**19)
        >>> disk_mib(d)
        0.5
    """
    return disk_bytes(path) / 2**20
