"""Replicas on any machine: SOK's ``Init`` on top of tf.distribute.

``Init(global_batch_size)`` finds the active strategy (the default one outside a scope) and
says how the global batch splits over its replicas. `replica_devices` gives the devices for a
``MirroredStrategy`` of N replicas: GPUs where there are enough, else N logical devices carved
out of the CPU, so the multi-device code path runs (and is tested) on a laptop; its `device`
(``"auto"``, ``"cpu"``, ``"gpu"``) is a notebook's ``DEVICE`` parameter, as `resolve_device`'s
is for one device.

`make_strategy` picks the strategy from the environment: ``TF_CONFIG`` (set by
``python -m sok_tutorial.launch``) or an MPI launch (``OMPI_COMM_WORLD_RANK/SIZE``) gives a
``MultiWorkerMirroredStrategy`` whose collectives time out instead of hanging when a peer dies;
otherwise a ``MirroredStrategy`` over `replica_devices`.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from kernels import checks


def _device_choice(device: Any) -> str:
    """A ``DEVICE`` parameter, lower-cased and checked: ``"auto"``, ``"cpu"`` or ``"gpu"``."""
    return checks.one_of("device", device.lower() if isinstance(device, str) else device, ("auto", "cpu", "gpu"))


def replica_devices(num_replicas: int, device: str = "auto") -> list[str]:
    """Device names for a ``MirroredStrategy`` of `num_replicas` replicas: where the replicas live.

    A multi-replica notebook's ``DEVICE`` parameter, as `resolve_device` is a one-device one's:

    - ``"auto"``: GPUs when TensorFlow sees at least `num_replicas`, else `num_replicas` logical
      devices carved out of the CPU (so the multi-replica code path runs on a laptop too);
    - ``"cpu"``: logical CPU devices even where there are GPUs (the same run as a laptop's);
    - ``"gpu"``: GPUs, or an error when fewer than `num_replicas` are visible.

    Logical CPU devices can only be created before TensorFlow initialises its devices: call this
    before running any TensorFlow op (first thing in a notebook or script).

    Args:
        num_replicas: replicas of the strategy (>= 1).
        device: ``"auto"``, ``"cpu"`` or ``"gpu"`` (case does not matter).

    Returns:
        `num_replicas` device names, e.g. ``["/GPU:0", "/GPU:1"]``.

    Example:
        >>> import sok_tutorial as sok
        >>> [name.rsplit("/", 1)[-1] for name in sok.replica_devices(1, "cpu")]
        ['device:CPU:0']
    """
    checks.positive_int("num_replicas", num_replicas)
    choice = _device_choice(device)
    gpus = tf.config.list_physical_devices("GPU")
    if choice == "gpu" and len(gpus) < num_replicas:
        raise ValueError(f"device={device!r} with num_replicas={num_replicas}, but TensorFlow sees {len(gpus)} "
                         "GPU(s) here; pass 'auto' or 'cpu' (logical CPU devices), or fewer replicas")
    if choice != "cpu" and len(gpus) >= num_replicas:
        return [f"/GPU:{i}" for i in range(num_replicas)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu) or []  # does not start TensorFlow
    if len(configured) < num_replicas and num_replicas > 1:  # (one replica: the CPU as it is)
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_replicas)
        except RuntimeError as exc:
            have = len(tf.config.list_logical_devices("CPU"))
            raise RuntimeError(f"num_replicas={num_replicas}: TensorFlow already runs with {have} CPU device(s); "
                               "call replica_devices() before any TensorFlow op") from exc
    return [d.name for d in tf.config.list_logical_devices("CPU")[:num_replicas]]


def resolve_device(device: str = "auto") -> str:
    """The TensorFlow device a notebook's ``DEVICE`` parameter names: ``"auto"`` takes the first GPU
    when TensorFlow sees one, else the CPU; ``"cpu"`` and ``"gpu"`` choose (case does not matter).

    A notebook wraps its training in ``with tf.device(resolve_device(DEVICE)):``, so the same cells
    run on a laptop and on a GPU box with no edits.

    Example:
        >>> import tensorflow as tf
        >>> resolve_device("cpu")
        '/CPU:0'
        >>> resolve_device("auto") == ("/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0")
        True
    """
    choice = _device_choice(device)
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if choice == "gpu" and not has_gpu:
        raise ValueError(f"device={device!r}, but TensorFlow sees no GPU here; pass 'auto' or 'cpu'")
    return "/GPU:0" if choice == "gpu" or (choice == "auto" and has_gpu) else "/CPU:0"


def cpu_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (no sched_getaffinity: macOS, Windows)
        return os.cpu_count() or 1


def cpu_threads(intra_op: int = 1, inter_op: int | None = None, device: str = "auto") -> dict[str, int] | None:
    """Run TensorFlow's ops on a CPU `intra_op` threads each, up to `inter_op` of them at once.

    TensorFlow's default splits every op over all cores (intra-op parallelism) and runs as many
    independent ops at once as there are cores (inter-op parallelism). A DLRM step is the other
    shape: hundreds of small ops, many independent of each other (the tables' maps, the bottom
    MLP beside the lookups, the interaction's slices of the batch), each too small for a split
    to pay for its hand-offs. One thread per op with the cores running independent ops side by
    side keeps both busy with useful work: ``benchmarks/embedding.py --group dlrm`` measures the
    DLRM both ways (README). A model of a few large ops (one table's gather of 200k rows) runs
    faster with TensorFlow's default, so this is a choice per model, not a library default.

    TensorFlow fixes its threads when it starts: call this first, before any TensorFlow op (as
    `replica_devices`). Calling it again with the same numbers does nothing.

    Args:
        intra_op: threads each op may use (>= 1).
        inter_op: ops run at once; None: the cores this process may use (`cpu_cores`).
        device: where the model trains, a notebook's ``DEVICE``: ``"cpu"`` sets the threads;
            ``"gpu"`` leaves TensorFlow's default (the step's ops are the GPU's, and the host's
            threads serve the input pipeline); ``"auto"``, the GPU when TensorFlow sees one.

    Returns:
        ``{"intra_op": ..., "inter_op": ...}`` as set, or None where the model trains on a GPU.

    Raises:
        ValueError: a bad argument, before anything is set.
        RuntimeError: TensorFlow has started with other threads (nothing is changed).

    Example (first thing in a script or notebook):
        >>> import sok_tutorial as sok
        >>> sok.cpu_threads()  # doctest: +SKIP
        {'intra_op': 1, 'inter_op': 2}
    """
    intra_op = checks.positive_int("intra_op", intra_op)
    inter_op = cpu_cores() if inter_op is None else checks.positive_int("inter_op", inter_op)
    choice = _device_choice(device)
    if choice == "gpu" or (choice == "auto" and tf.config.list_physical_devices("GPU")):
        return None
    threading = tf.config.threading
    try:  # (both raise alike once TensorFlow runs, so the first one refusing leaves both as they were)
        threading.set_intra_op_parallelism_threads(intra_op)
        threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError as exc:
        now = (threading.get_intra_op_parallelism_threads(), threading.get_inter_op_parallelism_threads())
        raise RuntimeError(f"cpu_threads(intra_op={intra_op}, inter_op={inter_op}): TensorFlow already runs with "
                           f"intra_op={now[0]}, inter_op={now[1]} (0: its default); call cpu_threads() before any "
                           "TensorFlow op") from exc
    return {"intra_op": intra_op, "inter_op": inter_op}


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


MPI_PORT_BASE = 23456  # worker r of an mpirun launch listens on localhost:MPI_PORT_BASE + r


def cluster_from_environment() -> dict[str, Any] | None:
    """The ``TF_CONFIG`` of this process: from the variable, or built for a local ``mpirun``
    launch from ``OMPI_COMM_WORLD_RANK/SIZE`` (ports ``SOK_TUTORIAL_PORT_BASE + rank``)."""
    if os.environ.get("TF_CONFIG"):
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            workers, index = list(config["cluster"]["worker"]), int(config["task"]["index"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"TF_CONFIG={os.environ['TF_CONFIG']!r} is not a valid cluster spec: expected "
                             '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", '
                             '"index": i}}') from exc
        if not 0 <= index < len(workers):
            raise ValueError(f"TF_CONFIG task index {index} is outside the {len(workers)} workers")
        return config
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        size, rank = int(os.environ["OMPI_COMM_WORLD_SIZE"]), int(os.environ["OMPI_COMM_WORLD_RANK"])
        base = int(os.environ.get("SOK_TUTORIAL_PORT_BASE", MPI_PORT_BASE))
        config = {"cluster": {"worker": [f"localhost:{base + r}" for r in range(size)]},
                  "task": {"type": "worker", "index": rank}}
        os.environ["TF_CONFIG"] = json.dumps(config)
        return config
    return None


def wait_for_workers(workers: list[str], me: int, timeout: float = 60.0) -> None:
    """Rendezvous before TensorFlow connects: listen on this worker's address and wait until every
    other worker accepts TCP connections on its own; a clear error after `timeout` s.

    (TensorFlow's multi-worker strategy blocks, holding Python's GIL, while a peer is missing;
    checking first turns a hang into an error naming the worker.)
    """
    host, _, port = workers[me].rpartition(":")
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("" if host in ("localhost", "0.0.0.0") else host, int(port)))
        listener.listen(len(workers))
    except OSError as exc:
        listener.close()
        raise OSError(f"worker {me} cannot listen on {workers[me]} ({exc}); is the port in use?") from None
    deadline = time.monotonic() + timeout
    try:
        for index, address in enumerate(workers):
            if index == me:
                continue
            peer_host, _, peer_port = address.rpartition(":")
            while True:
                try:
                    socket.create_connection((peer_host, int(peer_port)), timeout=2).close()
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise ConnectionError(f"worker {index} at {address} is unreachable after {timeout:.0f} s "
                                              f"({exc}); check TF_CONFIG and that every worker was started") from None
                    time.sleep(0.2)
        time.sleep(0.5)  # let slower peers finish their own checks against this listener
    finally:
        listener.close()


_SAME = object()


def make_strategy(num_replicas: int = 1, *, timeout: float = 60.0, collective_timeout: Any = _SAME) -> Any:
    """The strategy for this process: multi-worker when launched as a cluster, else mirrored
    over `num_replicas` local devices (`replica_devices`).

    Args:
        num_replicas: local replicas when not in a cluster.
        timeout: seconds to wait for peers at start, and (unless `collective_timeout` says
            otherwise) for any collective to complete: a dead peer then raises
            ``DeadlineExceeded`` in the survivors instead of hanging.
        collective_timeout: seconds for a collective, or None for no limit. TensorFlow keeps a
            thread for each collective until its timeout passes, even once it is done, so a long
            run of many short steps can hold thousands of threads (about 10 a step here with
            60 s); a run under `sok_tutorial.launch`, which stops every worker when one fails,
            can go without.
    """
    config = cluster_from_environment()
    if config is None:
        return tf.distribute.MirroredStrategy(replica_devices(num_replicas))
    wait_for_workers(list(config["cluster"]["worker"]), int(config["task"]["index"]), timeout)
    limit = timeout if collective_timeout is _SAME else collective_timeout
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=limit)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
