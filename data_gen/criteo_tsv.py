"""Criteo TSV day files: a block reader that names the file and line of every malformed row,
and the preprocessing that turns day files into a parquet dataset with one keyset per file.

Preprocessing (two passes over the inputs, one task per file, optionally on Dask):

1. statistics: value counts of every categorical (and crossed) feature, moments of the
   log-transformed continuous features;
2. transform: missing continuous values -> 0, ``log(1 + max(x, 0))``, standardised with the
   pass-1 moments; categorical tokens -> contiguous ids with tokens seen fewer than
   ``min_count`` times (and missing ones) in bucket 0; optional crosses of two categorical
   features as extra categorical columns. Each input file becomes one output part with its
   keyset (ids offset per column into one global key space).

Gzipped day files (``day_0.gz``, as the 1TB set is published) are read as they are. Finding the
files of a real download and sampling rows from it: `find_criteo_files` and `take_criteo_rows`
(in `data_gen.criteo_files`, importable from here too).
"""
from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from data_gen._common import is_utf8, line_blocks
from data_gen.criteo import CAT_NAMES, CONT_NAMES, LABEL_NAME
from data_gen.criteo_files import find_criteo_files, open_criteo, take_criteo_rows
from kernels import checks
from sok_tutorial.atomic import abort_directory, begin_directory, check_destination, commit_directory
from sok_tutorial.data.categorify import Categorify
from sok_tutorial.data.parallel import parallel_map
from sok_tutorial.data.schema import ColumnSchema, Schema, write_file_list
from sok_tutorial.data.writer import DEFAULT_ROW_GROUP_SIZE, PartWriter, as_table, finalize_schema

__all__ = ["MalformedLineError", "find_criteo_files", "iter_criteo_tsv", "preprocess_criteo", "take_criteo_rows"]
NAMES = [LABEL_NAME, *CONT_NAMES, *CAT_NAMES]
_FIELDS = len(NAMES)
_TYPES = {LABEL_NAME: pa.int8(), **{n: pa.float32() for n in CONT_NAMES}, **{n: pa.string() for n in CAT_NAMES}}
_PATTERNS = {LABEL_NAME: r"^[01]$", **{n: r"^(-?[0-9]+)?$" for n in CONT_NAMES}}


class MalformedLineError(ValueError):
    """A line of a TSV file is not a valid Criteo row; the message names file and line."""


def iter_criteo_tsv(path: str | Path, *, on_bad_lines: str = "error", block_bytes: int = 32 << 20,
                    counter: dict[str, int] | None = None) -> Iterator[pa.Table]:
    """Read a Criteo day file in blocks: ``label`` int8, ``I1..I13`` float32 (null if empty),
    ``C1..C26`` strings (null if empty). A path ending in ``.gz`` is decompressed as it is read.

    Args:
        on_bad_lines: ``"error"`` raises `MalformedLineError` naming file and line number;
            ``"skip"`` drops the line and counts it in ``counter["bad_lines"]``.
        counter: optional dict that receives ``rows`` and ``bad_lines`` totals.
    """
    checks.one_of("on_bad_lines", on_bad_lines, ("error", "skip"))
    checks.positive_int("block_bytes", block_bytes)
    path = Path(path)
    counter = counter if counter is not None else {}
    counter.setdefault("rows", 0)
    counter.setdefault("bad_lines", 0)
    lines_before = 0
    with open_criteo(path) as fh:
        for block in line_blocks(fh, block_bytes):
            table, n_lines = _parse_block(block, path, lines_before, on_bad_lines, counter)
            lines_before += n_lines
            if table is not None and table.num_rows:
                counter["rows"] += table.num_rows
                yield table


def _parse_block(block: bytes, path: Path, lines_before: int, on_bad_lines: str,
                 counter: dict[str, int]) -> tuple[pa.Table | None, int]:
    raw = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(raw == 10)
    if not len(ends) or ends[-1] != len(raw) - 1:
        ends = np.append(ends, len(raw))
    starts = np.concatenate([[0], ends[:-1] + 1])
    tabs = np.flatnonzero(raw == 9)
    fields = np.searchsorted(tabs, ends) - np.searchsorted(tabs, starts) + 1
    blank = ends == starts
    bad = ~blank & (fields != _FIELDS)
    line_no = lines_before + 1 + np.arange(len(ends))
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        if on_bad_lines == "error":
            raise MalformedLineError(f"{path}:{line_no[first]}: expected {_FIELDS} tab-separated fields, "
                                     f"found {fields[first]} (pass on_bad_lines='skip' to drop such lines)")
        counter["bad_lines"] += int(bad.sum())
    keep = ~(bad | blank)
    if not keep.any():
        return None, len(ends)
    longest = int((ends - starts).max()) + 1
    if not keep.all():
        block = _lines(raw, starts, ends, keep)
    return _convert(block, path, line_no[keep], on_bad_lines, counter, longest), len(ends)


def _lines(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray, keep: np.ndarray) -> bytes:
    """The lines of `raw` (from `starts` to `ends`, newline included) where `keep` is True."""
    lengths = np.minimum(ends + 1, len(raw)) - starts
    block = raw[np.repeat(keep, lengths)].tobytes()
    return block if block.endswith(b"\n") else block + b"\n"


def _read(block: bytes, types: dict[str, pa.DataType], longest: int) -> pa.Table:
    # pyarrow's block must hold the longest line whole
    return pcsv.read_csv(
        io.BytesIO(block),
        read_options=pcsv.ReadOptions(column_names=NAMES, block_size=max(1 << 20, len(block) // 4, longest + 1)),
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True))


def _not_utf8(block: bytes) -> np.ndarray:
    """Per line of `block`, whether it is not valid UTF-8 (pyarrow refuses such a block whole)."""
    lines = block[:-1] if block.endswith(b"\n") else block  # (the last block may end without one)
    return np.array([not is_utf8(line) for line in lines.split(b"\n")], bool)


def _convert(block: bytes, path: Path, line_no: np.ndarray, on_bad_lines: str, counter: dict[str, int],
             longest: int) -> pa.Table:
    try:
        table = _read(block, _TYPES, longest)
        labels = pc.min_max(table[LABEL_NAME])
        if table[LABEL_NAME].null_count == 0 and labels["min"].as_py() >= 0 and labels["max"].as_py() <= 1:
            return table
    except pa.ArrowInvalid:
        pass  # a field does not parse as a number, or a token is not UTF-8
    # slow path, only for blocks with bad values: find exactly which lines
    not_utf8 = _not_utf8(block)
    if not_utf8.any():
        if on_bad_lines == "error":
            raise MalformedLineError(f"{path}:{line_no[np.flatnonzero(not_utf8)[0]]}: not valid UTF-8 text (pass "
                                     "on_bad_lines='skip' to drop such lines)")
        counter["bad_lines"] += int(not_utf8.sum())
        if not_utf8.all():
            return pa.schema([(n, _TYPES[n]) for n in NAMES]).empty_table()
        raw = np.frombuffer(block, np.uint8)
        ends = np.flatnonzero(raw == 10)
        block, line_no = _lines(raw, np.concatenate([[0], ends[:-1] + 1]), ends, ~not_utf8), line_no[~not_utf8]
    table = _read(block, {n: pa.string() for n in NAMES}, longest)
    ok = np.ones(table.num_rows, bool)
    for name, pattern in _PATTERNS.items():
        valid = pc.fill_null(pc.match_substring_regex(table[name], pattern), name != LABEL_NAME)
        ok &= valid.to_numpy(zero_copy_only=False)
    bad_rows = np.flatnonzero(~ok)
    if on_bad_lines == "error":
        row = int(bad_rows[0])
        fields = {n: table[n][row].as_py() for n in _PATTERNS}
        empty = {n: "" if n != LABEL_NAME else "?" for n in fields}  # an empty label is invalid
        wrong = {n: v for n, v in fields.items() if not re.fullmatch(_PATTERNS[n], v or empty[n])}
        raise MalformedLineError(f"{path}:{line_no[row]}: invalid value(s) {wrong} (the label must be 0 or 1, "
                                 "I1..I13 integers or empty; pass on_bad_lines='skip' to drop such lines)")
    counter["bad_lines"] += len(bad_rows)
    return table.filter(pa.array(ok)).cast(pa.schema([(n, _TYPES[n]) for n in NAMES]))


# ------------------------------------------------------------------------------ preprocessing
def _cross(table: pa.Table, a: str, b: str) -> pa.Array:
    return pc.binary_join_element_wise(table[a], table[b], "\x1f")  # null if either is missing


def _with_crosses(table: pa.Table, crosses: Sequence[tuple[str, str]]) -> pa.Table:
    for a, b in crosses:
        table = table.append_column(f"{a}_{b}", _cross(table, a, b))
    return table


def _log_dense(table: pa.Table) -> np.ndarray:
    """[13, rows]: log(1 + max(x, 0)) with missing values as 0."""
    x = np.stack([table[n].to_numpy(zero_copy_only=False) for n in CONT_NAMES]).astype(np.float32)
    np.nan_to_num(x, copy=False, nan=0.0)
    np.maximum(x, 0, out=x)
    return np.log1p(x)


def _stats_task(task: tuple[Path, list[str], list[tuple[str, str]], int, str]) -> dict[str, Any]:
    path, cat_columns, crosses, min_count, on_bad_lines = task
    cat = Categorify(cat_columns, freq_threshold=min_count)
    moments = np.zeros((3, len(CONT_NAMES)))
    counter: dict[str, int] = {}
    for table in iter_criteo_tsv(path, on_bad_lines=on_bad_lines, counter=counter):
        cat.partial_fit(_with_crosses(table, crosses))
        x = _log_dense(table).astype(np.float64)
        moments += [np.full(len(CONT_NAMES), x.shape[1]), x.sum(axis=1), (x * x).sum(axis=1)]
    return {"categorify": cat, "moments": moments, **counter}


def _transform_task(task: tuple[Any, ...]) -> dict[str, Any]:
    src, dst, schema, cat, crosses, mean, std, on_bad_lines, row_group_size, keysets = task
    writer = PartWriter(dst, schema, row_group_size=row_group_size,
                        keyset_columns=[c.name for c in schema.columns if c.kind == "categorical"] if keysets else ())
    counter: dict[str, int] = {}
    try:
        for table in iter_criteo_tsv(src, on_bad_lines=on_bad_lines, counter=counter):
            dense = (_log_dense(table) - mean[:, None]) / std[:, None]
            ids = cat.transform(_with_crosses(table, crosses).select(cat.columns))
            columns = {LABEL_NAME: table[LABEL_NAME], **{n: dense[i] for i, n in enumerate(CONT_NAMES)},
                       **{n: ids[n] for n in cat.columns}}
            writer.write(as_table(columns, schema))
        entry = writer.close()
    except BaseException:
        writer.abort()
        raise
    return {"entry": entry, "observed": writer.observed, **counter}


def preprocess_criteo(inputs: Sequence[str | Path], out_dir: str | Path, *, min_count: int = 10,
                      normalize: bool = True, feature_crosses: Sequence[tuple[str, str]] = (),
                      categorify: Categorify | None = None, keysets: bool = True,
                      on_bad_lines: str = "error", scheduler: Any = "local", n_workers: int | None = None,
                      row_group_size: int = DEFAULT_ROW_GROUP_SIZE, overwrite: bool = False,
                      progress: bool = True) -> Schema:
    """Preprocess Criteo TSV day files (real or from `write_criteo_tsv`) into a parquet dataset.

    Args:
        inputs: day files; each becomes one output part (``part-00000.parquet`` ...).
        min_count: categorical tokens seen fewer times than this share bucket 0 with missing ones.
        normalize: standardise the log-transformed continuous features (else only log).
        feature_crosses: pairs like ``("C1", "C2")`` adding a categorical column ``C1_C2``.
        categorify: a fitted `Categorify` from an earlier run, to map new days with the same ids
            (its moments are not reused: pass ``normalize=False`` to skip standardising).
        keysets: write ``<part>.keyset`` (unique ids of all categorical columns, offset per column).
        on_bad_lines: ``"error"`` (default) or ``"skip"`` malformed lines; the count skipped is
            saved as ``metadata["preprocessing"]["bad_lines"]``.
        scheduler: ``"local"`` Dask cluster, a scheduler address, a Client, or ``"synchronous"``.

    The fitted `Categorify` is saved in ``out_dir/categorify``.
    """
    inputs = [Path(p) for p in inputs]
    if not inputs:
        raise ValueError("inputs=[]: expected at least one Criteo TSV file")
    missing = [str(p) for p in inputs if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"inputs: file(s) not found: {missing}")
    checks.positive_int("min_count", min_count)
    checks.one_of("on_bad_lines", on_bad_lines, ("error", "skip"))
    crosses = [tuple(pair) for pair in feature_crosses]
    for pair in crosses:
        if len(pair) != 2 or any(c not in CAT_NAMES for c in pair):
            raise ValueError(f"feature_crosses: {pair!r} is not a pair of categorical names from {CAT_NAMES[:3]}...")
    cat_columns = CAT_NAMES + [f"{a}_{b}" for a, b in crosses]
    if categorify is not None and categorify.columns != cat_columns:
        raise ValueError(f"categorify covers {categorify.columns}, expected {cat_columns}")
    check_destination(out_dir, overwrite=overwrite, inputs=inputs)  # before hours of reading

    stats = parallel_map(_stats_task, [(p, cat_columns, crosses, min_count, on_bad_lines) for p in inputs],
                         scheduler=scheduler, n_workers=n_workers, progress=progress, desc="criteo stats")
    if categorify is None:
        categorify = Categorify(cat_columns, freq_threshold=min_count)
        for s in stats:
            categorify.merge(s["categorify"])
        categorify.finish_fit()
    moments = sum(s["moments"] for s in stats)
    mean = moments[1] / max(moments[0][0], 1) if normalize else np.zeros(len(CONT_NAMES))
    var = moments[2] / max(moments[0][0], 1) - mean ** 2 if normalize else np.ones(len(CONT_NAMES))
    std = np.sqrt(np.maximum(var, 1e-12))

    cards = categorify.cardinalities
    offsets = np.concatenate([[0], np.cumsum([cards[c] for c in cat_columns])[:-1]])
    schema = Schema([ColumnSchema(LABEL_NAME, "label", "int8")]
                    + [ColumnSchema(n, "continuous", "float32") for n in CONT_NAMES]
                    + [ColumnSchema(n, "categorical", "int64", cardinality=cards[n], key_offset=int(o))
                       for n, o in zip(cat_columns, offsets)])
    tmp = begin_directory(out_dir, overwrite=overwrite, inputs=inputs)
    try:
        tasks = [(src, tmp / f"part-{i:05d}.parquet", schema, categorify, crosses, mean.astype(np.float32),
                  std.astype(np.float32), on_bad_lines, row_group_size, keysets) for i, src in enumerate(inputs)]
        results = parallel_map(_transform_task, tasks, scheduler=scheduler, n_workers=n_workers,
                               progress=progress, desc="criteo transform")
        final = finalize_schema(schema, [r["entry"] for r in results], [r["observed"] for r in results])
        final.metadata["preprocessing"] = {
            "inputs": [p.name for p in inputs], "min_count": min_count, "normalize": normalize,
            "feature_crosses": [list(c) for c in crosses], "log_mean": mean.tolist(), "log_std": std.tolist(),
            "bad_lines": int(sum(s["bad_lines"] for s in stats)), "rows_read": int(sum(s["rows"] for s in stats))}
        final.save(tmp)
        write_file_list(tmp, [r["entry"]["file"] for r in results])
        categorify.save(tmp / "categorify")
    except BaseException:
        abort_directory(tmp)
        raise
    commit_directory(tmp, out_dir)
    return final
