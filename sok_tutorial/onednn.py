"""TensorFlow's oneDNN CPU kernels: on or off for this process, chosen before TensorFlow loads.

TensorFlow's x86 wheels carry two sets of CPU kernels for matmuls, batched matmuls, transposes
and a few element-wise ops: Eigen's and oneDNN's (``_MklMatMul``, ``_MklTranspose``... in a
profile). TensorFlow turns oneDNN on by itself only on CPUs with AVX-512's neural-network
instructions (AVX512_VNNI, AVX512_BF16, AMX; its 2.9 release notes) and leaves it off elsewhere (an
AMD EPYC of the Zen 3 family, for one); ``TF_ENABLE_ONEDNN_OPTS`` overrides that
choice, and TensorFlow reads it once, when it is imported. A DLRM step is mostly such ops (the
top MLP's matmuls, the interaction's batched matmuls and transposes), so the choice matters to
it: ``benchmarks/embedding.py --group dlrm`` runs it both ways (``ours_cpu_threads`` and
``ours_onednn``; README). PyTorch, the peer it is measured against, uses oneDNN and MKL as it
comes.

This module does not import TensorFlow, so `use_onednn` can run before it is loaded:
``import sok_tutorial`` is lazy, and only TF-facing names load TensorFlow.

Example (first thing in a script or notebook, before ``import tensorflow``):
    >>> import sok_tutorial as sok
    >>> sok.use_onednn()  # doctest: +SKIP
    >>> import tensorflow as tf
    >>> sok.onednn_enabled()  # doctest: +SKIP
    True
"""
from __future__ import annotations

import os
import sys

from kernels import checks

#: the environment variable TensorFlow reads when it is imported
ENV = "TF_ENABLE_ONEDNN_OPTS"


def onednn_enabled() -> bool:
    """Whether TensorFlow runs its oneDNN CPU kernels in this process (imports TensorFlow).

    Example:
        >>> from sok_tutorial.onednn import onednn_enabled
        >>> onednn_enabled() in (True, False)
        True
    """
    from tensorflow.python.util import _pywrap_util_port  # (loads TensorFlow, which sets the switch)

    return bool(_pywrap_util_port.IsMklEnabled())


def use_onednn(enable: bool = True) -> None:
    """Turn TensorFlow's oneDNN CPU kernels on (or, with ``enable=False``, off) for this process.

    Sets ``TF_ENABLE_ONEDNN_OPTS`` for TensorFlow to read when it is imported, so call it before
    anything imports TensorFlow. Once TensorFlow is loaded its choice is fixed: a call asking
    for what it already has does nothing; one asking for the other raises, changing nothing.

    Args:
        enable: True for oneDNN's kernels, False for Eigen's.

    Raises:
        ValueError: `enable` is not a bool.
        RuntimeError: TensorFlow is already imported with the other choice.

    Example:
        >>> import sok_tutorial as sok
        >>> sok.use_onednn(sok.onednn_enabled())  # (TensorFlow is loaded here: asks for what it has)
        >>> sok.use_onednn(not sok.onednn_enabled())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        RuntimeError: use_onednn(enable=...): TensorFlow is already imported with oneDNN ...
    """
    enable = checks.flag("enable", enable)
    if "tensorflow" in sys.modules:
        now = onednn_enabled()
        if now != enable:
            raise RuntimeError(f"use_onednn(enable={enable}): TensorFlow is already imported with oneDNN "
                               f"{'on' if now else 'off'}, a choice it makes once; call use_onednn() before "
                               f"importing tensorflow (or set {ENV}={int(enable)} in the environment)")
        return
    os.environ[ENV] = "1" if enable else "0"
