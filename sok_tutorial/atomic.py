"""Write outputs to a temporary sibling and rename on success: a failure leaves nothing behind,
and an existing output is replaced only after the new one is complete."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _writable_parent(path: Path, arg: str) -> Path:
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PermissionError(f"{arg}={str(path)!r}: cannot create parent directory ({exc})") from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{arg}={str(path)!r}: parent directory {str(parent)!r} is not writable")
    return parent


def begin_directory(path: str | os.PathLike, *, overwrite: bool, arg: str = "out_dir") -> Path:
    """Check `path` may be written and create an empty temporary sibling to write into.

    Raises:
        FileExistsError: `path` exists, is not an empty directory, and `overwrite` is False.
        PermissionError: the parent directory cannot be written.
    """
    path = Path(path)
    parent = _writable_parent(path, arg)
    if path.exists() and not overwrite:
        if not path.is_dir() or any(path.iterdir()):
            raise FileExistsError(
                f"{arg}={str(path)!r} exists and is not empty; pass overwrite=True to replace it"
            )
    tmp = parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    return tmp


def commit_directory(tmp: Path, path: str | os.PathLike) -> Path:
    """Move the finished `tmp` into place, replacing whatever was at `path`."""
    path = Path(path)
    trash = None
    if path.exists() or path.is_symlink():
        trash = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
        os.replace(path, trash)
    os.replace(tmp, path)
    if trash is not None:
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)
    return path


def abort_directory(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, overwrite: bool, arg: str = "out_dir") -> Iterator[Path]:
    """Yield a temporary directory that becomes `path` when the block exits without error.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> with atomic_directory(root / "out", overwrite=False) as tmp:
        ...     _ = (tmp / "a.txt").write_text("done")
        >>> (root / "out" / "a.txt").read_text()
        'done'
    """
    tmp = begin_directory(path, overwrite=overwrite, arg=arg)
    try:
        yield tmp
    except BaseException:
        abort_directory(tmp)
        raise
    commit_directory(tmp, path)


def write_file(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary sibling and an atomic rename."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        with open(tmp, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write `obj` as indented, key-sorted JSON (stable bytes for the same content)."""
    return write_file(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
