"""Load the ``.cu`` sources of this package with CuPy, compiled once per device and memoized.

Only imported on the GPU path (`kernels.backend.cupy` is not None).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from kernels import backend

_HERE = Path(__file__).resolve().parent
THREADS = 256  # threads per block for every 1-D kernel of this package


@functools.lru_cache(maxsize=None)
def _module(name: str, device: int, options: tuple[str, ...]) -> Any:
    cupy = backend.cupy
    source = (_HERE / f"{name}.cu").read_text()
    with cupy.cuda.Device(device):
        return cupy.RawModule(code=source, options=("-std=c++17", f"-I{_HERE}") + options)


def function(name: str, entry: str, options: tuple[str, ...] = ()) -> Any:
    """The ``extern "C"`` kernel `entry` of ``kernels/<name>.cu`` for the current device."""
    cupy = backend.cupy
    if cupy is None:
        raise RuntimeError("CUDA kernels need CuPy and a visible GPU (kernels.backend found none)")
    return _module(name, cupy.cuda.runtime.getDevice(), tuple(options)).get_function(entry)


def grid(n: int) -> tuple[int]:
    """1-D grid for `n` elements; kernels loop with a grid stride, so the grid is capped."""
    return (max(1, min((n + THREADS - 1) // THREADS, 65_535)),)
