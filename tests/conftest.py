"""Shared fixtures. Tests marked ``gpu`` are skipped without a usable GPU; where one is visible
they first assert it really is there, so a CPU runner can never pass them by accident.

Hypothesis draws few examples by default (profile ``dev``, for ``make test``) and many under
``--hypothesis-profile=ci`` (``make test-all``); the tests themselves set no example counts."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

settings.register_profile("dev", max_examples=25, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dev")


LOGICAL_CPUS = 4


def pytest_configure(config: pytest.Config) -> None:
    """Split the CPU into logical devices before TensorFlow starts, so MirroredStrategy tests can
    run 1, 2 or 4 replicas in one process (as CI has no GPU). Costs nothing where TF is absent, and
    is skipped in pytest-xdist's controller (``make test``'s ``-n``), which runs no test: loading
    TensorFlow there would cost a few seconds of CPU while the workers load theirs."""
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        return
    try:
        import tensorflow as tf
    except ImportError:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)


_STRATEGIES: dict = {}


@pytest.fixture
def strategy_of():
    """strategy_of(n): the MirroredStrategy over n logical CPU devices, one per n for the whole
    session (separate instances in one process can collide on collective-op keys). Each n draws
    its collective group keys from its own range (TF's test hook ``_collective_key_base``): every
    strategy would otherwise start at group key 1, and a process that trained on 2 replicas
    could not train on 4 ("joining a group with size 4, but that group has size 2")."""
    import tensorflow as tf

    def make(n: int) -> "tf.distribute.Strategy":
        if n not in _STRATEGIES:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")[:n]]
            assert len(devices) == n, f"need {n} logical CPU devices, have {len(devices)}"
            kind = type(f"MirroredStrategy{n}", (tf.distribute.MirroredStrategy,), {"_collective_key_base": 1000 * n})
            _STRATEGIES[n] = kind(devices)
        return _STRATEGIES[n]

    return make


def _first_by_length(item: pytest.Item) -> int:
    """0 for a notebook run at a larger size, 1 for another notebook run, 2 for the rest."""
    if "notebooks" not in item.keywords:
        return 2
    return 0 if "slow" in item.keywords else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Notebook runs first (larger sizes first, each file's tests kept together), so the test
    workers (`make test`: pytest-xdist, a file per worker in this order, ``--no-loadscope-reorder``)
    start the longest files at once rather than one of them last; GPU tests are skipped without a GPU."""
    rank: dict = {}
    for item in items:
        rank[item.path] = min(rank.get(item.path, 2), _first_by_length(item))
    items.sort(key=lambda item: rank[item.path])  # stable: the order within each group is kept
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
