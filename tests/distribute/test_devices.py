"""`resolve_device`: a notebook's DEVICE parameter to a TensorFlow device."""
from __future__ import annotations

import pytest
import tensorflow as tf

import sok_tutorial as sok

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))


@pytest.mark.parametrize("device", ["cpu", "CPU", "Cpu"])
def test_cpu_is_the_cpu_in_any_case(device):
    assert sok.resolve_device(device) == "/CPU:0"


def test_auto_takes_a_gpu_only_where_there_is_one():
    assert sok.resolve_device() == sok.resolve_device("auto") == ("/GPU:0" if HAS_GPU else "/CPU:0")
    with tf.device(sok.resolve_device("auto")):
        placed = tf.identity(tf.constant(1.0)).device
    assert placed.endswith("GPU:0" if HAS_GPU else "CPU:0")


@pytest.mark.skipif(HAS_GPU, reason="asks for a GPU where there is none")
def test_asking_for_a_gpu_without_one_names_the_way_out():
    with pytest.raises(ValueError, match=r"device='gpu'.*no GPU.*'auto' or 'cpu'"):
        sok.resolve_device("gpu")


@pytest.mark.parametrize("device", ["tpu", "", 0, None])
def test_anything_else_is_refused_with_the_choices(device):
    with pytest.raises(ValueError, match=r"device=.*expected one of \('auto', 'cpu', 'gpu'\)"):
        sok.resolve_device(device)
