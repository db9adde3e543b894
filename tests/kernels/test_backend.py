from __future__ import annotations

import numpy
import pytest

from kernels import backend, checks


def test_auto_resolves_to_what_was_found():
    expected = "gpu" if backend.GPU_AVAILABLE else "cpu"
    assert backend.resolve_device("auto") == expected
    assert backend.array_module("cpu") is numpy
    assert set(backend.info()) == {"numpy", "cupy", "cudf", "default device"}


@pytest.mark.skipif(backend.GPU_AVAILABLE, reason="a GPU is visible here")
def test_asking_for_a_missing_gpu_is_an_error_not_a_fallback():
    with pytest.raises(RuntimeError, match="device='gpu'"):
        backend.resolve_device("gpu")
    assert backend.cupy is None and backend.cudf is None


def test_unknown_device_is_named():
    with pytest.raises(ValueError, match="device='tpu'"):
        backend.resolve_device("tpu")


@pytest.mark.gpu
def test_gpu_backend_is_cupy(gpu):
    assert backend.array_module("gpu") is gpu
    assert backend.resolve_device("auto") == "gpu"


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3", None])
def test_positive_int_rejects(value):
    with pytest.raises(ValueError, match=f"batch_size={value!r}"):
        checks.positive_int("batch_size", value)


def test_checks_accept_and_return():
    assert checks.positive_int("n", numpy.int64(3)) == 3 and checks.positive_int("n", 0, allow_zero=True) == 0
    assert checks.fraction("p", 1) == 1.0
    assert checks.one_of("mode", "a", "ab") == "a"
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['z'\]"):
        checks.known_names("cols", ["a", "z"], ["a", "b"])
