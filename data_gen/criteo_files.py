"""Real Criteo downloads: find the day files of a directory, open them (gzipped or not), and copy
a sample of their rows into day files that `preprocess_criteo` reads.

Two layouts are published, and both are recognised:

* the Criteo 1TB Click Logs: ``day_0``, ``day_1``, ... ``day_23`` (~195M rows each, usually
  gzipped: ``day_0.gz``);
* the Kaggle Display Advertising Challenge: one ``train.txt`` (~45M rows, 7 days in time order).

Nothing here downloads anything, and nothing parses a row: lines are copied as bytes, so a
malformed line is copied as is and reported later, with its file and line, by preprocessing.
"""
from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from kernels import checks
from sok_tutorial.atomic import atomic_directory, check_destination
from sok_tutorial.progress import progress_bar

EXPECTED = ("Criteo 1TB day files day_0, day_1, ... (each optionally gzipped: day_0.gz) "
            "or Kaggle's train.txt (or train.txt.gz)")
STAMP = "take_criteo_rows.json"  # what `take_criteo_rows` wrote, to reuse it
_DAY = re.compile(r"^day_(\d+)(\.gz)?$")
_KAGGLE = re.compile(r"^train\.txt(\.gz)?$")
_BLOCK_BYTES = 8 << 20


def open_criteo(path: str | Path) -> IO[bytes]:
    """Open a Criteo file for reading bytes, through `gzip` when its name ends in ``.gz``."""
    path = Path(path)
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def _ordered(files: list[Path], path: Path) -> list[Path]:
    """Sort day files by number; a file present both plain and gzipped is ambiguous."""
    by_name: dict[str, list[str]] = {}
    for f in files:
        by_name.setdefault(f.name.removesuffix(".gz"), []).append(f.name)
    twice = [sorted(names) for names in by_name.values() if len(names) > 1]
    if twice:
        raise ValueError(f"path={str(path)!r} holds the same file plain and gzipped: {twice[:3]}; "
                         "keep one of each (a plain file may be a partly decompressed copy)")
    return sorted(files, key=lambda f: int(m[1]) if (m := _DAY.match(f.name)) else 0)


def find_criteo_files(path: str | Path) -> list[Path]:
    """The Criteo files of a download directory: its day files in day order, or Kaggle's train.txt.

    Day files ``day_<n>`` (or ``day_<n>.gz``) come back sorted by ``n`` (``day_10`` after
    ``day_9``); a directory holding no day file but ``train.txt`` (or ``train.txt.gz``) gives
    that one file. Other files beside them (a readme, checksums, Kaggle's ``test.txt``) are
    ignored.

    Args:
        path: a directory holding a Criteo download.

    Returns:
        The files, as paths inside `path`.

    Raises:
        FileNotFoundError: `path` does not exist, or holds no Criteo file (the message lists
            what it holds and which names are expected).
        NotADirectoryError: `path` is not a directory.
        ValueError: `path` holds both layouts, or a file both plain and gzipped.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> for name in ("day_10", "day_2.gz", "day_0", "README"):
        ...     _ = (root / name).write_bytes(b"")
        >>> [p.name for p in find_criteo_files(root)]
        ['day_0', 'day_2.gz', 'day_10']
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"path={str(path)!r} does not exist: expected a directory holding {EXPECTED}")
    if not path.is_dir():
        raise NotADirectoryError(f"path={str(path)!r} is not a directory: expected a directory holding {EXPECTED}")
    files = [p for p in path.iterdir() if p.is_file()]
    days = [p for p in files if _DAY.match(p.name)]
    kaggle = [p for p in files if _KAGGLE.match(p.name)]
    if days and kaggle:
        raise ValueError(f"path={str(path)!r} holds both day files ({days[0].name}, ...) and {kaggle[0].name}: "
                         "point it at a directory holding one layout")
    if days or kaggle:
        return _ordered(days or kaggle, path)
    names = sorted(p.name for p in path.iterdir())
    held = f"holds {names[:5] + ['...'] if len(names) > 5 else names}" if names else "is empty"
    archives = [n for n in names if n.endswith((".tar.gz", ".tgz", ".tar", ".zip"))]
    hint = f"; extract {archives[0]} first" if archives else ""
    raise FileNotFoundError(f"path={str(path)!r} {held}: expected {EXPECTED}{hint}")


class _Lines:
    """The lines of one or more files in turn, copied as bytes block by block, never parsed.

    A file's last line without a newline is a line: it gets one, so files join cleanly.
    """

    def __init__(self, files: Sequence[Path]):
        self.files, self.fh, self.buf, self.open_line = list(files), None, b"", False

    def _refill(self) -> bool:
        while True:
            if self.fh is None:
                if not self.files:
                    return False
                self.fh = open_criteo(self.files.pop(0))
            self.buf = self.fh.read(_BLOCK_BYTES)
            if self.buf:
                return True
            self.fh.close()
            self.fh = None
            if self.open_line:  # the file ended inside a line: close it
                self.buf = b"\n"
                return True

    def copy(self, n: int, out: IO[bytes], bar: Any) -> int:
        """Write the next `n` lines to `out`; returns how many there were (fewer at the end)."""
        copied = 0
        while copied < n:
            if not self.buf and not self._refill():
                break
            k = self.buf.count(b"\n")
            if copied + k < n:  # the whole block, its unfinished last line too
                out.write(self.buf)
                self.open_line = not self.buf.endswith(b"\n")
                self.buf = b""
            else:  # up to and including the newline ending line n
                k = n - copied
                cut = int(np.flatnonzero(np.frombuffer(self.buf, np.uint8) == 10)[k - 1]) + 1
                out.write(self.buf[:cut])
                self.buf, self.open_line = self.buf[cut:], False
            copied += k
            bar.update(k)
        return copied

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def _stamp(source: Path, files: list[Path], rows: list[int], per_day: bool) -> dict[str, Any]:
    stats = [(f.name, f.stat()) for f in files]
    return {"source": str(source.resolve()), "rows": rows, "mode": "per_day" if per_day else "slices",
            "files": [{"name": name, "size": s.st_size, "mtime_ns": s.st_mtime_ns} for name, s in stats]}


def _reusable(out_dir: Path, stamp: dict[str, Any], outputs: list[Path]) -> bool:
    try:
        written = json.loads((out_dir / STAMP).read_text())
    except (OSError, ValueError):
        return False
    sizes = written.pop("output_sizes", None)
    return (written == stamp and all(p.is_file() for p in outputs)
            and sizes == [p.stat().st_size for p in outputs])


def take_criteo_rows(path: str | Path, out_dir: str | Path, rows: Sequence[int], *, overwrite: bool = False,
                     reuse: bool = True, progress: bool = True) -> list[Path]:
    """Copy a sample of a Criteo download into plain day files ``day_0 .. day_{len(rows)-1}``.

    Output ``i`` holds ``rows[i]`` lines. When `path` has at least ``len(rows)`` day files,
    output ``i`` is the first ``rows[i]`` lines of day ``i`` (every day contributes, in time
    order); otherwise (Kaggle's one ``train.txt``, or too few days) the outputs are consecutive
    slices of all the source's lines in file order::

        day files:  day_0 [aaaa...]   day_1 [bbbb...]   day_2 [cccc...]
        rows=[2, 3] -> day_0 = aa, day_1 = bbb                          (per day)
        train.txt:  [aabbbcc...]
        rows=[2, 3] -> day_0 = aa, day_1 = bbb                          (slices)

    Lines are copied as bytes, streamed block by block (day files of the 1TB set are 10+ GB
    gzipped), and gzipped sources are decompressed on the fly. A line is a row here, whatever it
    holds: `preprocess_criteo` later names the file and line of a malformed one.

    Args:
        path: a Criteo download directory (see `find_criteo_files`).
        out_dir: the directory to write; it also gets ``take_criteo_rows.json`` describing the
            call, so that an identical call can reuse the files.
        rows: lines per output file, each a positive integer.
        overwrite: replace an existing `out_dir` written by this library (or an empty one).
        reuse: return the files of an identical earlier call (same source files with the same
            sizes and modification times, same `rows`) without reading the source again.
        progress: show a progress bar (rows copied).

    Returns:
        The output files, in order.

    Raises:
        ValueError: `rows` is not a non-empty list of positive integers, or the source holds
            fewer lines than asked (the message says how many it has). The files are written
            into a temporary directory that becomes `out_dir` only when complete, so a failure
            leaves nothing behind.
        FileExistsError: `out_dir` exists and cannot be replaced (see `begin_directory`).

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (root / "train.txt").write_bytes(b"".join(b"%d\\tline\\n" % i for i in range(10)))
        >>> files = take_criteo_rows(root, root / "sample", [2, 3], progress=False)
        >>> [f.name for f in files], files[1].read_bytes()
        (['day_0', 'day_1'], b'2\\tline\\n3\\tline\\n4\\tline\\n')
    """
    path, out_dir = Path(path), Path(out_dir)
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError(f"rows={rows!r} is invalid: expected a non-empty list of positive row counts, one per file")
    rows = [checks.positive_int(f"rows[{i}]", r) for i, r in enumerate(rows)]
    sources = find_criteo_files(path)
    per_day = len(sources) >= len(rows)
    used = sources[:len(rows)] if per_day else sources
    stamp = _stamp(path, used, rows, per_day)
    outputs = [out_dir / f"day_{i}" for i in range(len(rows))]
    if reuse and _reusable(out_dir, stamp, outputs):
        return outputs
    check_destination(out_dir, overwrite=overwrite, inputs=used)
    shared = None if per_day else _Lines(used)
    try:
        with progress_bar(progress, total=sum(rows), desc=f"criteo rows -> {out_dir.name}", unit="rows") as bar, \
                atomic_directory(out_dir, overwrite=overwrite, inputs=used) as tmp:
            for i, n in enumerate(rows):
                lines = _Lines([used[i]]) if per_day else shared
                try:
                    with open(tmp / outputs[i].name, "wb") as out:
                        got = lines.copy(n, out, bar)
                finally:
                    if per_day:
                        lines.close()
                if got < n and per_day:
                    raise ValueError(f"path={str(path)!r}: {used[i].name} holds {got:,} rows, fewer than "
                                     f"rows[{i}]={n:,}")
                if got < n:
                    held = sum(rows[:i]) + got
                    raise ValueError(f"path={str(path)!r} holds {held:,} rows in {[f.name for f in used]}, "
                                     f"fewer than the {sum(rows):,} asked (rows={rows})")
            written = {**stamp, "output_sizes": [(tmp / p.name).stat().st_size for p in outputs]}
            (tmp / STAMP).write_text(json.dumps(written, indent=2) + "\n")
    finally:
        if shared is not None:
            shared.close()
    return outputs
