"""The one place that decides which array libraries this process can use.

Decided once, at import: whether CuPy is installed *and* sees a CUDA device, and whether cuDF
imports. Everything else asks this module (``backend.cupy``, ``backend.cudf``,
``backend.array_module(device)``) rather than trying imports of its own, so an algorithm picks
its ``xp`` once at the top and never branches on the device deep inside.

Example:
    >>> from kernels import backend
    >>> backend.resolve_device("cpu")
    'cpu'
    >>> backend.array_module("cpu").__name__
    'numpy'
"""
from __future__ import annotations

import importlib
from types import ModuleType

import numpy

DEVICES = ("auto", "cpu", "gpu")


def _probe(name: str) -> tuple[ModuleType | None, str]:
    """Import `name` and, for CuPy, check that a device is visible. Returns (module, reason)."""
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # ImportError, or a CUDA runtime error raised while importing
        return None, f"not importable ({type(exc).__name__}: {exc})".replace("\n", " ")
    if name == "cupy":
        try:
            count = module.cuda.runtime.getDeviceCount()
        except Exception as exc:
            return None, f"installed but no usable CUDA device ({type(exc).__name__})"
        if count < 1:
            return None, "installed but no CUDA device visible"
        return module, f"usable, {count} device(s)"
    return module, "usable"


cupy, _cupy_reason = _probe("cupy")
# cuDF is only worth importing where CuPy found a device; on a CPU machine it cannot run.
if cupy is not None:
    cudf, _cudf_reason = _probe("cudf")
else:
    cudf, _cudf_reason = None, "not used: no usable GPU"

GPU_AVAILABLE: bool = cupy is not None


def resolve_device(device: str) -> str:
    """Turn ``"auto" | "cpu" | "gpu"`` into ``"cpu"`` or ``"gpu"``.

    ``"gpu"`` without a usable GPU is an error, never a silent fall-back to the CPU.
    """
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not one of {DEVICES}")
    if device == "auto":
        return "gpu" if GPU_AVAILABLE else "cpu"
    if device == "gpu" and not GPU_AVAILABLE:
        raise RuntimeError(
            f"device='gpu' was asked for but no GPU is usable here (cupy: {_cupy_reason}); "
            "pass device='auto' or 'cpu'"
        )
    return device


def array_module(device: str = "auto") -> ModuleType:
    """NumPy for the CPU, CuPy for the GPU (after `resolve_device`)."""
    return cupy if resolve_device(device) == "gpu" else numpy


def array_module_of(array: object) -> ModuleType:
    """CuPy for a CuPy array, NumPy for anything else."""
    return cupy if cupy is not None and isinstance(array, cupy.ndarray) else numpy


def info() -> dict[str, str]:
    """What was found at import, as printable strings."""
    return {
        "numpy": numpy.__version__,
        "cupy": (f"{cupy.__version__}, " if cupy is not None else "") + _cupy_reason,
        "cudf": (f"{cudf.__version__}, " if cudf is not None else "") + _cudf_reason,
        "default device": resolve_device("auto"),
    }
