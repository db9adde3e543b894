"""Large tables on 2 MB pages: ask Linux to back the buffers of a table's variables with
transparent huge pages.

A training step gathers and scatters rows of a table, of its optimizer slots and of its key
index at random over hundreds of MiB. On 4 KiB pages nearly every row read costs a page-table
walk besides its cache miss; a 2 MB page covers 512 times as much memory with one translation.
`advise` calls ``madvise(MADV_HUGEPAGE)`` and then ``madvise(MADV_COLLAPSE)`` (Linux 6.1 and
later) on the whole 2 MB pages inside the buffer of each large variable held in host memory:
the first lets the kernel keep the range on huge pages, the second moves the pages there now
rather than whenever the kernel's background thread gets to them. Contents do not change, and a
kernel or variable that cannot take huge pages is simply left as it was.

The address comes from a read of the variable (through DLPack), which shares the variable's
buffer only until the variable's first sparse update: TensorFlow then hands every read a copy
of its own, and the buffer itself stays where it is for good. So a table advises its variables
when it is first looked up (before any step has run) and a sparse optimizer its slots when it
is built; each variable once. A variable replaced as a whole later (``assign`` of a restored
value may hand it a new buffer) can end up on ordinary pages again.

``SOK_TUTORIAL_HUGE_PAGES=0`` in the environment turns it off; so does the system setting
``/sys/kernel/mm/transparent_hugepage/enabled = never``. Only variables of at least
`MIN_BYTES` are advised: on a smaller one the gain is small, and the kernel's huge pages are
better spent on the large ones.
``benchmarks/embedding.py --group hugepages`` measures what it gives.

Example:
    >>> import tensorflow as tf
    >>> small = tf.Variable(tf.zeros([4, 2]))
    >>> advise([small])  # far below MIN_BYTES: left alone
    0
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from sok_tutorial.embedding.ops import local_components

MIN_BYTES = 64 << 20  # a variable smaller than this is left on ordinary pages
HUGE = 2 << 20  # the size of one transparent huge page on x86-64 and arm64 (4 KiB base pages)
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_DLPACK_CPU = 1
_ADVISED = "_sok_tutorial_huge_pages"  # set on a variable object once it has been advised


def enabled() -> bool:
    """Whether this process may advise huge pages: Linux with transparent huge pages not
    ``never``, and ``SOK_TUTORIAL_HUGE_PAGES`` not ``0``."""
    if sys.platform != "linux" or os.environ.get("SOK_TUTORIAL_HUGE_PAGES", "1") == "0":
        return False
    return _system_allows()


@functools.cache
def _system_allows() -> bool:
    """The kernel's setting, read once: transparent huge pages not ``never``."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc


@functools.cache
def _capsule_pointer() -> Any:
    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer",
                                                                                 ctypes.pythonapi))
    return get


def _host_buffer(variable: tf.Variable) -> tuple[int, int] | None:
    """(address, bytes) of the buffer a read of `variable` shares, or None when it is not in host
    memory. Read from the DLPack capsule of the read (`DLManagedTensor`: the data pointer first,
    the device type next, the byte offset at byte 40)."""
    capsule = tf.experimental.dlpack.to_dlpack(variable.value())
    tensor = _capsule_pointer()(capsule, b"dltensor")
    data = ctypes.c_void_p.from_address(tensor).value or 0
    device = ctypes.c_int32.from_address(tensor + 8).value
    offset = ctypes.c_uint64.from_address(tensor + 40).value
    if device != _DLPACK_CPU:
        return None
    return data + offset, variable.shape.num_elements() * variable.dtype.size


def advise(variables: Iterable[Any], min_bytes: int | None = None) -> int:
    """Put the host-memory buffers of `variables` (TensorFlow or Keras variables, mirrored ones
    included: each local copy) of at least `min_bytes` (default `MIN_BYTES`) on huge pages;
    returns the bytes moved.

    Call it before the variables' first sparse update (module docstring); a variable is advised
    once, and a later call passes over it.
    """
    min_bytes = MIN_BYTES if min_bytes is None else min_bytes
    with tf.init_scope():  # eagerly, also when a layer is built while a step is traced
        large = [copy for variable in variables for copy in local_components(variable)
                 if not getattr(copy, _ADVISED, False) and "GPU" not in (copy.device or "").upper()
                 and copy.shape.num_elements() is not None
                 and copy.shape.num_elements() * copy.dtype.size >= min_bytes]
        if not large or not enabled():  # (most tables are small: no system read for them)
            return 0
        moved = 0
        for copy in large:
            setattr(copy, _ADVISED, True)
            try:
                where = _host_buffer(copy)
            except Exception:  # noqa: BLE001  (a dtype or device DLPack does not carry: left alone)
                continue
            if where is None:
                continue
            start = -(-where[0] // HUGE) * HUGE  # the whole huge pages inside the buffer
            end = (where[0] + where[1]) // HUGE * HUGE
            if end <= start:
                continue
            _libc().madvise(start, end - start, _MADV_HUGEPAGE)
            if _libc().madvise(start, end - start, _MADV_COLLAPSE) == 0:
                moved += end - start
    return moved
