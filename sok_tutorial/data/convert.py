"""Parquet conversion, "the NVTabular step": tables, DataFrames, files or streams of chunks ->
a dataset directory (parts, row groups, schema.json, _file_list.txt, optional keysets).

`to_parquet_dataset` streams in one process and splits rows into ``num_parts`` files.
`convert_files` converts many input files in parallel (Dask), one output part per input file.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from kernels import checks
from sok_tutorial.atomic import abort_directory, begin_directory, check_destination, commit_directory
from sok_tutorial.data.categorify import Categorify
from sok_tutorial.data.parallel import parallel_map
from sok_tutorial.data.schema import Schema, write_file_list
from sok_tutorial.data.tables import to_table
from sok_tutorial.data.writer import DEFAULT_ROW_GROUP_SIZE, DatasetWriter, PartWriter, as_table, finalize_schema
from sok_tutorial.progress import progress_bar

CSV_SUFFIXES = (".csv", ".tsv")


def iter_file_batches(path: str | os.PathLike, *, chunk_size: int = 1_000_000,
                      columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of a parquet or CSV file (``.csv``; ``.tsv`` is tab-separated with a header).

    Any read failure is re-raised naming the file.
    """
    path = Path(path)
    try:
        if path.suffix in CSV_SUFFIXES:
            parse = pcsv.ParseOptions(delimiter="\t" if path.suffix == ".tsv" else ",")
            convert = pcsv.ConvertOptions(include_columns=list(columns) if columns else None)
            yield from pcsv.open_csv(path, parse_options=parse, convert_options=convert)
        else:
            yield from pq.ParquetFile(path).iter_batches(batch_size=chunk_size, columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc}") from exc


def _column_kinds(**kinds: Any) -> tuple[list[str], ...]:
    """Each kind's names as a list (one string is one name), after checking some were given."""
    lists = tuple(checks.names(kind, names) for kind, names in kinds.items())
    if not any(lists):
        raise ValueError("no columns selected: pass cat_names, cont_names, label_names and/or list_names")
    return lists


def _input_paths(data: Any) -> list[Any]:
    """The files or directories `data` names (what an output must not overwrite)."""
    if isinstance(data, (str, os.PathLike)):
        return [data]
    if isinstance(data, (list, tuple)) and all(isinstance(d, (str, os.PathLike)) for d in data):
        return list(data)
    return []


def _chunks_of(data: Any, chunk_size: int, columns: list[str]) -> tuple[Iterable[Any], int | None, bool]:
    """(chunks, total rows if known, whether the chunks can be iterated twice)."""
    if isinstance(data, pa.Table) or isinstance(data, Mapping) or hasattr(data, "iloc"):
        if isinstance(data, Mapping):
            data = {c: data[c] for c in checks.known_names("columns", columns, list(data))}
        elif isinstance(data, pa.Table):
            data = data.select(checks.known_names("columns", columns, data.column_names))
        else:
            data = data[checks.known_names("columns", columns, [str(c) for c in data.columns])]
        table = to_table(data)
        slices = [table.slice(i, chunk_size) for i in range(0, max(table.num_rows, 1), chunk_size)]
        return slices, table.num_rows, True
    if isinstance(data, (str, os.PathLike)) or (isinstance(data, (list, tuple)) and data
                                                and all(isinstance(d, (str, os.PathLike)) for d in data)):
        files = [Path(d) for d in ([data] if isinstance(data, (str, os.PathLike)) else data)]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"data: input file(s) not found: {missing}")
        total = None
        if all(f.suffix not in CSV_SUFFIXES for f in files):
            total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)

        class _Files:
            def __iter__(self) -> Iterator[pa.RecordBatch]:
                for f in files:
                    yield from iter_file_batches(f, chunk_size=chunk_size, columns=columns)

        return _Files(), total, True
    return data, None, False


def to_parquet_dataset(data: Any, out_dir: str | os.PathLike, *, cat_names: Sequence[str] = (),
                       cont_names: Sequence[str] = (), label_names: Sequence[str] = (),
                       list_names: Sequence[str] = (), categorify: Categorify | None = None,
                       num_parts: int = 1, total_rows: int | None = None, chunk_size: int = 1_000_000,
                       row_group_size: int = DEFAULT_ROW_GROUP_SIZE, keyset_columns: Sequence[str] = (),
                       cardinalities: Mapping[str, int] | None = None, metadata: dict[str, Any] | None = None,
                       overwrite: bool = False, progress: bool = True) -> Schema:
    """Convert data to a dataset directory, streaming in chunks of ``chunk_size`` rows.

    Args:
        data: a pandas DataFrame, pyarrow Table, dict of arrays, parquet/CSV path(s), or an
            iterable of such chunks (then ``categorify`` must already be fitted).
        out_dir: the dataset directory to create (refused if non-empty unless ``overwrite``).
        cat_names, cont_names, label_names, list_names: the columns to keep, by kind.
        categorify: applied to its columns; fitted first (a pass over the data) if it is not.
        num_parts: number of part files (one per worker). Rows keep their order; each part
            is a contiguous slice when the row count is known.
        keyset_columns: write ``<part>.keyset`` with these columns' unique ids.
        cardinalities: declared id ranges for columns not handled by ``categorify``.

    Returns:
        The written `Schema`.

    Example:
        >>> import tempfile, pathlib, pandas as pd
        >>> df = pd.DataFrame({"user": ["u1", "u2", "u1"], "x": [0.5, 1.0, 2.0], "y": [1, 0, 1]})
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "ds"
        >>> schema = to_parquet_dataset(df, out, cat_names=["user"], cont_names=["x"], label_names=["y"],
        ...                             categorify=Categorify(["user"]), progress=False)
        >>> schema["user"].cardinality, schema.num_rows
        (3, 3)
    """
    cat_names, cont_names, label_names, list_names = _column_kinds(
        cat_names=cat_names, cont_names=cont_names, label_names=label_names, list_names=list_names)
    columns = [*cat_names, *cont_names, *label_names, *list_names]
    checks.positive_int("chunk_size", chunk_size)
    inputs = _input_paths(data)
    check_destination(out_dir, overwrite=overwrite, arg="out_dir", inputs=inputs)  # before any pass over data
    chunks, known_total, reiterable = _chunks_of(data, chunk_size, columns)
    total_rows = total_rows if total_rows is not None else known_total
    if categorify is not None and not categorify.fitted:
        if not reiterable:
            raise ValueError("categorify is not fitted and data is a one-pass stream: "
                             "fit it first (Categorify.fit) or pass a table, DataFrame or files")
        for chunk in chunks:
            categorify.partial_fit(chunk)
        categorify.finish_fit()
    cards = dict(cardinalities or {})
    if categorify is not None:
        cards.update(categorify.cardinalities)

    writer = None
    bar = progress_bar(progress, total=total_rows, desc=f"-> {Path(out_dir).name}", unit="row")
    try:
        for chunk in chunks:
            table = categorify.transform(chunk) if categorify is not None else to_table(chunk)
            if writer is None:
                schema = Schema.infer(table.schema, cat_names=cat_names, cont_names=cont_names,
                                      label_names=label_names, list_names=list_names, cardinalities=cards)
                writer = DatasetWriter(out_dir, schema, num_parts=num_parts, total_rows=total_rows,
                                       row_group_size=row_group_size, keyset_columns=keyset_columns,
                                       metadata=metadata, overwrite=overwrite, arg="out_dir", inputs=inputs)
            writer.write(table)
            bar.update(table.num_rows)
        if writer is None:
            raise ValueError("data: no rows to convert")
        return writer.close()
    except BaseException:
        if writer is not None and not writer._closed:
            writer.abort()
        raise
    finally:
        bar.close()


# ----------------------------------------------------------------- many files, in parallel
def _count_file(task: tuple[Path, Categorify, int]) -> Categorify:
    path, categorify, chunk_size = task
    part = Categorify(categorify.columns, freq_threshold=categorify.freq_threshold, max_size=categorify.max_size)
    for batch in iter_file_batches(path, chunk_size=chunk_size, columns=categorify.columns):
        part.partial_fit(batch)
    return part


def _convert_file(task: tuple[Path, Path, Schema, Categorify | None, int, int, Sequence[str], str]) -> tuple:
    src, dst, schema, categorify, chunk_size, row_group_size, keyset_columns, compression = task
    writer = PartWriter(dst, schema, row_group_size=row_group_size, compression=compression,
                        keyset_columns=keyset_columns)
    try:
        for batch in iter_file_batches(src, chunk_size=chunk_size, columns=schema.names):
            table = categorify.transform(batch) if categorify is not None else to_table(batch)
            writer.write(as_table(table, schema))
        return writer.close(), writer.observed
    except BaseException:
        writer.abort()
        raise


def convert_files(files: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
                  cat_names: Sequence[str] = (), cont_names: Sequence[str] = (),
                  label_names: Sequence[str] = (), list_names: Sequence[str] = (),
                  categorify: Categorify | None = None, scheduler: Any = "local",
                  n_workers: int | None = None, chunk_size: int = 1_000_000,
                  row_group_size: int = DEFAULT_ROW_GROUP_SIZE, keyset_columns: Sequence[str] = (),
                  cardinalities: Mapping[str, int] | None = None, metadata: dict[str, Any] | None = None,
                  compression: str = "snappy", overwrite: bool = False, progress: bool = True) -> Schema:
    """Convert many parquet/CSV files in parallel, one output part per input file.

    Fitting ``categorify`` (if needed) and converting each run as one task per file on
    ``scheduler``: ``"local"`` (a Dask cluster on this machine, the default), the address of
    an existing Dask scheduler, a `distributed.Client`, or ``"synchronous"``. Every worker must
    see ``files`` and ``out_dir``'s parent at the same paths (a shared filesystem).

    Other arguments are those of `to_parquet_dataset`. Returns the written `Schema`.
    """
    files = [Path(f) for f in files]
    if not files:
        raise ValueError("files=[]: expected at least one input file")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"files: input file(s) not found: {missing}")
    cat_names, cont_names, label_names, list_names = _column_kinds(
        cat_names=cat_names, cont_names=cont_names, label_names=label_names, list_names=list_names)
    columns = [*cat_names, *cont_names, *label_names, *list_names]
    checks.positive_int("chunk_size", chunk_size)
    check_destination(out_dir, overwrite=overwrite, arg="out_dir", inputs=files)  # before the fit pass
    if categorify is not None and not categorify.fitted:
        partials = parallel_map(_count_file, [(f, categorify, chunk_size) for f in files], scheduler=scheduler,
                                n_workers=n_workers, progress=progress, desc="categorify fit")
        for part in partials:
            categorify.merge(part)
        categorify.finish_fit()
    cards = dict(cardinalities or {})
    if categorify is not None:
        cards.update(categorify.cardinalities)
    first = next(iter_file_batches(files[0], chunk_size=1024, columns=columns))
    first = categorify.transform(first) if categorify is not None else to_table(first)
    schema = Schema.infer(first.schema, cat_names=cat_names, cont_names=cont_names, label_names=label_names,
                          list_names=list_names, cardinalities=cards)
    schema.metadata.update(metadata or {})
    tmp = begin_directory(out_dir, overwrite=overwrite, arg="out_dir", inputs=files)
    try:
        tasks = [(src, tmp / f"part-{i:05d}.parquet", schema, categorify, chunk_size, row_group_size,
                  list(keyset_columns), compression) for i, src in enumerate(files)]
        results = parallel_map(_convert_file, tasks, scheduler=scheduler, n_workers=n_workers,
                               progress=progress, desc="convert")
        final = finalize_schema(schema, [r[0] for r in results], [r[1] for r in results])
        final.save(tmp)
        write_file_list(tmp, [r[0]["file"] for r in results])
    except BaseException:
        abort_directory(tmp)
        raise
    commit_directory(tmp, out_dir)
    return final
