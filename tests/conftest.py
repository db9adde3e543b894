"""Shared fixtures. Tests marked ``gpu`` are skipped without a usable GPU; where one is visible
they first assert it really is there, so a CPU runner can never pass them by accident."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from kernels import backend

    if backend.GPU_AVAILABLE:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU visible to CuPy (kernels.backend found none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gpu():
    """For gpu tests: the CuPy module, after checking a device really answers."""
    from kernels import backend

    assert backend.cupy is not None and backend.cupy.cuda.runtime.getDeviceCount() > 0
    return backend.cupy
