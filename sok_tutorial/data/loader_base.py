"""The loader's engine, framework-free: which rows each rank reads each epoch, reading them in
chunks, transforming, shuffling and cutting batches. `sok_tutorial.data.loader` adapts it to
TensorFlow; the engine yields dicts of NumPy (or CuPy) arrays and `Ragged` columns.

Per epoch:

1. all row groups of all files, in file order, are permuted with ``rng(seed, epoch)`` when
   shuffling; every rank computes the same order;
2. the concatenated rows of that order are cut into ``global_size`` contiguous ranges; rank
   ``r`` reads range ``r`` only, so ranks see disjoint rows whose union is the dataset;
3. the rank's row groups are read ``parts_per_chunk`` at a time (at most ``buffer_size`` rows),
   transformed, and each such chunk's row order permuted (an index, seeded);
4. batches are cut from consecutive chunks, each gathering its rows once into its own buffers;
   only the epoch's last batch can be partial.

Reading (decode, checks, transforms) runs in one thread and shuffling/batching in another, so
on two cores the two halves overlap, and both overlap the training step.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kernels import backend, checks, ragged
from sok_tutorial.data import columns as cols
from sok_tutorial.data.background import background
from sok_tutorial.data.decode import LoaderError, Segment, SegmentDecoder
from sok_tutorial.data.schema import SCHEMA_FILE, Schema, resolve_files
from sok_tutorial.data.transforms import Transform, as_transforms

# Row groups are decoded concurrently, each by one thread (independent row groups parallelise
# better than pyarrow's per-column threads; measured with benchmarks/loader.py).
_DECODE_WORKERS = max(1, min(4, os.cpu_count() or 1))


def _kind_of(atype: pa.DataType) -> str:
    if pa.types.is_list(atype) or pa.types.is_large_list(atype):
        inner = atype.value_type
        return "list2" if (pa.types.is_list(inner) or pa.types.is_large_list(inner)) else "list"
    if pa.types.is_integer(atype) or pa.types.is_boolean(atype):
        return "int"
    if pa.types.is_floating(atype):
        return "float"
    return str(atype)


class LoaderCore(SegmentDecoder):
    """Plans, reads and batches; see the module docstring. Arguments as `ParquetLoader`."""

    def __init__(self, paths_or_dataset: Any, batch_size: int, label_names: Sequence[str], *,
                 cat_names: Sequence[str] = (), cont_names: Sequence[str] = (), list_names: Sequence[str] = (),
                 shuffle: bool = True, seed: int = 0, parts_per_chunk: int = 1, buffer_size: int | float = 0.05,
                 global_size: int = 1, global_rank: int = 0, drop_last: bool = False, sparse_as_dense: bool = False,
                 transforms: Sequence[Any] = (), device: str = "auto", fill_nan: float | None = None,
                 max_nnz: Mapping[str, int] | None = None, truncate_lists: bool = False,
                 label_range: tuple[float, float] | None = (0.0, 1.0)):
        self.batch_size = checks.positive_int("batch_size", batch_size)
        self.global_size = checks.positive_int("global_size", global_size)
        self.global_rank = checks.positive_int("global_rank", global_rank, allow_zero=True)
        if self.global_rank >= self.global_size:
            raise ValueError(f"global_rank={global_rank} is invalid: expected 0 <= global_rank < "
                             f"global_size={global_size}")
        self.parts_per_chunk = checks.positive_int("parts_per_chunk", parts_per_chunk)
        self.seed = checks.positive_int("seed", seed, allow_zero=True)
        self.shuffle, self.drop_last, self.sparse_as_dense = bool(shuffle), bool(drop_last), bool(sparse_as_dense)
        self.truncate_lists = bool(truncate_lists)
        self.fill_nan = None if fill_nan is None else float(fill_nan)
        self.device = backend.resolve_device(device)
        self.xp = backend.array_module(self.device)
        self.label_names = checks.names("label_names", label_names)
        self.cat_names = checks.names("cat_names", cat_names)
        self.cont_names = checks.names("cont_names", cont_names)
        self.list_names = checks.names("list_names", list_names)
        self.label_range = self._label_range(label_range)
        if not self.label_names:
            raise ValueError("label_names is empty: name at least one label column")
        self.names = self.label_names + self.cat_names + self.cont_names + self.list_names
        dupes = sorted({n for n in self.names if self.names.count(n) > 1})
        if dupes:
            raise ValueError(f"column(s) {dupes} are named more than once across label/cat/cont/list names")
        self.transforms: list[Transform] = as_transforms(transforms)
        for t in self.transforms:
            for c in t.columns or ():
                if c not in self.cat_names + self.list_names:
                    raise ValueError(f"{t!r} names column {c!r}, which is not among cat_names or list_names")

        self.files = resolve_files(paths_or_dataset)
        self._open_files()
        self.schema = self._dataset_schema()
        self.nnz = {n: (self.schema[n].nnz if self.schema and n in self.schema else None) for n in self.list_names}
        self.slots = {n: self._slots(n) for n in self.list_names}
        self.max_nnz = self._max_nnz(max_nnz or {})
        self.buffer_rows = self._buffer_rows(buffer_size)
        self.epoch = 0
        # host buffers reused across epochs (decoded columns; batches): no page faults
        self._read_pool = cols.BufferPool() if self.xp is np else None
        self._batch_pool = cols.BufferPool() if self.xp is np else None

    @staticmethod
    def _label_range(label_range: Any) -> tuple[float, float] | None:
        if label_range is None:
            return None
        try:
            low, high = (float(x) for x in label_range)
        except (TypeError, ValueError):
            raise ValueError(f"label_range={label_range!r} is invalid: expected (low, high) or None") from None
        if not low <= high:
            raise ValueError(f"label_range={label_range!r} is invalid: expected low <= high")
        return low, high

    # ---------------------------------------------------------------------------- setup
    def _open_files(self) -> None:
        self._pf: list[pq.ParquetFile] = []
        groups = []
        for i, path in enumerate(self.files):
            try:
                pf = pq.ParquetFile(path)
            except (pa.ArrowException, OSError) as exc:
                raise LoaderError(f"cannot open {str(path)!r} as parquet (corrupt or truncated?): {exc}") from exc
            self._check_columns(path, pf.schema_arrow)
            self._pf.append(pf)
            groups += [(i, g, pf.metadata.row_group(g).num_rows) for g in range(pf.num_row_groups)]
        self._local = threading.local()  # a ParquetFile must not be read by two threads at once
        self.row_groups = np.array(groups, dtype=np.int64).reshape(-1, 3)
        self.num_rows = int(self.row_groups[:, 2].sum())
        if self.num_rows == 0:
            raise LoaderError(f"the files of {self.files[0].parent} hold no rows")

    def _check_columns(self, path: Path, schema: pa.Schema) -> None:
        missing = [n for n in self.names if n not in schema.names]
        if missing:
            raise LoaderError(f"{str(path)!r} has no column(s) {missing}; it has {schema.names}")
        expected = {**{n: ("int", "float") for n in self.label_names}, **{n: ("int",) for n in self.cat_names},
                    **{n: ("int", "float") for n in self.cont_names}, **{n: ("list", "list2") for n in self.list_names}}
        for name, kinds in expected.items():
            kind = _kind_of(schema.field(name).type)
            ok = kind in kinds and (name not in self.list_names or pa.types.is_integer(
                _leaf_type(schema.field(name).type)))
            if not ok:
                role = ("label" if name in self.label_names else "categorical" if name in self.cat_names
                        else "continuous" if name in self.cont_names else "list")
                want = {"label": "a number", "categorical": "integer ids", "continuous": "a number",
                        "list": "a list of integer ids"}[role]
                raise LoaderError(f"column {name!r} of {str(path)!r} has type {schema.field(name).type}; "
                                  f"as a {role} column it must hold {want}")

    def _dataset_schema(self) -> Schema | None:
        parents = {f.parent for f in self.files}
        if len(parents) == 1 and (next(iter(parents)) / SCHEMA_FILE).is_file():
            return Schema.load(next(iter(parents)))
        return None

    def _slots(self, name: str) -> int | None:
        """Inner lists per row of a ``list<list<>>`` column (from schema.json, else the first row)."""
        if self.nnz[name]:
            return self.schema[name].slots
        if _kind_of(self._pf[0].schema_arrow.field(name).type) != "list2":
            return None
        if self.schema is not None and name in self.schema and self.schema[name].slots:
            return self.schema[name].slots
        first = self._pf[0].read_row_group(0, columns=[name]).column(0)
        return int(pc.list_value_length(first)[0].as_py() or 0) or None

    def _max_nnz(self, declared: Mapping[str, int]) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for name in self.list_names:
            limit = declared.get(name)
            if limit is None and self.schema is not None and name in self.schema:
                limit = self.schema[name].nnz or self.schema[name].max_nnz
            if limit is None:
                limit = self._measure_max_nnz(name)
            out[name] = checks.positive_int(f"max_nnz[{name!r}]", limit)
        unknown = [n for n in declared if n not in self.list_names]
        if unknown:
            raise ValueError(f"max_nnz names {unknown}, which are not list_names {self.list_names}")
        return out

    def _measure_max_nnz(self, name: str) -> int:
        longest = 1
        for pf in self._pf:
            column = pf.read(columns=[name]).column(0)
            if self.slots.get(name):
                column = pc.list_flatten(column)
            if len(column):
                longest = max(longest, pc.max(pc.list_value_length(column)).as_py() or 0)
        return longest

    def _buffer_rows(self, buffer_size: int | float) -> int:
        largest = int(self.row_groups[:, 2].max())
        if isinstance(buffer_size, float):
            if not 0 < buffer_size <= 1:
                raise ValueError(f"buffer_size={buffer_size} is invalid: a float is a fraction of memory in (0, 1]")
            rows = int(buffer_size * self._memory_bytes() / max(self._bytes_per_row(), 1))
            rows = max(rows, largest)  # a row group is the unit of reading
        else:
            rows = checks.positive_int("buffer_size", buffer_size)
            if rows < largest:
                raise ValueError(f"buffer_size={buffer_size} rows is smaller than the largest row group ({largest} "
                                 "rows), the unit the loader reads: raise it or write smaller row groups")
        return rows

    def _bytes_per_row(self) -> float:
        meta = self._pf[0].metadata
        size = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
        return size / max(meta.num_rows, 1) * len(self.names) / max(meta.num_columns, 1)

    def _memory_bytes(self) -> int:
        if self.device == "gpu":
            free, _ = backend.cupy.cuda.runtime.memGetInfo()
            return int(free)
        import psutil
        return int(psutil.virtual_memory().available)

    # ----------------------------------------------------------------------------- plan
    @property
    def rank_rows(self) -> tuple[int, int]:
        """This rank's [start, stop) in the epoch's concatenated row order."""
        n, g, r = self.num_rows, self.global_size, self.global_rank
        return n * r // g, n * (r + 1) // g

    def __len__(self) -> int:
        start, stop = self.rank_rows
        full, rest = divmod(stop - start, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self, epoch: int) -> np.ndarray:
        """Row-group indices in this epoch's reading order (identical on every rank)."""
        n = len(self.row_groups)
        return np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)

    def segments(self, epoch: int) -> list[Segment]:
        lo, hi = self.rank_rows
        out, position = [], 0
        for index in self.order(epoch):
            file, group, rows = (int(v) for v in self.row_groups[index])
            start, stop = max(lo - position, 0), min(hi - position, rows)
            if start < stop:
                out.append(Segment(file, group, start, stop))
            position += rows
            if position >= hi:
                break
        return out

    def chunks(self, epoch: int) -> list[list[Segment]]:
        """Segments grouped into chunks of <= parts_per_chunk row groups and <= buffer_rows rows."""
        plan: list[list[Segment]] = [[]]
        rows = 0
        for seg in self.segments(epoch):
            size = seg.stop - seg.start
            if plan[-1] and (len(plan[-1]) == self.parts_per_chunk or rows + size > self.buffer_rows):
                plan.append([])
                rows = 0
            plan[-1].append(seg)
            rows += size
        return [c for c in plan if c]

    # ----------------------------------------------------------------------------- read
    def read_chunks(self, epoch: int, stop: threading.Event | None = None) -> Iterator[cols.Columns]:
        """Chunks in order; their row groups are decoded by a few threads, a bounded distance ahead."""
        pool = self._read_pool
        work = [(index, seg) for index, plan in enumerate(self.chunks(epoch)) for seg in plan]
        ahead: deque[tuple[int, Future]] = deque()
        with ThreadPoolExecutor(_DECODE_WORKERS, thread_name_prefix="loader-decode") as executor:
            try:
                queue_ = iter(work)
                parts: list[cols.Columns] = []
                current = 0
                while True:
                    while len(ahead) < 2 * _DECODE_WORKERS and (item := next(queue_, None)) is not None:
                        ahead.append((item[0], executor.submit(self.read_segment, item[1], pool)))
                    if not ahead or (stop is not None and stop.is_set()):
                        break
                    index, future = ahead.popleft()
                    if index != current and parts:
                        yield cols.concat(parts, pool)
                        parts = []
                    current = index
                    parts.append(future.result())
                if parts and not (stop is not None and stop.is_set()):
                    yield cols.concat(parts, pool)
            finally:
                for _, future in ahead:
                    future.cancel()

    # ---------------------------------------------------------------------------- batch
    def batches(self, chunks: Iterator[cols.Columns], epoch: int) -> Iterator[cols.Columns]:
        """Cut batches across chunk boundaries, each chunk's rows in a seeded permuted order.

        Only an index is permuted; every batch gathers its rows from the chunks it spans straight
        into its own (pooled) buffers, so each value is copied once between decode and batch."""
        pool, xp, size = self._batch_pool, self.xp, self.batch_size
        pieces: list[tuple[cols.Columns, Any]] = []
        filled = 0
        for index, chunk in enumerate(chunks):
            n = cols.num_rows(chunk)
            perm = (xp.asarray(np.random.default_rng([self.seed, epoch, self.global_rank, index]).permutation(n))
                    if self.shuffle else None)
            start = 0
            while start < n:
                stop = min(start + size - filled, n)
                pieces.append((chunk, perm[start:stop] if perm is not None else slice(start, stop)))
                filled += stop - start
                start = stop
                if filled == size:
                    yield cols.gather(pieces, pool)
                    pieces, filled = [], 0
        if pieces and not self.drop_last:
            yield cols.gather(pieces, pool)

    def finish(self, batch: cols.Columns) -> cols.Columns:
        """Lists to dense ``[B, (slots,) max_nnz]`` arrays when ``sparse_as_dense``."""
        if not self.sparse_as_dense:
            return batch
        out = dict(batch)
        for name in self.list_names:
            col = batch[name]
            width = self.max_nnz[name]
            lengths = col.lengths()
            if len(lengths) and bool((lengths == width).all()):
                dense = col.values.reshape(-1, width)  # fixed nnz: no padding needed
            else:
                dense = ragged.to_dense(col.values, col.offsets, width)
            out[name] = dense.reshape(col.rows, col.slots, width) if col.slots else dense
        return out

    def iterate(self, convert: Callable[[cols.Columns], Any], *, prefetch: int,
                epoch: int | None = None) -> Iterator[Any]:
        """One epoch: read in one thread, shuffle/batch/convert in another, yield converted batches."""
        if epoch is None:
            epoch, self.epoch = self.epoch, self.epoch + 1

        def reader(stop: threading.Event) -> Iterator[cols.Columns]:
            return self.read_chunks(epoch, stop)

        def assembler(stop: threading.Event) -> Iterator[Any]:
            chunks = background(reader, maxsize=1, name=f"loader-read-{os.getpid()}")
            try:
                for batch in self.batches(chunks, epoch):
                    if stop.is_set():
                        return
                    yield convert(self.finish(batch))
            finally:
                chunks.close()

        yield from background(assembler, maxsize=prefetch, name=f"loader-batch-{os.getpid()}")


def _leaf_type(atype: pa.DataType) -> pa.DataType:
    while pa.types.is_list(atype) or pa.types.is_large_list(atype):
        atype = atype.value_type
    return atype
