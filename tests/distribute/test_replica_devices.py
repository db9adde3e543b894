"""`replica_devices`: where a multi-replica notebook's replicas live (its ``DEVICE`` parameter).

The test session splits the CPU into 4 logical devices before TensorFlow starts (conftest)."""
from __future__ import annotations

import pytest
import tensorflow as tf

import sok_tutorial as sok

GPUS = len(tf.config.list_physical_devices("GPU"))


@pytest.mark.parametrize("device", ["cpu", "CPU"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_cpu_gives_logical_cpu_devices_even_beside_gpus(device, n):
    devices = sok.replica_devices(n, device)
    assert len(devices) == n == len(set(devices))
    assert all("CPU" in d for d in devices)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_auto_takes_gpus_only_when_there_are_enough(n):
    devices = sok.replica_devices(n)
    assert devices == sok.replica_devices(n, "auto") and len(devices) == n
    assert all(("GPU" if GPUS >= n else "CPU") in d for d in devices)


def test_a_strategy_over_cpu_devices_runs_each_replica_there():
    strategy = tf.distribute.MirroredStrategy(sok.replica_devices(2, "cpu"))
    placed = strategy.experimental_local_results(strategy.run(lambda: tf.identity(tf.constant(1.0))))
    assert [t.device.rsplit(":", 1)[-1] for t in placed] == ["0", "1"]
    assert all("CPU" in t.device for t in placed)


@pytest.mark.skipif(GPUS >= 2, reason="asks for more GPUs than there are")
def test_gpu_without_enough_gpus_names_the_way_out():
    with pytest.raises(ValueError, match=rf"device='gpu' with num_replicas=2, but TensorFlow sees {GPUS} GPU"
                                         r".*'auto' or 'cpu'"):
        sok.replica_devices(2, "gpu")


@pytest.mark.parametrize("device", ["tpu", "", None])
def test_anything_else_is_refused_with_the_choices(device):
    with pytest.raises(ValueError, match=r"device=.*expected one of \('auto', 'cpu', 'gpu'\)"):
        sok.replica_devices(2, device)
