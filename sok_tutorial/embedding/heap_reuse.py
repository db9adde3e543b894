"""A step's temporaries reused from one step to the next: glibc's malloc told to keep freed blocks.

Every training step allocates the same large temporaries again: the rows it gathers (a step of
the torchrec_shape workload gathers 213k rows of 16 floats, 13.6 MB), their gradients, the
deduplicated keys, the reads of the key index. TensorFlow's CPU allocator takes them from the C
library's ``malloc``, and glibc's defaults suit a program that allocates once, not one that
allocates the same tens of MB every few milliseconds: a block from 128 KiB up (a threshold that
rises with the blocks freed, up to 32 MiB) is a memory mapping of its own, given back to the
kernel by ``free``, and free memory at the top of a heap beyond 128 KiB is given back too; a
thread's heap (TensorFlow's ops run on threads of their own, each with its own malloc arena of
64 MiB heaps) that a large block had to be added for is given back whole once it is free. The
next step then asks the kernel for the same memory again and touches it in page by page: a
page fault, and a 4 KiB page zeroed, for every page of every large temporary, every step.

`keep_freed_memory` sets, once per process, through ``mallopt``: ``M_MMAP_THRESHOLD`` to
`MMAP_THRESHOLD` (32 MiB), ``M_TRIM_THRESHOLD`` to `TRIM_THRESHOLD` (1 GiB) and ``M_TOP_PAD``
to `TOP_PAD` (64 MiB, the padding a heap keeps when trimmed, which also keeps a thread's free
heap from being given back). Blocks under 32 MiB then come from malloc's heaps, and a freed one
stays there for the next step to take. The process then holds on to about the most its steps
had allocated at once (its peak, which the next step needs again) instead of returning it;
blocks of 32 MiB and more (a table, an export) are mappings of their own as before. Allocators
such as jemalloc and tcmalloc, which recommender training is often run under, keep freed memory
for the next allocation by design.

A table calls it when it is first looked up (`sok_tutorial.embedding.table.EmbeddingTable`).
It changes only where memory comes from, never what a step computes; it applies to the blocks
allocated after the call, by every thread of the process. ``SOK_TUTORIAL_HEAP_REUSE=0`` in the
environment turns it off; a C library other than glibc (macOS, musl) is left alone.
``benchmarks/embedding.py --group heap`` measures it: samples/s and page faults, on and off.

Example:
    >>> first = keep_freed_memory()  # True where glibc took the settings
    >>> keep_freed_memory() is first  # once per process: later calls change nothing
    True
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

MMAP_THRESHOLD = 32 << 20  # blocks below this come from malloc's heaps (glibc's cap for its own dynamic threshold)
TRIM_THRESHOLD = 1 << 30  # free memory a heap keeps at its top before giving it back
TOP_PAD = 64 << 20  # free memory a trimmed heap keeps: one thread heap's worth
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # mallopt's parameter numbers (malloc.h)
_done: list[bool] = []  # the outcome of the one call that made the settings


def enabled() -> bool:
    """Whether this process may change malloc's settings: glibc, and ``SOK_TUTORIAL_HEAP_REUSE`` not
    ``0``."""
    return (os.environ.get("SOK_TUTORIAL_HEAP_REUSE", "1") != "0" and sys.platform == "linux"
            and platform.libc_ver()[0] == "glibc")


def keep_freed_memory() -> bool:
    """Set malloc's thresholds (module docstring) once per process; returns whether they are set.
    Later calls return the first call's outcome and change nothing."""
    if _done:
        return _done[0]
    ok = False
    if enabled():
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = all([mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD), mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                      mallopt(_M_TOP_PAD, TOP_PAD)])
    _done.append(ok)
    return ok
