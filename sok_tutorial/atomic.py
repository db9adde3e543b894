"""Write outputs to a temporary sibling and rename on success: a failure leaves nothing behind,
and an existing output is replaced only after the new one is complete.

Every directory written here holds a small marker file (`MARKER`). ``overwrite=True`` replaces
only such a directory, or an empty one: never a directory of other files, and never one holding
an input of the same write. Temporary siblings are named ``.<name>.tmp-<host>-<pid>-<random>``;
a write to a path first removes the siblings that a killed process left there. Files are flushed
to disk (fsync) before the rename that publishes them, and the parent directory after it; an
existing output is swapped with the new one in one step where the system allows it (Linux), so
its path is never missing, and elsewhere the next write restores it if a kill came in between.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

MARKER = ".sok_tutorial"  # in every directory this library writes: what overwrite=True may replace
_HOST = re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:32] or "host"
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]{12}$")


def _temp_name(path: Path, kind: str) -> Path:
    return path.parent / f".{path.name}.{kind}-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def clean_stale(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary siblings of `path` left by killed writers (this host, process gone).

    Returns the paths removed. Siblings of a live process, or written on another host, stay.
    """
    path = Path(path)
    removed = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP.match(entry.name)
        if (match is None or match["name"] != path.name or match["host"] != _HOST
                or _alive(int(match["pid"]))):
            continue
        if ".old-" in entry.name and not (path.exists() or path.is_symlink()):
            os.replace(entry, path)  # killed between moving the old output aside and the new one in
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _check_replaceable(path: Path, arg: str, inputs: Iterable[Any]) -> None:
    """`overwrite=True` may replace `path`: an empty directory or one this library wrote, holding no input."""
    if not path.is_dir() or path.is_symlink():
        raise FileExistsError(f"{arg}={str(path)!r} exists and is not a directory; overwrite=True replaces only "
                              "a directory written by sok_tutorial (or an empty one)")
    names = sorted(p.name for p in path.iterdir())
    if names and MARKER not in names:
        raise FileExistsError(f"{arg}={str(path)!r} holds files sok_tutorial did not write ({names[:3]}); "
                              "overwrite=True replaces only a directory it wrote (or an empty one): choose a "
                              "new or empty directory, or remove it yourself")
    real = path.resolve()
    for item in inputs:
        if item is None:
            continue
        source = Path(item).resolve()
        if source == real or real in source.parents:
            raise ValueError(f"{arg}={str(path)!r} holds the input {str(item)!r}: overwriting would delete "
                             "what is being read; write to another directory")


def _writable_parent(path: Path, arg: str) -> Path:
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PermissionError(f"{arg}={str(path)!r}: cannot create parent directory ({exc})") from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{arg}={str(path)!r}: parent directory {str(parent)!r} is not writable")
    return parent


def check_destination(path: str | os.PathLike, *, overwrite: bool, arg: str = "out_dir",
                      inputs: Iterable[Any] = ()) -> Path:
    """Check that `path` may be written (see `begin_directory`), changing nothing: what a long
    write calls first, so that a bad destination fails before hours of reading. Returns `path`
    made absolute."""
    path = Path(os.path.abspath(path))
    if not path.name:
        raise ValueError(f"{arg}={str(path)!r} is a filesystem root; name a directory to write")
    if path.exists() or path.is_symlink():
        empty = path.is_dir() and not path.is_symlink() and not any(path.iterdir())
        if not overwrite and not empty:
            raise FileExistsError(
                f"{arg}={str(path)!r} exists and is not empty; pass overwrite=True to replace it"
            )
        if not empty:
            _check_replaceable(path, arg, inputs)
    return path


def begin_directory(path: str | os.PathLike, *, overwrite: bool, arg: str = "out_dir",
                    inputs: Iterable[Any] = ()) -> Path:
    """Check `path` may be written and create an empty temporary sibling to write into.

    Args:
        path: the directory to produce.
        overwrite: replace an existing `path`, if this library wrote it (or it is empty).
        arg: the caller's name for `path`, for error messages.
        inputs: paths the write reads; `path` may not hold any of them.

    Raises:
        FileExistsError: `path` exists and is not empty and `overwrite` is False; or `overwrite`
            is True but `path` is a file or a directory of files this library did not write.
        ValueError: `path` holds an input of this write.
        PermissionError: the parent directory cannot be written.
    """
    path = check_destination(path, overwrite=overwrite, arg=arg, inputs=inputs)
    _writable_parent(path, arg)
    clean_stale(path)
    tmp = _temp_name(path, "tmp")
    tmp.mkdir()
    (tmp / MARKER).write_text("written by sok_tutorial; overwrite=True may replace this directory\n")
    return tmp


def commit_directory(tmp: Path, path: str | os.PathLike) -> Path:
    """Flush `tmp` to disk and move it into place, replacing whatever was at `path`."""
    path = Path(os.path.abspath(path))
    _fsync_tree(tmp)
    trash = None
    if (path.exists() or path.is_symlink()) and _exchange(tmp, path):
        trash = tmp  # one atomic swap: `path` is never missing; the old output now sits at `tmp`
    else:
        if path.exists() or path.is_symlink():
            trash = _temp_name(path, "old")  # a kill before the next line: the next write puts it back
            os.replace(path, trash)
        os.replace(tmp, path)
    _fsync_dir(path.parent)
    if trash is not None:
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)
    return path


@functools.cache
def _renameat2() -> Any:
    """libc's ``renameat2``, or None where there is none."""
    try:
        import ctypes

        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return call


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    call = _renameat2()
    at_fdcwd, exchange = -100, 2
    return call is not None and call(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), exchange) == 0


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems cannot sync a directory
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file under `root`, then the directories, so a rename publishes data on disk."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(folder))


def abort_directory(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, overwrite: bool, arg: str = "out_dir",
                     inputs: Iterable[Any] = ()) -> Iterator[Path]:
    """Yield a temporary directory that becomes `path` when the block exits without error.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> with atomic_directory(root / "out", overwrite=False) as tmp:
        ...     _ = (tmp / "a.txt").write_text("done")
        >>> (root / "out" / "a.txt").read_text()
        'done'
    """
    tmp = begin_directory(path, overwrite=overwrite, arg=arg, inputs=inputs)
    try:
        yield tmp
    except BaseException:
        abort_directory(tmp)
        raise
    commit_directory(tmp, path)


def write_file(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary sibling and an atomic rename."""
    path = Path(path)
    clean_stale(path)
    tmp = _temp_name(path, "tmp")
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
    _fsync_dir(path.parent)
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write `obj` as indented, key-sorted JSON (stable bytes for the same content)."""
    return write_file(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Parse the JSON file at `path`; a missing or corrupt file is an error naming the path."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist") from None
    try:
        return json.loads(data.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {str(path)!r} is not valid JSON ({exc}): a corrupt or partial file") from exc
