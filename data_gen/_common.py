"""Helpers shared by the generators: block-wise seeding, the oracle-AUC accumulator, reuse of a
dataset generated earlier with the same parameters, and writing in a background thread."""
from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sok_tutorial.data.schema import SCHEMA_FILE, Schema
from sok_tutorial.progress import progress_bar
from sok_tutorial.training.metrics import AucAccumulator  # noqa: F401  (the generators' oracle AUC)

# Bumped whenever a generator's output for the same parameters changes, so `reuse=True` never
# keeps data that the current code would not produce.
GENERATOR_VERSION = 2
BLOCK_ROWS = 65_536  # generation unit; part of the output's definition (same seed -> same bytes)


def line_blocks(fh: Any, block_bytes: int) -> Iterator[bytes]:
    """Read the binary file `fh` in blocks of whole lines, about `block_bytes` each (a line longer
    than a block makes a longer one); the last block may end without a newline."""
    leftover = b""
    while True:
        data = fh.read(block_bytes)
        buf = leftover + data
        if not buf:
            return
        cut = buf.rfind(b"\n") + 1 if data else len(buf)
        if cut == 0:  # one line longer than a block: read on
            leftover = buf
            continue
        yield buf[:cut]
        leftover = buf[cut:]


def is_utf8(raw: bytes) -> bool:
    """Whether `raw` is valid UTF-8 text."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def block_rng(seed: int, stream: int, block: int) -> np.random.Generator:
    """An independent generator for block `block` of stream `stream`: output never depends on how
    many rows are generated at once, and blocks could be generated in any order."""
    return np.random.default_rng([seed, stream, block])


def blocks(num_rows: int, block_rows: int = BLOCK_ROWS) -> Iterator[tuple[int, int]]:
    """(block index, rows to keep) covering `num_rows`. Generators always draw whole blocks of
    `block_rows` and keep the first rows of the last one, so a smaller dataset is exactly a
    prefix of a larger one made with the same seed."""
    for index, start in enumerate(range(0, num_rows, block_rows)):
        yield index, min(block_rows, num_rows - start)


def head(columns: dict[str, Any], rows: int) -> dict[str, Any]:
    """The first `rows` rows of each column of a block."""
    return {name: values[:rows] for name, values in columns.items()}


def reusable(out_dir: str | Path, generator: dict[str, Any]) -> Schema | None:
    """The schema of `out_dir` if it is a complete dataset made by exactly this generator call."""
    path = Path(out_dir)
    if not (path / SCHEMA_FILE).is_file():
        return None
    try:
        schema = Schema.load(path)
    except (ValueError, KeyError, TypeError):
        return None
    return schema if schema.metadata.get("generator") == generator else None


def reusable_files(out_dir: str | Path, generator: dict[str, Any]) -> dict[str, Any] | None:
    """The ``metadata.json`` of `out_dir` if it was written by exactly this generator call."""
    path = Path(out_dir) / "metadata.json"
    if not path.is_file():
        return None
    try:
        metadata = json.loads(path.read_text())
    except ValueError:
        return None
    return metadata if metadata.get("generator") == generator else None


def write_in_background(write: Callable[[Any], None], chunks: Iterable[Any], *, total: int | None,
                        count: Callable[[Any], int], progress: bool, desc: str) -> None:
    """Call ``write(chunk)`` for each chunk in a second thread while the next chunk is produced.

    NumPy generation and Arrow/Parquet encoding both release the GIL, so on two cores the
    generator and the writer run side by side. An exception in either thread is raised here.
    """
    q: queue.Queue = queue.Queue(maxsize=2)
    done = object()
    failure: list[BaseException] = []

    def consume() -> None:
        while True:
            item = q.get()
            if item is done:
                return
            if failure:
                continue  # drain so the producer never blocks
            try:
                write(item)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                failure.append(exc)

    thread = threading.Thread(target=consume, name="data_gen-writer", daemon=True)
    thread.start()
    bar = progress_bar(progress, total=total, desc=desc, unit="row")
    try:
        for chunk in chunks:
            if failure:
                break
            q.put(chunk)
            bar.update(count(chunk))
    finally:
        q.put(done)
        thread.join()
        bar.close()
    if failure:
        raise failure[0]
