"""Framework-free array kernels: one Python API, a NumPy and a CUDA (CuPy) implementation.

Nothing here imports TensorFlow. `kernels.backend` decides once, at import, whether a GPU is
usable; everything above asks it instead of trying imports of its own.
"""
from kernels import backend

__all__ = ["backend"]
