"""Replicas on any machine: SOK's ``Init`` on top of tf.distribute.

``Init(global_batch_size)`` finds the active strategy (the default one outside a scope) and
says how the global batch splits over its replicas. `replica_devices` gives the devices for a
``MirroredStrategy`` of N replicas: GPUs where there are enough, else N logical devices carved
out of the CPU, so the multi-device code path runs (and is tested) on a laptop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from kernels import checks


def replica_devices(num_replicas: int) -> list[str]:
    """Device names for `num_replicas` replicas: GPUs if enough are visible, else logical CPUs.

    Logical CPU devices can only be created before TensorFlow initialises its devices: call this
    before running any TensorFlow op (first thing in a notebook or script).
    """
    checks.positive_int("num_replicas", num_replicas)
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= num_replicas:
        return [f"/GPU:{i}" for i in range(num_replicas)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu) or []  # does not start TensorFlow
    if len(configured) < num_replicas:
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_replicas)
        except RuntimeError as exc:
            have = len(tf.config.list_logical_devices("CPU"))
            raise RuntimeError(f"num_replicas={num_replicas}: TensorFlow already runs with {have} CPU device(s); "
                               "call replica_devices() before any TensorFlow op") from exc
    return [d.name for d in tf.config.list_logical_devices("CPU")[:num_replicas]]


@dataclass(frozen=True)
class Context:
    """What `Init` found: the strategy and how a global batch splits over its replicas."""

    strategy: Any
    num_replicas: int
    global_batch_size: int | None
    replica_batch_size: int | None


def Init(global_batch_size: int | None = None, strategy: Any = None) -> Context:  # noqa: N802 - SOK's name
    """SOK's ``sok.Init``: check the global batch against the active strategy's replicas.

    Raises:
        ValueError: `global_batch_size` is not divisible by the number of replicas.
    """
    strategy = strategy or tf.distribute.get_strategy()
    replicas = int(strategy.num_replicas_in_sync)
    per_replica = None
    if global_batch_size is not None:
        checks.positive_int("global_batch_size", global_batch_size)
        if global_batch_size % replicas:
            raise ValueError(f"global_batch_size={global_batch_size} does not split evenly over {replicas} "
                             f"replicas; use a multiple of {replicas}")
        per_replica = global_batch_size // replicas
    return Context(strategy, replicas, global_batch_size, per_replica)
